"""SESS — session affinity (observed through the fireworks-backend-host header)."""

import pytest

from pytest_rlrollout.suite.outcomes import inconclusive

clause = pytest.mark.rl_clause


def ask(rl_deployment, prompt, headers):
    return rl_deployment.complete({"prompt": prompt, "max_tokens": 1, "temperature": 0}, headers=headers)


def hosts(rl_deployment, header_sets):
    seen = set()
    for h in header_sets:
        host = ask(rl_deployment, [1, 2, 3], h).headers.get("fireworks-backend-host")
        if host is None:
            inconclusive("the deployment does not report fireworks-backend-host")
        seen.add(host)
    return seen


@clause("SESS-1")
def test_same_session_same_replica(rl_deployment):
    for s in range(3):
        assert len(hosts(rl_deployment, [{"x-multi-turn-session-id": f"sess-1-{s}"}] * 5)) == 1


@clause("SESS-2")
def test_session_id_beats_affinity(rl_deployment):
    for s in range(3):
        sets = [{"x-multi-turn-session-id": f"sess-2-{s}", "x-session-affinity": f"other-{i}"} for i in range(6)]
        assert len(hosts(rl_deployment, sets)) == 1


@clause("SESS-3")
def test_affinity_alone_is_sticky(rl_deployment):
    for s in range(3):
        assert len(hosts(rl_deployment, [{"x-session-affinity": f"sess-3-{s}"}] * 5)) == 1
