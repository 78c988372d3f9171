"""The weight-sync check through every driver, against the bundled reference deployment in each
engine's dialect and as fleets of engines given by their URLs (smg's gateway: tests/fleet/
test_weight_sync.py): green on the start weights against the local scorer, exactly one scoring
request per replica per call once the replicas are known (counted where the check sends and where
the engines receive), nothing changed on the deployment, and a replica that kept the previous
weights named. Then the library's edges, on the wire where they come from. (`score_canary` on a
torch model: tests/interop/test_score_canary.py.)"""

from __future__ import annotations

import json
import math
from collections import Counter

import httpx
import pytest

from pytest_rlrollout.runs.weight_sync import ReplicaSync, SyncResult, WeightSync, WeightSyncError
from pytest_rlrollout.snapshot import tiny_moe

from .sync_support import Served, checked_three_times, next_snapshot, scored, served, stale_replica_named

# every driver the reference speaks, but smg's gateway (a process of its own: the slow tier)
ENGINES = ["fireworks", "vllm", "sglang", "coreweave", "fleet", "sglang-fleet"]


@pytest.mark.parametrize("engine", ENGINES)
def test_green_on_the_start_weights_one_scoring_request_per_replica_nothing_changed(bucket, engine):
    """Through each driver: the check is green on the start weights against the numpy scorer of the
    base, costs exactly one scoring request per replica per call once the replicas are known (at
    the transport and at the reference engines), and the deployment holds and says what it did
    before."""
    with served(engine, bucket) as s:
        checked_three_times(s)


# a fault that keeps the old weights on one replica while its label moves: (engine, faults, the
# replica it hits as the check names it (a fleet's: its engine's URL, by index))
STALE = [
    pytest.param("fireworks", ["FID-SWAP-1:one"], "replica-1", id="fireworks"),
    pytest.param("vllm", ["FID-SWAP-1"], "vllm", id="vllm"),  # one server: its one replica
    pytest.param("sglang", ["FID-SWAP-1"], "sglang", id="sglang"),
    pytest.param("fleet", {1: frozenset({"FID-SWAP-1"})}, 1, id="fleet"),
    pytest.param("sglang-fleet", {1: frozenset({"FID-SWAP-1"})}, 1, id="sglang-fleet"),
]


@pytest.mark.parametrize(("engine", "faults", "faulty"), STALE)
def test_a_replica_that_kept_the_previous_weights_is_named_stale(bucket, engine, faults, faulty):
    """FID-SWAP-1 on one replica (a fleet: one engine; one server: its only one), then a swap: the
    check names that replica stale, by its numbers, though its label says the new snapshot."""
    with served(engine, bucket, faults=faults) as s:
        stale_replica_named(s, faulty)


def test_coreweave_names_no_replica_so_each_row_is_a_session_key(bucket):
    """CoreWeave's gateway names no replica on its answers and says no policy version: with two
    replicas, one keeping its old weights after a hot-load, the check's rows are session keys (it
    says so), unlabelled, and a row is out of sync exactly when the gateway routed its key to the
    faulty replica (the reference routes a session by its key): one the keys all missed is not seen."""
    with served("coreweave", bucket, faults=["FID-SWAP-1:one"]) as s, s.sync() as sync, s.trainer() as trainer:
        new = next_snapshot(s.bucket)
        assert trainer.load({"identity": new.name, "reset_prompt_cache": "all"}).status_code == 200
        assert trainer.wait(new.name, timeout=60, poll=0.02).ok
        result = sync.check(scored(new, sync), label=new.name)
        dep = s.engines[0].deployment
        routed = {row: dep.route(key, None).name for row, key in sync.sessions.items()}
    said = "\n".join(result.lines())
    assert not result.named and len(result.replicas) == 2, said
    assert all(r.replica.startswith("session rlrollout-sync-") and r.label is None for r in result.replicas), said
    assert "the deployment names no replica on its answers: 2 session key(s) stood for its replicas" in said
    assert {r.replica: not r.in_sync for r in result.replicas} == {
        row: replica == "replica-1" for row, replica in routed.items()
    }, (said, routed)


# ---------------------------------------------------------------------------- the library's edges


class Tampering(httpx.BaseTransport):
    """Forwards every request; the scoring answers of `replica` are replaced by what `change` makes
    of them (status, JSON body)."""

    def __init__(self, replica: str, change):
        from pytest_rlrollout.remote.transport import bounded_transport

        self.inner, self.replica, self.change = bounded_transport(), replica, change

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self.inner.handle_request(request)
        scoring = request.url.path.endswith("/completions") and json.loads(request.read()).get("echo")
        if not scoring or r.headers.get("fireworks-backend-host") != self.replica:
            return r
        status, body = self.change(json.loads(r.read()))
        headers = {"fireworks-backend-host": self.replica, "content-type": "application/json"}
        return httpx.Response(status, headers=headers, content=json.dumps(body).encode())  # a NaN as NaN


@pytest.fixture(scope="module")
def fireworks(tmp_path_factory):
    """The reference deployment (Fireworks' dialect, two replicas)."""
    bucket = tmp_path_factory.mktemp("bucket")
    with served("fireworks", bucket) as s:
        yield s


def tampered(s: Served, replica: str, change) -> WeightSync:
    return WeightSync.connect(**s.connect, transport=Tampering(replica, change))


def test_the_trainers_numbers_must_line_up_with_the_canary(fireworks):
    """Numbers of the wrong length are refused before anything is sent, saying how many were
    given and wanted; a leading NaN (a scorer's value for the first token) is dropped."""
    with fireworks.sync() as sync:
        expected = scored(fireworks.base, sync)
        fireworks.counted.take()
        with pytest.raises(WeightSyncError, match=r"126 logprobs for a canary of 128 tokens \(want 127"):
            sync.check(expected[:-1])
        with pytest.raises(WeightSyncError, match=r"128 logprobs for a canary of 128 tokens"):
            sync.check([*expected, -1.0])
        assert fireworks.counted.take() == []
        plain, leading = sync.check(expected), sync.check([math.nan, *expected])
    assert plain.ok and leading.ok
    assert [r.served for r in plain.replicas] == [r.served for r in leading.replicas]
    assert [r.max_abs for r in plain.replicas] == [r.max_abs for r in leading.replicas]


def test_a_nan_the_replica_serves_is_out_of_sync_at_its_token(fireworks):
    """A NaN among a replica's logprobs is an infinite gap at that token: out of sync, never a
    comparison that quietly passes."""

    def nan_at_token_9(body):
        body["choices"][0]["logprobs"]["content"][9]["logprob"] = math.nan
        return 200, body

    with tampered(fireworks, "replica-1", nan_at_token_9) as sync:
        result = sync.check(scored(fireworks.base, sync))
    bad = {r.replica: r for r in result.replicas}["replica-1"]
    assert not result.ok and result.out_of_sync == [bad], result.lines()
    assert (
        bad.max_abs == math.inf and bad.mean_abs == math.inf and bad.worst_token == 9 and bad.verdict == "out of sync"
    )


def test_a_replica_answering_other_than_200_is_an_error_naming_it(fireworks):
    """A replica that refuses the canary fails the check with WeightSyncError naming the replica and
    what it answered (no verdict is made of the others alone)."""
    with (
        tampered(fireworks, "replica-1", lambda body: (503, {"error": "overloaded"})) as sync,
        pytest.raises(WeightSyncError, match=r"^replica-1: the canary was answered HTTP 503: .*overloaded"),
    ):
        sync.check(scored(fireworks.base, sync))


def test_metrics_are_a_flat_dict_of_floats_whose_keys_stay_the_same(fireworks):
    """What a metrics logger gets: every value a float, the same keys at every step and whatever
    the verdicts (an out-of-sync step too)."""
    with fireworks.sync() as sync:
        expected = scored(fireworks.base, sync)
        first, second = sync.check(expected).metrics(), sync.check([x + 0.5 for x in expected]).metrics()
        named = sync.check(expected).metrics("sync")
    keys = {
        *(f"weight_sync/{k}" for k in ("max_abs_dlogprob", "mean_abs_dlogprob", "replicas")),
        *(f"weight_sync/{k}" for k in ("replicas_out_of_sync", "tolerance", "seconds")),
        *(f"weight_sync/replica{i}/{k}" for i in (0, 1) for k in ("max_abs_dlogprob", "mean_abs_dlogprob", "in_sync")),
    }
    assert set(first) == set(second) == keys
    assert all(type(v) is float for m in (first, second) for v in m.values())
    assert first["weight_sync/replicas_out_of_sync"] == 0.0 and second["weight_sync/replicas_out_of_sync"] == 2.0
    assert second["weight_sync/replica1/in_sync"] == 0.0 and abs(second["weight_sync/max_abs_dlogprob"] - 0.5) < 1e-3
    assert set(named) == {k.replace("weight_sync/", "sync/") for k in keys}


def row(max_abs: float, previous: float | None, label: str | None = "step-1") -> ReplicaSync:
    return ReplicaSync("replica-0", label, max_abs, max_abs / 2, 3, 1e-3, previous)


def test_stale_means_out_of_sync_and_closer_to_the_previous_checks_numbers():
    """`stale`: out of sync, and nearer the numbers the trainer gave one check ago than these; out of
    sync and nearer these (or with no previous check) is 'out of sync'; in sync is never stale."""
    assert row(0.5, 1e-6).stale and row(0.5, 1e-6).verdict == "stale: serves the previous weights"
    assert not row(0.5, 0.7).stale and row(0.5, 0.7).verdict == "out of sync"
    assert not row(0.5, None).stale and row(0.5, None).verdict == "out of sync"
    assert not row(1e-6, 0.0).stale and row(1e-6, 0.0).verdict == "in sync"


def test_a_label_other_than_the_trainers_is_said_on_a_line_of_its_own(fireworks):
    """The trainer says which label it expects: a replica saying another gets a `label:` line (its
    numbers still decide its verdict); replicas saying the expected one get none."""
    with fireworks.sync() as sync:
        expected = scored(fireworks.base, sync)
        other, same = sync.check(expected, label="step-7"), sync.check(expected, label=tiny_moe.BASE_IDENTITY)
    assert other.ok and [r.replica for r in other.mislabelled()] == ["replica-0", "replica-1"]
    lines = [x for x in other.lines() if x.startswith("  label: ")]
    assert lines == [
        f"  label: replica-{i} says {tiny_moe.BASE_IDENTITY!r}, the trainer expects 'step-7'" for i in (0, 1)
    ]
    assert not same.mislabelled() and not [x for x in same.lines() if "label: " in x]
    made = SyncResult((row(0.5, None, "step-3"), row(0.0, None, None)), 4, "step-4", "float32", 1e-3, 2, 0, 0.1)
    assert made.mislabelled() == [made.replicas[0]]  # a replica saying no label is not mislabelled


def test_the_version_route_is_sought_once(bucket):
    """vLLM's driver, made without the preflight, finds its generate route (whose answers say the
    policy version) with one request on the first call, and never asks again."""
    with served("vllm", bucket) as s, s.sync() as sync:
        s.counted.take()
        assert sync.driver.find_version_route() == 1
        first = s.counted.take()
        assert sync.driver.find_version_route() == 0 and s.counted.take() == []
    assert [(c.method, c.path) for c in first] == [("POST", "/inference/v1/generate")]
    assert Counter(c.status for c in first) == {200: 1}


def test_a_replica_no_session_key_reaches_is_an_error_not_a_row_left_out(fireworks):
    """Told of more replicas than session keys reach (three, of the reference's two), the check
    refuses to judge fewer, naming those it reached and how many keys it tried."""
    with fireworks.sync(replicas=3) as sync, pytest.raises(WeightSyncError) as refused:
        sync.check(scored(fireworks.base, sync))
    assert str(refused.value).startswith("2 of 3 replicas answered 24 session keys (replica-0, replica-1)")
