"""R3 — MoE routing matrices (R3-CHANGE-1 swaps in a snapshot with changed routers).

Whether the model is MoE, and its shape (L layers, k experts per token out of E), comes from the
served config (`--rl-base-snapshot`; the `rl_moe` fixture): a dense model makes R3 not-applicable; an MoE model that
returns no routing fails it. Without the config, the clauses that need the shape are
inconclusive, naming the option.
"""

import pytest

from pytest_rlrollout.remote.stream import routing_matrix
from pytest_rlrollout.runs.plan import served
from pytest_rlrollout.suite.marks import clause, loads_from, requires
from pytest_rlrollout.suite.outcomes import inconclusive
from pytest_rlrollout.suite.testing import CACHED_PREFIX, router_change

LOGPROBS = requires("logprobs")  # what every R3 test reads the matrices from
TOKENS = 4


def routed(rl_deployment, prompt, *, chat=False, headers=None, **body):
    base = {"max_tokens": TOKENS, "temperature": 0, "logprobs": True, "include_routing_matrix": True, **body}
    base.update({"messages": prompt.messages()} if chat else {"prompt": prompt.body})
    return rl_deployment.complete(base, chat=chat, headers=headers).expect_ok()


def completion_tokens(stream) -> int:
    """What the completion made: an end-of-sequence may stop it before max_tokens. A stream's
    usage is an option (stream_options.include_usage); without it, a stream that ran to
    max_tokens made that many, and one that stopped sooner cannot be counted."""
    usage = stream.usage if isinstance(stream.usage, dict) else {}
    made = usage.get("completion_tokens")
    if isinstance(made, int):
        return made
    if stream.finish_reason != "length":
        inconclusive(
            f"the stream carried no usage (stream_options.include_usage) and ended {stream.finish_reason!r} "
            "before max_tokens: its completion tokens cannot be counted"
        )
    return TOKENS


def present(entries):
    return [e for e in entries if "routing_matrix" in e]


def every_entry_routed(entries, what: str) -> None:
    assert entries, f"{what}: no logprobs entries at all (see INF-LOGPROBS-1)"
    missing = [i for i, e in enumerate(entries) if "routing_matrix" not in e]
    assert not missing, f"{what}: entries {missing[:10]} of {len(entries)} carry no routing_matrix"


@clause("R3-SHAPE-1")
@LOGPROBS
def test_matrices_hold_l_times_k_bytes(rl_deployment, rl_moe, rl_observe):
    """With include_routing_matrix and logprobs, every logprobs.content[j] carries routing_matrix: base64 of exactly L*k
    uint8 bytes, row-major [L, k]."""
    layers, k, _ = rl_moe.needed()
    prompt = rl_deployment.prompt("r3-shape")
    entries = []
    for kw in ({}, {"stream": True}, {"chat": True}):
        entries += present(routed(rl_deployment, prompt, **kw).entries)
    if not entries:
        inconclusive("no routing_matrix was returned at all (see R3-COMP-1/CHAT-1/STREAM-1)")
    for i, e in enumerate(entries):
        try:
            routing_matrix(e, layers, k)
        except ValueError as err:  # the size, or not base64
            pytest.fail(f"entry {i}: {err}", pytrace=False)
    rl_observe(len(entries), f"routing matrices of L*k = {layers}*{k} bytes")


@clause("R3-RANGE-1")
@LOGPROBS
def test_indices_in_range_and_distinct(rl_deployment, rl_moe, rl_observe):
    """Every expert index is below E and the k indices of a row are distinct."""
    layers, k, experts = rl_moe.needed()
    matrices = []
    for e in present(routed(rl_deployment, rl_deployment.prompt("r3-range"), stream=True).entries):
        try:
            matrices.append(routing_matrix(e, layers, k))
        except ValueError:
            continue  # a wrong size is R3-SHAPE-1's finding
    if not matrices:
        inconclusive("no routing matrix of the right size to judge (see R3-SHAPE-1)")
    for m in matrices:
        assert (m < experts).all(), f"expert index >= E={experts}: {m.tolist()}"
        assert all(len(set(row)) == k for row in m.tolist()), f"repeated expert in a row: {m.tolist()}"
    rl_observe(len(matrices) * layers, f"rows of {k} distinct experts below E={experts}")


@clause("R3-CHAT-1")
@LOGPROBS
def test_chat_completions_carry_routing(rl_deployment, rl_moe, rl_observe):
    """Chat completions carry routing at choices[i].logprobs.content[j].routing_matrix."""
    entries = routed(rl_deployment, rl_deployment.prompt("r3-chat"), chat=True).entries
    every_entry_routed(entries, "a chat completion")
    rl_observe(len(entries), "chat entries with routing_matrix")


@clause("R3-COMP-1")
@LOGPROBS
def test_completions_carry_routing(rl_deployment, rl_moe, rl_observe):
    """Completions carry routing at choices[i].logprobs.content[j].routing_matrix."""
    entries = routed(rl_deployment, rl_deployment.prompt("r3-comp")).entries
    every_entry_routed(entries, "a completion")
    rl_observe(len(entries), "completion entries with routing_matrix")


@clause("R3-STREAM-1")
@LOGPROBS
def test_every_streamed_token_carries_routing(rl_deployment, rl_moe, rl_observe):
    """Streaming carries routing on every streamed token's logprobs.content entry."""
    s = routed(rl_deployment, rl_deployment.prompt("r3-stream"), stream=True, max_tokens=6)
    entries = s.entries
    every_entry_routed(entries, "a stream")
    n = (s.usage or {}).get("completion_tokens")
    assert n is None or len(entries) == n, f"{len(entries)} streamed entries for {n} completion tokens"
    rl_observe(len(entries), "streamed tokens with routing_matrix")


@clause("R3-ECHO-1")
@requires("logprobs", "echo", "token_id_prompts")
def test_echo_returns_prompt_routing(rl_deployment, rl_moe, rl_observe):
    """echo: true also returns routing for the prompt tokens: one entry per prompt token plus one per completion token."""
    prompt = rl_deployment.prompt("r3-echo")
    stream = routed(rl_deployment, prompt, stream=True, echo=True, stream_options={"include_usage": True})
    entries = stream.entries
    made = completion_tokens(stream)
    assert len(entries) == len(prompt.ids) + made, (
        f"{len(entries)} entries for {len(prompt.ids)} prompt + {made} completion tokens"
    )
    echoed = [e.get("token_id") for e in entries[: len(prompt.ids)]]
    assert echoed == prompt.ids, f"the echoed entries name tokens {echoed}, the prompt is {prompt.ids}"
    every_entry_routed(entries[: len(prompt.ids)], "echoed prompt tokens")
    rl_observe(len(prompt.ids), "echoed prompt tokens with routing_matrix")


@clause("R3-ECHOLAST-1")
@requires("logprobs", "echo", "token_id_prompts")
def test_echo_last_returns_the_last_n_prompt_tokens(rl_deployment, rl_moe, rl_observe):
    """echo_last: N returns prompt routing for the last N prompt tokens only."""
    prompt = rl_deployment.prompt("r3-echolast")
    stream = routed(rl_deployment, prompt, stream=True, echo_last=5, stream_options={"include_usage": True})
    entries = stream.entries
    made = completion_tokens(stream)
    assert len(entries) == 5 + made, f"{len(entries)} entries for echo_last=5 and {made} completion tokens"
    echoed = [e.get("token_id") for e in entries[:5]]
    assert echoed == prompt.ids[-5:], f"echo_last=5 returned tokens {echoed}, the prompt ends {prompt.ids[-5:]}"
    rl_observe(5, "last prompt tokens echoed")


@clause("R3-DET-1")
@LOGPROBS
def test_greedy_routing_is_deterministic(rl_deployment, rl_moe, rl_observe):
    """The same greedy request twice on one snapshot gives identical routing."""
    prompt = rl_deployment.prompt("r3-det")
    first, second = (routed(rl_deployment, prompt, stream=True).entries for _ in range(2))
    if not present(first) or not present(second):
        inconclusive("no routing to compare (see R3-STREAM-1)")
    same = 0  # positions whose tokens agree: greedy decoding itself is not this clause's business
    while same < min(len(first), len(second)) and first[same].get("token_id") == second[same].get("token_id"):
        same += 1
    differ = [i for i in range(same) if first[i].get("routing_matrix") != second[i].get("routing_matrix")]
    assert not differ, f"the same greedy request routed positions {differ} differently"
    rl_observe(same, "positions routed identically by the same greedy request twice")


@clause("R3-CACHE-1")
@requires("logprobs", "echo", "cached_tokens")
def test_cached_prefix_routing_equals_computed(rl_deployment, rl_moe, rl_observe):
    """Routing returned for prefix tokens served from the prompt cache equals routing computed without the cache."""
    layers, k, _ = rl_moe.needed()
    prompt = rl_deployment.prompt("r3-cache", CACHED_PREFIX)
    headers = rl_deployment.session("r3-cache")
    cold = routed(rl_deployment, prompt, headers=headers, max_tokens=2, echo=True, stream=True)
    warm = routed(rl_deployment, prompt, headers=headers, max_tokens=2, echo=True, stream=True)
    cached = warm.cached or 0
    if cached == 0:
        inconclusive("the second request was not served from the prompt cache (see CACHE-HIT-1)")
    if len(cold.entries) < cached or len(warm.entries) < cached:
        inconclusive("echo returned fewer entries than the cached prefix (see R3-ECHO-1)")

    def rows(entry):  # the experts of each layer, as sets: their order is R3-DET-1's business
        if "routing_matrix" not in entry:
            inconclusive("echoed prompt tokens carry no routing (see R3-ECHO-1)")
        try:
            return [sorted(r) for r in routing_matrix(entry, layers, k).tolist()]
        except ValueError as e:
            inconclusive(f"{e} (see R3-SHAPE-1)")

    mismatched = [i for i in range(cached) if rows(cold.entries[i]) != rows(warm.entries[i])]
    assert not mismatched, f"cached prefix positions {mismatched[:10]} route differently than when computed"
    rl_observe(cached, "cached prefix positions routed as when computed")


@clause("R3-CHANGE-1")
@requires("logprobs", "echo", "token_id_prompts")
@loads_from(lambda ctx: [served(change="routers")] if ctx.has("routing_matrix") else [])  # else: `rl_moe`
def test_routing_follows_new_router_weights(rl_deployment, rl_swap, rl_moe, rl_observe):
    """After a swap to different router weights, routing reflects the new weights."""
    layers, k, _ = rl_moe.needed()
    routers = router_change(rl_deployment, rl_swap, layers)  # the first and the last MoE layer's
    prompt = rl_deployment.prompt("r3-change", 48)
    session = rl_deployment.session("r3-change")

    def prompt_routing():
        # one session: the same replica answers before and after the swap
        entries = routed(rl_deployment, prompt, echo=True, headers=session).entries
        try:
            return [routing_matrix(e, layers, k) for e in present(entries[: len(prompt.ids)])]
        except ValueError:
            inconclusive("routing matrices of the wrong size (see R3-SHAPE-1)")

    before = prompt_routing()
    if not before:
        inconclusive("echo returned no routing for the prompt (see R3-ECHO-1)")
    rl_swap("routers", change=routers.change)
    after = prompt_routing()
    if len(after) != len(before):
        inconclusive("echo returned routing for a different number of prompt tokens after the swap")
    judged = len(before) * len(routers.rows)
    changed = sum(set(a[i]) != set(b[i]) for a, b in zip(before, after, strict=True) for i in routers.rows)
    ends = routers.layers
    assert changed >= judged // 2, (
        f"only {changed} of {judged} (token, layer) rows of layers {ends} changed after their routers were negated"
    )
    rl_observe(changed, f"of {judged} (token, layer) rows of layers {ends} routed differently after the swap")
