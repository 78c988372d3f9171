"""CACHE — the prompt cache: reporting, hits, isolation, equality, and the reset matrix across swaps."""

import pytest

from pytest_rlrollout.suite.observe import unique_prompt
from pytest_rlrollout.suite.outcomes import inconclusive

clause = pytest.mark.rl_clause


def ask(rl_deployment, prompt, headers=None, **body):  # max_tokens=2 unless given
    payload = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "perf_metrics_in_response": True, **body}
    return rl_deployment.complete(payload, headers=headers or {})


def cached(stream) -> int:
    return stream.cached_tokens()["usage"] or 0


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
    if not cached(second) > 0:
        same_replica(first, second)
    assert cached(second) > 0


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
    if not cached(warm) > 0:
        inconclusive("the second request was not served from the prompt cache (see CACHE-HIT-1)")
    assert [e["token_id"] for e in cold.entries] == [e["token_id"] for e in warm.entries]
    worst = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(cold.entries, warm.entries, strict=True))
    assert worst <= 1e-4, f"logprobs differ by {worst:.2e} on a cache hit"


# --------------------------------------------------------------------------- the reset matrix (needs swaps)

# cell: (reset_prompt_cache sent with the swap, whose request follows it, whether it must reuse)
MATRIX = {
    "CACHE-MATRIX-ALL-SAME": ("all", "same", False),
    "CACHE-MATRIX-ALL-NEW": ("all", "new", False),
    "CACHE-MATRIX-NS-SAME": ("new_session", "same", True),
    "CACHE-MATRIX-NS-NEW": ("new_session", "new", False),
    "CACHE-MATRIX-NONE-SAME": ("none", "same", True),
    "CACHE-MATRIX-NONE-NEW": ("none", "new", True),
}
CELLS = [pytest.param(cell, policy, who, reuse, marks=clause(cell), id=cell)
         for cell, (policy, who, reuse) in MATRIX.items()]  # fmt: skip
# `all` is also the default: the same cell with the field left out
CELLS.append(pytest.param("CACHE-MATRIX-ALL-SAME", None, "same", False, marks=clause("CACHE-MATRIX-ALL-SAME"),
                          id="CACHE-MATRIX-ALL-SAME-omitted"))  # fmt: skip


def session_on(rl_deployment, host, name):
    """Headers of a session nobody used yet that lands on replica `host`."""
    if rl_deployment.capabilities["replicas"] == 1:
        return {"x-multi-turn-session-id": f"{name}-fresh"}
    if host is None:
        inconclusive("several replicas and no fireworks-backend-host header: a new session may land anywhere")
    for i in range(64):
        h = {"x-multi-turn-session-id": f"{name}-fresh-{i}"}
        if ask(rl_deployment, [1, 2, 3], h, max_tokens=1).headers.get("fireworks-backend-host") == host:
            return h
    inconclusive(f"no new session landed on {host} in 64 tries")


def primed(rl_deployment, name):
    """A prompt cached by its owner session: (prompt, owner headers, replica host)."""
    prompt = unique_prompt(name)
    owner = {"x-multi-turn-session-id": f"{name}-owner"}
    ask(rl_deployment, prompt, owner)
    second = ask(rl_deployment, prompt, owner)
    if cached(second) == 0:
        inconclusive("the prefix was not served from the cache before the swap (see CACHE-HIT-1)")
    return prompt, owner, second.headers.get("fireworks-backend-host")


@pytest.mark.rl_swaps
@pytest.mark.parametrize(("cell", "policy", "who", "reuse"), CELLS)
def test_reset_matrix(rl_deployment, rl_swap, request, cell, policy, who, reuse):
    name = f"{request.node.name}-{rl_deployment.serving()}"
    prompt, owner, host = primed(rl_deployment, name)
    headers = owner if who == "same" else session_on(rl_deployment, host, name)
    rl_swap("matrix", **({} if policy is None else {"reset_prompt_cache": policy}))
    after = ask(rl_deployment, prompt, headers)
    landed = after.headers.get("fireworks-backend-host")
    if host is not None and landed is not None and landed != host:
        inconclusive(f"the request after the swap reached {landed}, the cache is on {host} (see SESS-1)")
    n = cached(after)
    wanted = "reuse (cached > 0)" if reuse else "recompute (cached = 0)"
    assert (n > 0) == reuse, f"reset_prompt_cache={policy!r}, {who} session: cached_tokens {n}; must {wanted}"


@pytest.mark.rl_swaps
@clause("CACHE-NOSESSION-1")
def test_no_session_is_a_new_session(rl_deployment, rl_swap, request):
    prompt = unique_prompt(f"{request.node.name}-{rl_deployment.serving()}")
    host, hit = None, False
    for _ in range(8):  # requests without a session may go anywhere: repeat until one hits the cache
        s = ask(rl_deployment, prompt)
        if cached(s) > 0:
            host, hit = s.headers.get("fireworks-backend-host"), True
            break
    if not hit:
        inconclusive("repeated requests without a session were never served from the cache")
    if host is None and rl_deployment.capabilities["replicas"] > 1:
        inconclusive("several replicas and no fireworks-backend-host header")
    rl_swap("nosession", reset_prompt_cache="new_session")
    for _ in range(16):  # the first request without a session that reaches the replica holding the prefix
        after = ask(rl_deployment, prompt)
        if host is None or after.headers.get("fireworks-backend-host") == host:
            assert cached(after) == 0, (
                f"a request without a session reused {cached(after)} tokens cached before the swap"
            )
            return
    inconclusive(f"no request without a session reached {host}")
