"""One test's hold on the deployment, the autouse `rl_test` fixture: what the test requires (else
it is not run and says why), its cassette when recording or replaying, the lock that keeps
read-only tests out of swaps, then its exchanges and its deadline.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from pytest_rlrollout.suite.deployment import RLDeployment
from pytest_rlrollout.suite.outcomes import inconclusive, not_applicable, unsupported
from pytest_rlrollout.suite.stash import MISSING, RL_TEST

if TYPE_CHECKING:
    from pytest_rlrollout.remote.cassette import Cassette
    from pytest_rlrollout.remote.stream import Exchange


def _requirements(request: pytest.FixtureRequest, dep: RLDeployment) -> None:
    """What the test needs of the deployment: a clause of its engine, state changes allowed
    (`rl_swaps`), capabilities (`rl_requires`). The suite, not the test, decides the outcome of
    what is missing (see contract/capabilities.py)."""
    from pytest_rlrollout.contract import catalogue

    clauses = [catalogue()[c] for mark in request.node.iter_markers("rl_clause") for c in mark.args]
    unbound = [c for c in clauses if not c.binds(dep.engine)]
    if unbound:  # the test's verdict is every clause's it is tagged with: each must mean something here
        bound = sorted({e for c in unbound for e in c.engines})
        not_applicable(
            f"{', '.join(c.id for c in unbound)}: no {dep.engine} binding (bound on {', '.join(bound)}); "
            f"the deployment's engine is {dep.engine} ({dep.capabilities.decided})"
        )
    if request.node.get_closest_marker("rl_swaps") is not None and not dep.allow_hot_load:
        inconclusive("read-only: pass --rl-allow-hot-load to let this test hot-load snapshots")
    must = any(c.level == "MUST" for c in clauses)
    for mark in request.node.iter_markers("rl_requires"):
        for capability in mark.args:
            _require(request.node, dep, capability, must=must)


def fail_in_call(item: pytest.Item, message: str) -> None:
    """Fail the test when it runs, with `message`: a finding made while setting it up (a
    capability the deployment must offer is missing) is the deployment's fault, not an error."""
    item.stash[MISSING] = message


def _require(item: pytest.Item, dep: RLDeployment, capability: str, *, must: bool) -> None:
    """A capability the test needs, or `transition:ASYNC|SYNC`."""
    from pytest_rlrollout.contract.capabilities import CAPABILITIES

    found = dep.capabilities
    if capability.startswith("transition:"):
        wanted = capability.split(":", 1)[1]
        if found.transition is None:
            inconclusive(
                "the transition type is unknown: the deployment resource does not say; set rl_transition (-o rl_transition=ASYNC|SYNC)"
            )
        if found.transition != wanted:
            not_applicable(f"the deployment uses {found.transition} transitions, this clause is about {wanted}")
        return
    if capability not in CAPABILITIES:
        raise pytest.UsageError(f"rl_requires: unknown capability {capability!r} (known: {', '.join(CAPABILITIES)})")
    if found.has(capability):
        return
    cap = CAPABILITIES[capability]
    seen = found.seen.get(capability, cap.probe)
    if cap.observable:
        inconclusive(f"cannot observe this: the deployment does not offer {capability}, {cap.about} ({seen})")
    if must and cap.required(dep.engine):
        fail_in_call(
            item,
            f"the deployment lacks {capability} ({cap.about}; probe: {seen}), which a {dep.engine} "
            "deployment must offer",
        )
    elif (flag := cap.flag(dep.engine)) is not None:
        unsupported(
            f"the deployment does not offer {capability}: {cap.about} (probe: {seen}); {dep.engine} "
            f"offers it with {flag}"
        )
    else:
        unsupported(f"the deployment does not offer {capability}: {cap.about} (probe: {seen})")


@dataclass
class RLTest:
    """One test's hold on the deployment (the `rl_test` fixture): its deadline, its exchanges
    (newest last: the evidence of a failure), its cassette when recording or replaying, and
    whether it holds the deployment alone (an `rl_swaps` test) or shares it."""

    deadline: float
    exchanges: collections.deque[Exchange]
    cassette: Cassette | None
    exclusive: bool


@pytest.fixture(autouse=True)
def rl_test(request: pytest.FixtureRequest) -> Iterator[RLTest | None]:
    """Every test of the deployment, in this order: what it requires (else it is not run and
    says why), its cassette, the lock (exclusive for `rl_swaps` tests, shared for the others,
    across processes; a swap test leaves the deployment at rest for the next), then its own
    exchanges and its deadline: everything it asks ends by `rl_test_timeout` after it got the
    lock, so a deployment that keeps a stream going fails that test naming the bound instead of
    holding the run. None for a test that does not use the deployment."""
    if "rl_deployment" not in request.fixturenames:
        yield None
        return
    from pytest_rlrollout.suite import planning

    dep: RLDeployment = request.getfixturevalue("rl_deployment")
    exclusive = request.node.get_closest_marker("rl_swaps") is not None
    try:
        _requirements(request, dep)
    except pytest.skip.Exception as e:
        if exclusive and dep.options.budget.plan is not None:  # the plan says why it leaves the test out
            planning.book(request.config).left_out.append((request.node.nodeid, str(e.msg)))
        raise
    breaks = request.node.get_closest_marker("rl_breaks") is not None
    with _cassette(request, dep) as cassette, _locked(dep, exclusive=exclusive, breaks=breaks):
        if exclusive:  # the profile, the plan and the budget, from where the run is now
            planning.plan_or_leave_out(request, dep)
        if breaks and dep.mode == "live" and dep.cassettes is None:
            _serving_before_it_breaks(dep)
        deadline = time.monotonic() + dep.timeouts.test
        try:
            with dep.client.scoped(deadline) as exchanges:
                test = request.node.stash[RL_TEST] = RLTest(deadline, exchanges, cassette, exclusive)
                yield test
        finally:
            if exclusive:
                planning.spend(request, dep)


def _serving_before_it_breaks(dep: RLDeployment) -> None:
    """A test that may break the deployment judges its clause only on one that serves when it
    starts: once an earlier such test left it unable to serve (a refused load kills vLLM's
    engine), what this one would see is that test's doing, not its own. Inconclusive then,
    saying so. (Live runs only: a recording holds no such probe, and the local deployment is
    never left unable to serve.)"""
    import httpx

    from pytest_rlrollout.remote.limits import LimitExceeded

    try:
        s = dep.complete({"prompt": dep.prompt("serving-before-it-breaks", 4).body, "max_tokens": 1})
        why = None if s.ok else f"HTTP {s.status} {s.body[:200]!r}"
    except (httpx.TransportError, LimitExceeded) as e:
        why = str(e)
    if why is not None:
        inconclusive(
            f"the deployment did not serve a one-token completion before this test ({why}): an earlier "
            "test that may break it (rl_breaks) left it unable to serve; judge this one on a deployment "
            "of its own (-k)"
        )


@contextlib.contextmanager
def _locked(dep: RLDeployment, *, exclusive: bool, breaks: bool = False) -> Iterator[None]:
    """The deployment's lock for one test; after an exclusive one, the deployment at rest. A test
    that `breaks` it may leave nothing that answers (vLLM's API server exits once its engine
    died): its verdict stands, and there is nothing to settle."""
    import httpx

    from pytest_rlrollout.remote.limits import LimitExceeded
    from pytest_rlrollout.remote.lock import DeploymentLock

    lock = DeploymentLock(dep.key)
    with lock.exclusive() if exclusive else lock.shared():
        yield
        if exclusive:
            try:
                dep.settle()  # in the test's cassette: a replay answers it as the recording did
            except (httpx.TransportError, LimitExceeded):
                if not breaks:
                    raise


@contextlib.contextmanager
def _cassette(request: pytest.FixtureRequest, dep: RLDeployment) -> Iterator[Cassette | None]:
    """This test's cassette when recording or replaying (None otherwise)."""
    t = dep.cassettes
    if t is None:
        yield None
        return
    from pytest_rlrollout.remote.cassette import Cassette, cassette_name
    from pytest_rlrollout.remote.cassette_file import CassetteError

    path = t.directory / cassette_name(request.node.nodeid)
    if t.mode == "replay":
        if not path.exists() and not path.is_symlink():
            inconclusive(f"no cassette for this test in {t.directory} (record it with --rl-record)")
        try:  # read as the transport reads it: confined to the cassette directory
            cassette = t.load(cassette_name(request.node.nodeid))
        except CassetteError as e:  # the recording is broken, not the deployment: an error naming it
            pytest.fail(f"cassette {e}", pytrace=False)
    else:
        cassette = Cassette(path)
    keep = t.mode == "record" and not (t.record_mode == "once" and path.is_file())
    t.use(cassette)
    try:
        yield cassette
    finally:
        t.use(t.session)
        if keep:
            cassette.meta["test"] = request.node.nodeid
            cassette.write(dep.target.api_key)
