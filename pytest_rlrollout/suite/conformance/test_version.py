"""VER — the policy version (`model@identity`) on every response."""

import pytest

from pytest_rlrollout.suite.observe import across_swap, unique_prompt
from pytest_rlrollout.suite.outcomes import inconclusive, unsupported

clause = pytest.mark.rl_clause


def loaded(rl_deployment) -> set:
    """Every snapshot or adapter identity some replica has loaded now."""
    out = set()
    for r in rl_deployment.replicas():
        out.add(r.get("current_snapshot_identity"))
        out |= {a.get("identity") for a in r.get("loaded_adapters") or [] if a.get("status") == "loaded"}
    return out - {None}


def suffixes(chunks) -> list:
    models = [c.get("model") or "" for c in chunks]
    for m in models:
        assert "@" in m and m.partition("@")[0] and m.rpartition("@")[2], f"chunk model {m!r} is not <model>@<identity>"
    return [m.rpartition("@")[2] for m in models]


@clause("VER-STREAM-1")
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_streamed_chunks_carry_the_served_identity(rl_deployment, chat, request):
    body = {"max_tokens": 6, "temperature": 0, "stream": True}
    if chat:
        body["messages"] = [{"role": "user", "content": "hello world"}]
    else:
        body["prompt"] = unique_prompt(request.node.name, 24)
    s = rl_deployment.complete(body, chat=chat)
    assert s.status == 200 and s.chunks, s.status
    seen = set(suffixes(s.chunks))
    assert seen <= loaded(rl_deployment), f"versions {seen} name nothing loaded ({loaded(rl_deployment)})"


@pytest.mark.rl_swaps
@clause("VER-STREAM-1")
def test_versions_across_a_swap_name_loaded_snapshots(rl_deployment, rl_swap, request):
    old = loaded(rl_deployment)
    body = {"prompt": unique_prompt(request.node.name, 40), "max_tokens": rl_deployment.long_stream_tokens, "ignore_eos": True,
            "temperature": 0}  # fmt: skip
    c = across_swap(rl_deployment, rl_swap, body)
    if not c.chunks:
        inconclusive(f"the stream returned no chunks ({c.error!r})")
    seen = set(suffixes(c.chunks))
    assert seen <= old | {c.new}, f"versions {seen}; loaded were {old} and then {c.new}"


@clause("VER-NONSTREAM-1")
def test_non_streaming_responses_carry_the_version(rl_deployment, request):
    r = rl_deployment.complete({"prompt": unique_prompt(request.node.name, 24), "max_tokens": 2, "temperature": 0})
    assert r.status == 200, r.status
    model = r.chunks[0].get("model") or ""
    if "@" not in model:
        unsupported(f"non-streaming responses name the model without a version ({model!r})")
    assert model.rpartition("@")[2] in loaded(rl_deployment), f"{model!r} names nothing loaded"


@pytest.mark.rl_swaps
@clause("VER-NONSTREAM-1")
def test_non_streaming_version_follows_a_swap(rl_deployment, rl_swap, request):
    new = rl_swap("nonstream").built.identity
    r = rl_deployment.complete({"prompt": unique_prompt(request.node.name, 24), "max_tokens": 2, "temperature": 0})
    model = r.chunks[0].get("model") or "" if r.status == 200 else ""
    if "@" not in model:
        unsupported(f"non-streaming responses name the model without a version ({model!r})")
    assert model.rpartition("@")[2] == new, f"after the swap to {new} a response says {model!r}"
