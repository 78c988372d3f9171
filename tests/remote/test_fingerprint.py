"""Fingerprints: the canary set is fixed, distances find the worst token, and a sweep reaches
every replica of the reference deployment through session keys."""

import math

import pytest

from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.fingerprint import Fingerprint, FingerprintError, canary, fingerprint, sweep
from pytest_rlrollout.remote.target import Target


def test_the_canary_set_is_fixed_and_in_the_vocabulary():
    assert canary(512) == canary(512) and len(canary(512)) == 4 and {len(s) for s in canary(512)} == {32}
    assert all(10 <= t < 100 for s in canary(100) for t in s)
    assert canary(512) != canary(100)


def test_distance_names_the_worst_token_and_refuses_what_does_not_line_up():
    a = Fingerprint(((-1.0, -2.0), (-3.0,)))
    b = Fingerprint(((-1.0, -2.5), (-3.1,)))
    assert a.farthest(b) == (0.5, 0, 2) and "canary 0, token 2" in a.describe(b)
    assert a.same(b, 0.5) and not a.same(b, 0.4)
    assert a.distance(Fingerprint(((-1.0,), (-3.0,)))) == math.inf
    assert a.distance(Fingerprint(((-1.0, math.nan), (-3.0,)))) == math.inf


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    with (
        reference_deployment(tmp_path_factory.mktemp("bucket"), replicas=3) as dep,
        DeploymentClient(Target(dep.name, dep.base_url, dep.model, dep.api_key)) as client,
    ):
        yield client


def test_a_sweep_reaches_every_replica_and_they_agree(deployment):
    client = deployment
    s = sweep(client, 3, "iso-a", key=lambda n: f"fp-session-{n}", vocab=512)
    assert sorted(s.prints) == ["replica-0", "replica-1", "replica-2"] and s.named
    first = next(iter(s.prints.values()))
    assert all(f.distance(first) <= 1e-5 for f in s.prints.values())
    assert s.requests == s.probes + 3 * 4 and s.tokens == s.probes + 3 * 4 * 32
    again = sweep(client, 3, "iso-b", key=lambda n: f"other-{n}", sessions=s.sessions, vocab=512)
    assert again.sessions == s.sessions and again.probes == 0  # the same session keys, no probing


def test_a_refused_canary_is_a_named_error(deployment):
    with pytest.raises(FingerprintError, match="canary 0: HTTP 400"):
        fingerprint(deployment, "iso-c", sequences=[[10, 10**7, 12]])
