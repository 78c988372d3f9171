"""SESS — session affinity, observed through the fireworks-backend-host header (which replica
answered). With one replica every request lands on it: nothing to observe."""

import pytest

from pytest_rlrollout.suite.marks import clause, requires
from pytest_rlrollout.suite.outcomes import inconclusive

SESSIONS, REQUESTS = 3, 5


@pytest.fixture
def hosts(rl_deployment, rl_observe):
    """`hosts(header_sets)`: the replicas that answered one request per header set."""
    if rl_deployment.capabilities.replicas == 1:
        inconclusive("the deployment has one replica: every request lands on it, so affinity cannot be observed")
    prompt = rl_deployment.prompt("sess", 3).body

    def answer(header_sets):
        seen = set()
        for h in header_sets:
            s = rl_deployment.complete({"prompt": prompt, "max_tokens": 1}, headers=h).expect_ok()
            host = s.headers.get("fireworks-backend-host")
            if host is None:
                inconclusive("an answer does not name its replica (no fireworks-backend-host header)")
            seen.add(host)
        rl_observe(len(header_sets), "answers naming their replica")
        return seen

    return answer


@clause("SESS-1")
@requires("backend_host")
def test_same_session_same_replica(rl_deployment, hosts):
    """Requests with the same x-multi-turn-session-id land on the same replica."""
    for s in range(SESSIONS):
        seen = hosts([rl_deployment.session(f"sess-1-{s}")] * REQUESTS)
        assert len(seen) == 1, f"session {s}: {REQUESTS} requests reached replicas {sorted(seen)}"


@clause("SESS-2")
@requires("backend_host")
def test_session_id_beats_affinity(rl_deployment, hosts):
    """When both headers are present, x-multi-turn-session-id decides the replica, not x-session-affinity."""
    for s in range(SESSIONS):
        sets = [
            rl_deployment.session(f"sess-2-{s}", **{"x-session-affinity": rl_deployment.salted(f"other-{i}")})
            for i in range(REQUESTS)
        ]
        seen = hosts(sets)
        assert len(seen) == 1, f"session {s} with {REQUESTS} affinities reached replicas {sorted(seen)}"


@clause("SESS-3")
@requires("backend_host")
def test_affinity_alone_is_sticky(rl_deployment, hosts):
    """x-session-affinity alone gives the same stickiness."""
    for s in range(SESSIONS):
        seen = hosts([{"x-session-affinity": rl_deployment.salted(f"sess-3-{s}")}] * REQUESTS)
        assert len(seen) == 1, f"affinity {s}: {REQUESTS} requests reached replicas {sorted(seen)}"
