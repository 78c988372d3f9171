"""R3 — MoE routing matrices (R3-CHANGE-1 swaps in a snapshot with changed routers)."""

import pytest

from pytest_rlrollout.contract.moe import moe_shape
from pytest_rlrollout.remote.stream import routing_matrix
from pytest_rlrollout.suite.observe import unique_prompt
from pytest_rlrollout.suite.outcomes import inconclusive, not_applicable

clause = pytest.mark.rl_clause


@pytest.fixture
def shape(rl_deployment):
    s = moe_shape(rl_deployment.base_config)
    if s is None:
        not_applicable("no MoE base config (a dense model, or pass --rl-base)")
    return s.layers, s.k, s.experts


def routed(rl_deployment, prompt, *, chat=False, headers=None, **body):
    base = {"max_tokens": 4, "temperature": 0, "logprobs": True, "include_routing_matrix": True, **body}
    if chat:
        base["messages"] = [{"role": "user", "content": "hello world"}]
    else:
        base["prompt"] = prompt
    return rl_deployment.complete(base, chat=chat, headers=headers)


def present(entries):
    return [e for e in entries if "routing_matrix" in e]


@clause("R3-SHAPE-1")
def test_matrices_hold_l_times_k_bytes(rl_deployment, shape, request):
    layers, k, _ = shape
    entries = []
    for kw in ({}, {"stream": True}, {"chat": True}):
        entries += present(routed(rl_deployment, unique_prompt(request.node.name, 24), **kw).entries)
    if not entries:
        inconclusive("no routing_matrix was returned at all (see R3-COMP-1/CHAT-1/STREAM-1)")
    for e in entries:
        routing_matrix(e, layers, k)  # raises with the byte count when it is not L*k


@clause("R3-RANGE-1")
def test_indices_in_range_and_distinct(rl_deployment, shape, request):
    layers, k, experts = shape
    matrices = []
    for e in present(routed(rl_deployment, unique_prompt(request.node.name, 24), stream=True).entries):
        try:
            matrices.append(routing_matrix(e, layers, k))
        except ValueError:
            continue  # a wrong size is R3-SHAPE-1's finding
    if not matrices:
        inconclusive("no routing matrix of the right size to judge")
    for m in matrices:
        assert (m < experts).all(), f"expert index >= E={experts}: {m.tolist()}"
        assert all(len(set(row)) == k for row in m.tolist()), f"repeated expert in a row: {m.tolist()}"


@clause("R3-CHAT-1")
def test_chat_completions_carry_routing(rl_deployment, shape):
    entries = routed(rl_deployment, None, chat=True).entries
    assert entries and all("routing_matrix" in e for e in entries), (
        f"{len(present(entries))}/{len(entries)} entries carry routing"
    )


@clause("R3-COMP-1")
def test_completions_carry_routing(rl_deployment, shape, request):
    entries = routed(rl_deployment, unique_prompt(request.node.name, 24)).entries
    assert entries and all("routing_matrix" in e for e in entries), (
        f"{len(present(entries))}/{len(entries)} entries carry routing"
    )


@clause("R3-STREAM-1")
def test_every_streamed_token_carries_routing(rl_deployment, shape, request):
    entries = routed(rl_deployment, unique_prompt(request.node.name, 24), stream=True, max_tokens=6).entries
    assert len(entries) == 6 and all("routing_matrix" in e for e in entries), (
        f"{len(present(entries))}/{len(entries)} entries carry routing"
    )


@clause("R3-ECHO-1")
def test_echo_returns_prompt_routing(rl_deployment, shape, request):
    prompt = unique_prompt(request.node.name, 24)
    entries = routed(rl_deployment, prompt, stream=True, echo=True).entries
    assert len(entries) == len(prompt) + 4, f"{len(entries)} entries for {len(prompt)} prompt + 4 completion tokens"
    assert [e["token_id"] for e in entries[: len(prompt)]] == prompt
    assert all("routing_matrix" in e for e in entries[: len(prompt)]), "echoed prompt tokens lack routing_matrix"


@clause("R3-ECHOLAST-1")
def test_echo_last_returns_the_last_n_prompt_tokens(rl_deployment, shape, request):
    prompt = unique_prompt(request.node.name, 24)
    entries = routed(rl_deployment, prompt, stream=True, echo_last=5).entries
    assert len(entries) == 5 + 4, f"{len(entries)} entries for echo_last=5 and 4 completion tokens"
    assert [e["token_id"] for e in entries[:5]] == prompt[-5:]


@clause("R3-DET-1")
def test_greedy_routing_is_deterministic(rl_deployment, shape, request):
    prompt = unique_prompt(request.node.name, 24)
    first = [e.get("routing_matrix") for e in routed(rl_deployment, prompt, stream=True).entries]
    second = [e.get("routing_matrix") for e in routed(rl_deployment, prompt, stream=True).entries]
    assert first == second


@clause("R3-CACHE-1")
def test_cached_prefix_routing_equals_computed(rl_deployment, shape, request):
    prompt = unique_prompt(request.node.name, 80)
    headers = {"x-multi-turn-session-id": request.node.name}
    body = {
        "prompt": prompt,
        "max_tokens": 2,
        "temperature": 0,
        "logprobs": True,
        "include_routing_matrix": True,
        "echo": True,
        "stream": True,
    }
    cold = rl_deployment.complete(body, headers=headers)
    warm = rl_deployment.complete(body, headers=headers)
    cached = warm.cached_tokens()["usage"] or 0
    if cached == 0:
        inconclusive("the second request was not served from the prompt cache (see CACHE-HIT-1)")
    layers, k, _ = shape

    def rows(entry):  # the experts of each layer, as sets: their order is R3-DET-1's business
        if "routing_matrix" not in entry:
            inconclusive("echoed prompt tokens carry no routing (see R3-ECHO-1)")
        try:
            return [sorted(r) for r in routing_matrix(entry, layers, k).tolist()]
        except ValueError as e:
            inconclusive(f"{e} (see R3-SHAPE-1)")

    mismatched = [i for i in range(cached) if rows(cold.entries[i]) != rows(warm.entries[i])]
    assert not mismatched, f"cached prefix positions {mismatched[:10]} route differently than when computed"


@pytest.mark.rl_swaps
@clause("R3-CHANGE-1")
def test_routing_follows_new_router_weights(rl_deployment, rl_swap, shape, request):
    layers, k, _ = shape
    routers = rl_swap.factory.router_tensors
    if not routers:
        inconclusive("no router tensors (…mlp.gate.weight) found in the base snapshot to change")
    prompt = unique_prompt(request.node.name, 48)
    session = {"x-multi-turn-session-id": request.node.name}

    def prompt_routing():
        # one session: the same replica answers before and after the swap
        entries = routed(rl_deployment, prompt, echo=True, headers=session).entries[: len(prompt)]
        try:
            return [routing_matrix(e, layers, k) for e in present(entries)]
        except ValueError:
            inconclusive("routing matrices of the wrong size (see R3-SHAPE-1)")

    before = prompt_routing()
    if len(before) != len(prompt):
        inconclusive("echo returned no routing for some prompt tokens (see R3-ECHO-1)")
    current = rl_swap.factory.record.overlays.get(rl_deployment.serving(), {})
    # negate every router (top-k becomes bottom-k), or undo an earlier negation
    rl_swap("routers", change={n: ["scale", 1.0] if current.get(n) == ["negate"] else ["negate"] for n in routers})
    after = prompt_routing()
    changed = sum(set(a[i]) != set(b[i]) for a, b in zip(before, after, strict=True) for i in range(layers))
    assert changed >= len(before) * layers // 2, (
        f"only {changed} of {len(before) * layers} (token, layer) rows changed after the routers were negated"
    )
