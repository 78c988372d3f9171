"""CACHE — the prompt cache: reporting, hits, isolation, equality, and the reset matrix across swaps.

Every prompt, session and isolation key is salted per run (`RLDeployment.salted`): a long-lived
deployment's cache holds nothing of an earlier run's."""

import pytest

from pytest_rlrollout.engines import spec
from pytest_rlrollout.runs.plan import shared
from pytest_rlrollout.suite.marks import clause, loads_from, requires
from pytest_rlrollout.suite.outcomes import inconclusive, unsupported
from pytest_rlrollout.suite.testing import CACHED_PREFIX, completed, part, share_for, shares

LONG = CACHED_PREFIX  # prompt tokens: several cache blocks on any deployment


def ask(rl_deployment, prompt, headers=None, **body):  # max_tokens=2 unless given
    return rl_deployment.complete({"prompt": prompt, "max_tokens": 2, **body}, headers=headers or {}).expect_ok()


def cached(stream) -> int:
    return stream.cached or 0


def reported(s, what: str) -> tuple[int, str]:
    """The cached tokens an answer reports, every channel that says agreeing; and the channels."""
    channels = {k: v for k, v in s.cached_tokens().items() if v is not None}
    assert channels, f"{what} reports no cached tokens on any channel"
    assert len(set(channels.values())) == 1, f"{what}: the channels disagree: {channels}"
    return next(iter(channels.values())), ", ".join(channels)


def judged_report(s, what: str, prompt, rl_observe, prompt_tokens: int | None = None) -> int:
    """CACHE-RPT-1 on one answer: the cached count within usage.prompt_tokens, which counts every
    token sent (`prompt_tokens`: the count a stream without usage is held to)."""
    n, on = reported(s, what)
    if s.usage is not None or prompt_tokens is None:
        prompt_tokens = (s.usage or {}).get("prompt_tokens")
        assert isinstance(prompt_tokens, int), f"{what}: usage.prompt_tokens is {prompt_tokens!r}"
        if prompt.ids is not None:
            assert prompt_tokens == len(prompt.ids), (
                f"{what}: prompt_tokens {prompt_tokens} leaves out cached tokens ({len(prompt.ids)} were sent)"
            )
    assert 0 <= n <= prompt_tokens, f"{what}: {n} cached of {prompt_tokens} prompt tokens"
    rl_observe(1, f"{what} reporting {n} cached of {prompt_tokens} on {on}")
    return prompt_tokens


@clause("CACHE-RPT-1")
@requires("cached_tokens")
@pytest.mark.parametrize("how", ["non-streamed", "streamed"])
def test_cached_tokens_reported_consistently(rl_deployment, rl_observe, how):
    """Cached tokens are reported on every completion; where several channels carry them they agree; 0 <= cached <=
    prompt_tokens, and prompt_tokens includes the cached tokens."""
    # Cached tokens reported alike on every channel and within the prompt's count. A stream's
    # usage is an option (`stream_options.include_usage`): a stream that carries none when asked,
    # and no other channel either, does not offer the count (`unsupported`); a stream that carries
    # usage without the count fails.
    prompt = rl_deployment.prompt(f"cache-rpt-{how}", LONG)
    h = rl_deployment.session(f"cache-rpt-{how}")
    perf = {"perf_metrics_in_response": True} if rl_deployment.capabilities.has("perf_metrics") else {}
    counted = judged_report(ask(rl_deployment, prompt.body, h, **perf), "answer 0", prompt, rl_observe)
    if how == "non-streamed":
        judged_report(ask(rl_deployment, prompt.body, h, **perf), "answer 1", prompt, rl_observe)
        return
    s = ask(rl_deployment, prompt.body, h, stream=True, stream_options={"include_usage": True}, **perf)
    if s.usage is None and not any(v is not None for v in s.cached_tokens().values()):
        unsupported(
            "stream_options.include_usage: asked for, and the stream carried no usage and no other "
            "channel: no cached-token count on streams (non-streamed answers: the non-streamed test)"
        )
    judged_report(s, "the streamed answer", prompt, rl_observe, prompt_tokens=counted)


def same_replica(first, second) -> None:
    """Cache clauses presume session affinity; when it visibly failed, they cannot be judged."""
    a, b = first.headers.get("fireworks-backend-host"), second.headers.get("fireworks-backend-host")
    if a is not None and b is not None and a != b:
        inconclusive(f"the session's two requests reached different replicas ({a}, {b}; see SESS-1)")


def unplaced(rl_deployment, answer) -> bool:
    """Whether `answer` may have come from a replica other than its session's earlier requests:
    the engine routes a session to its cache by no binding, the deployment may have several
    replicas (0: it does not say) and the answer names none."""
    return (
        not spec(rl_deployment.engine).affinity
        and rl_deployment.capabilities.replicas != 1
        and answer.headers.get("fireworks-backend-host") is None
    )


@clause("CACHE-HIT-1")
@requires("cached_tokens")
def test_same_session_reuses_a_long_prefix(rl_deployment, rl_observe):
    """Without a swap, a second request of the same session repeating a prefix longer than the cache block gets cached
    tokens > 0."""
    prompt = rl_deployment.prompt("cache-hit", LONG).body
    h = rl_deployment.session("cache-hit")
    first = ask(rl_deployment, prompt, h)
    second = ask(rl_deployment, prompt, h)
    if not cached(second) > 0:
        same_replica(first, second)
    if not cached(second) > 0 and unplaced(rl_deployment, second):
        # the session header bought no affinity the suite can see: the repeat may have gone to
        # another replica, so repeat until one lands where the prefix is (as CACHE-NOSESSION-1
        # does). Past as many requests as replicas, one replica was asked twice (pigeonhole).
        replicas = rl_deployment.capabilities.replicas
        for _ in range(max(8, replicas)):
            if cached(again := ask(rl_deployment, prompt, h)) > 0:
                second = again
                break
        else:
            if not replicas:
                inconclusive(
                    "no repeat of the session's prefix was served from the cache, and they may have "
                    "reached other replicas: the deployment does not say how many it has, no answer names "
                    "its replica and this engine binds no session affinity"
                )
            raise AssertionError(
                f"{max(8, replicas) + 2} requests of a {LONG}-token prefix in one session over {replicas} "
                "replica(s), so one replica served it at least twice; none reports a cached token"
            )
    assert cached(second) > 0, f"the repeat of a {LONG}-token prefix in one session reports {second.cached} cached"
    rl_observe(cached(second), "prompt tokens of the repeat served from the cache")


@clause("CACHE-ISO-1")
@requires("cached_tokens")
def test_isolation_keys_never_share(rl_deployment, rl_observe):
    """Requests with different x-prompt-cache-isolation-key (or body prompt_cache_isolation_key) never share cache
    entries."""
    prompt = rl_deployment.prompt("cache-iso", LONG).body
    key = rl_deployment.salted
    h = rl_deployment.session("cache-iso")
    ask(rl_deployment, prompt, h | {"x-prompt-cache-isolation-key": key("a")})
    again = ask(rl_deployment, prompt, h | {"x-prompt-cache-isolation-key": key("a")})
    if cached(again) == 0:
        inconclusive("the prefix was not served from the cache even under its own key (see CACHE-HIT-1)")
    other = ask(rl_deployment, prompt, h | {"x-prompt-cache-isolation-key": key("b")})
    assert cached(other) == 0, f"a request with another isolation key reused {cached(other)} cached tokens"
    body = ask(rl_deployment, prompt, h, prompt_cache_isolation_key=key("c"))
    assert cached(body) == 0, f"prompt_cache_isolation_key in the body: {cached(body)} cached tokens reused"
    rl_observe(2, f"requests under other keys recomputing a prefix cached under one ({cached(again)} tokens)")


@clause("CACHE-EQ-1")
@requires("cached_tokens", "logprobs")
def test_cache_hits_do_not_change_results(rl_deployment, rl_observe):
    """A cache hit does not change results: greedy tokens equal the uncached run, logprobs within tolerance (default
    1e-4 absolute)."""
    prompt = rl_deployment.prompt("cache-eq", LONG).body
    h = rl_deployment.session("cache-eq")
    cold = ask(rl_deployment, prompt, h, max_tokens=8, logprobs=True, temperature=0)
    warm = ask(rl_deployment, prompt, h, max_tokens=8, logprobs=True, temperature=0)
    if not cached(warm) > 0:
        inconclusive("the second request was not served from the prompt cache (see CACHE-HIT-1)")
    if not cold.entries:
        inconclusive("no logprobs entries to compare (see INF-LOGPROBS-1)")
    tokens = [e.get("token_id") for e in cold.entries], [e.get("token_id") for e in warm.entries]
    assert tokens[0] == tokens[1], f"greedy tokens without the cache {tokens[0]}, with it {tokens[1]}"
    worst = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(cold.entries, warm.entries, strict=True))
    assert worst <= 1e-4, f"logprobs differ by {worst:.2e} on a cache hit of {cached(warm)} tokens"
    rl_observe(len(cold.entries), f"greedy tokens equal with {cached(warm)} prompt tokens from the cache")


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
# `all` is also the default: the same cell with the field left out. It comes first: under the core
# profile each cell's share is made by its first cell, and the first swap of a run may have to be
# a whole snapshot (a start the run cannot diff against); the others then follow one another as
# diffs, so the share back to the base's weights (`none`) is a diff from a diff (FID-SAME-1).
CELLS = [
    pytest.param(
        "CACHE-MATRIX-ALL-SAME",
        None,
        "same",
        False,
        marks=clause("CACHE-MATRIX-ALL-SAME"),
        id="CACHE-MATRIX-ALL-SAME-omitted",
    )
]
CELLS += [
    pytest.param(cell, policy, who, reuse, marks=clause(cell), id=cell) for cell, (policy, who, reuse) in MATRIX.items()
]


def session_on(rl_deployment, host, name):
    """Headers of a session nobody used yet that lands on replica `host`."""
    # CoreWeave lists replicas per hot-load: before the first one, discovery counted none
    if (rl_deployment.capabilities.replicas or len(rl_deployment.replicas())) == 1:
        return rl_deployment.session(f"{name}-fresh")
    if host is None:
        inconclusive("several replicas and no fireworks-backend-host header: a new session may land anywhere")
    probe = rl_deployment.prompt("cache-matrix-probe", 3).body
    for i in range(64):
        h = rl_deployment.session(f"{name}-fresh-{i}")
        if ask(rl_deployment, probe, h, max_tokens=1).headers.get("fireworks-backend-host") == host:
            return h
    inconclusive(f"no new session landed on {host} in 64 tries")


def primed(rl_deployment, name):
    """A prompt cached by its owner session: (prompt, owner headers, replica host)."""
    prompt = rl_deployment.prompt(name, LONG).body
    owner = rl_deployment.session(f"{name}-owner")
    ask(rl_deployment, prompt, owner)
    second = ask(rl_deployment, prompt, owner)
    if cached(second) == 0:
        inconclusive("the prefix was not served from the cache before the swap (see CACHE-HIT-1)")
    return prompt, owner, second.headers.get("fireworks-backend-host")


def owner_again(rl_deployment, was, swapped):
    """The owner's request for its prompt once the swap is served: (the answer, the replica it was cached on)."""
    completed(swapped)
    _, prompt, owner, host = was
    return ask(rl_deployment, prompt, owner), host


def new_session_asks(rl_deployment, was, swapped):
    """A new session's request for the owner's prompt on the owner's replica, once the swap is served."""
    completed(swapped)
    name, prompt, _, host = was
    # the new session is found after the swap (its probes share no prefix with the prompt)
    return ask(rl_deployment, prompt, session_on(rl_deployment, host, name)), host


def named_primed(rl_deployment, name):
    return name, *primed(rl_deployment, name)


part("cache-same", named_primed, owner_again)
part("cache-new", named_primed, new_session_asks)


@requires("cached_tokens")
@loads_from(lambda ctx: [shared() if (ctx.params["policy"] or "all") in ctx.reset_policies else shared("unsignalled")])
@shares(lambda params: share_for(params["policy"]), lambda params: f"cache-{params['who']}")
@pytest.mark.parametrize(("cell", "policy", "who", "reuse"), CELLS)
def test_reset_matrix(rl_deployment, rl_shared, rl_observe, cell, policy, who, reuse):
    after, host = rl_shared(share_for(policy), f"cache-{who}")
    landed = after.headers.get("fireworks-backend-host")
    if host is not None and landed is not None and landed != host:
        inconclusive(f"the request after the swap reached {landed}, the cache is on {host} (see SESS-1)")
    n = cached(after)
    wanted = "reuse (cached > 0)" if reuse else "recompute (cached = 0)"
    assert (n > 0) == reuse, f"reset_prompt_cache={policy!r}, {who} session: cached_tokens {n}; must {wanted}"
    rl_observe(1, f"{who}-session request after a swap with reset_prompt_cache={policy!r}: {n} cached")


def sessionless_hit(rl_deployment, name):
    """A prompt a request without a session was served from the cache for: (prompt, its replica)."""
    prompt = rl_deployment.prompt(name, LONG).body
    for _ in range(8):  # requests without a session may go anywhere: repeat until one hits the cache
        s = ask(rl_deployment, prompt)
        if cached(s) > 0:
            host = s.headers.get("fireworks-backend-host")
            if host is None and rl_deployment.capabilities.replicas > 1:
                inconclusive("several replicas and no fireworks-backend-host header")
            return prompt, host
    inconclusive("repeated requests without a session were never served from the cache")


def sessionless_again(rl_deployment, was, swapped):
    """After the swap: the first request without a session that reaches the replica holding the prefix."""
    completed(swapped)
    prompt, host = was
    for _ in range(16):
        after = ask(rl_deployment, prompt)
        if host is None or after.headers.get("fireworks-backend-host") == host:
            return after
    inconclusive(f"no request without a session reached {host}")


part("no-session", sessionless_hit, sessionless_again)


@clause("CACHE-NOSESSION-1")
@requires("cached_tokens")
@loads_from(lambda ctx: [shared() if "new_session" in ctx.reset_policies else shared("unsignalled")])
@shares(lambda _: share_for("new_session"), "no-session")
def test_no_session_is_a_new_session(rl_deployment, rl_shared, rl_observe):
    """With 'new_session', a request without x-multi-turn-session-id counts as a new session and recomputes."""
    after = rl_shared(share_for("new_session"), "no-session")
    assert cached(after) == 0, f"a request without a session reused {cached(after)} tokens cached before the swap"
    rl_observe(1, "request without a session recomputing after a 'new_session' swap")
