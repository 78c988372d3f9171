"""CACHE (clauses that need no swap) and SESS — session affinity."""

import pytest
from helpers import unique_prompt

from pytest_rlrollout.report import inconclusive

clause = pytest.mark.rl_clause


def ask(rl_deployment, prompt, headers=None, **body):
    payload = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "perf_metrics_in_response": True, **body}
    return rl_deployment.complete(payload, headers=headers or {})


@clause("CACHE-RPT-1")
def test_cached_tokens_reported_consistently(rl_deployment, request):
    prompt = unique_prompt(request.node.name)
    h = {"x-multi-turn-session-id": request.node.name}
    for s in (ask(rl_deployment, prompt, h), ask(rl_deployment, prompt, h), ask(rl_deployment, prompt, h, stream=True)):
        channels = {k: v for k, v in s.cached_tokens().items() if v is not None}
        assert channels, "no channel reports cached tokens"
        assert len(set(channels.values())) == 1, f"channels disagree: {channels}"
        cached, prompt_tokens = next(iter(channels.values())), s.usage["prompt_tokens"]
        assert 0 <= cached <= prompt_tokens == len(prompt), (cached, prompt_tokens)


def same_replica(first, second) -> None:
    """Cache clauses presume session affinity; when it visibly failed, they cannot be judged."""
    a, b = first.headers.get("fireworks-backend-host"), second.headers.get("fireworks-backend-host")
    if a is not None and b is not None and a != b:
        inconclusive(f"the session's two requests reached different replicas ({a}, {b}; see SESS-1)")


@clause("CACHE-HIT-1")
def test_same_session_reuses_a_long_prefix(rl_deployment, request):
    prompt = unique_prompt(request.node.name)
    h = {"x-multi-turn-session-id": request.node.name}
    first = ask(rl_deployment, prompt, h)
    second = ask(rl_deployment, prompt, h)
    if not (second.cached_tokens()["usage"] or 0) > 0:
        same_replica(first, second)
    assert (second.cached_tokens()["usage"] or 0) > 0


@clause("CACHE-ISO-1")
def test_isolation_keys_never_share(rl_deployment, request):
    prompt = unique_prompt(request.node.name)
    h = {"x-multi-turn-session-id": request.node.name}
    ask(rl_deployment, prompt, h | {"x-prompt-cache-isolation-key": "a"})
    assert ask(rl_deployment, prompt, h | {"x-prompt-cache-isolation-key": "b"}).cached_tokens()["usage"] == 0
    assert ask(rl_deployment, prompt, h, prompt_cache_isolation_key="c").cached_tokens()["usage"] == 0


@clause("CACHE-EQ-1")
def test_cache_hits_do_not_change_results(rl_deployment, request):
    prompt = unique_prompt(request.node.name)
    h = {"x-multi-turn-session-id": request.node.name}
    cold = ask(rl_deployment, prompt, h, max_tokens=8, logprobs=True)
    warm = ask(rl_deployment, prompt, h, max_tokens=8, logprobs=True)
    if not (warm.cached_tokens()["usage"] or 0) > 0:
        inconclusive("the second request was not served from the prompt cache (see CACHE-HIT-1)")
    assert [e["token_id"] for e in cold.entries] == [e["token_id"] for e in warm.entries]
    worst = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(cold.entries, warm.entries, strict=True))
    assert worst <= 1e-4, f"logprobs differ by {worst:.2e} on a cache hit"


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
