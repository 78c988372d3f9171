"""VER — the policy version on every response: a snapshot the serving replica had loaded at that
moment. Across a swap: chunks before the signal name the old snapshot, chunks generated after
every replica serves the new one name the new one. Fireworks says it per chunk (`model@identity`);
engines that say it as spans over the output tokens (vLLM) are held to VER-SPAN-1."""

import pytest

from pytest_rlrollout.remote.stream import span_problems
from pytest_rlrollout.runs.plan import served, shared
from pytest_rlrollout.suite.marks import clause, loads, requires
from pytest_rlrollout.suite.outcomes import inconclusive
from pytest_rlrollout.suite.testing import CROSSING, part, served_by, share_for, shares


def loaded(rl_deployment) -> set:
    """Every snapshot or adapter identity some replica has loaded now."""
    return {i for r in rl_deployment.replicas() for i in served_by(r)}


def suffixes(chunks) -> list:
    """The identity each chunk names; fails on a chunk whose model is not <model>@<identity>."""
    out = []
    for i, c in enumerate(chunks):
        m = c.get("model")
        ok = isinstance(m, str) and "@" in m and m.partition("@")[0] and m.rpartition("@")[2]
        assert ok, f"chunk {i}: model {m!r} is not <model>@<identity>"
        out.append(m.rpartition("@")[2])
    return out


def request(rl_deployment, name, chat, **body):
    prompt = rl_deployment.prompt(name)
    body = {"max_tokens": 6, "stream": True, **body}
    body.update({"messages": prompt.messages()} if chat else {"prompt": prompt.body})
    return rl_deployment.complete(body, chat=chat)


@clause("VER-STREAM-1")
@requires("policy_version")
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_streamed_chunks_carry_the_served_identity(rl_deployment, rl_observe, chat):
    """On a hot-load deployment every streamed chunk's model is '<model>@<snapshot_identity>' on /v1/completions and
    /v1/chat/completions, naming a snapshot the serving replica had loaded at that moment."""
    s = request(rl_deployment, f"ver-stream-{chat}", chat).expect_ok()
    assert s.chunks, "the stream carried no chunk"
    seen = set(suffixes(s.chunks))
    now = loaded(rl_deployment)
    assert seen <= now, f"chunks name {sorted(seen - now)}; the replicas have loaded {sorted(now)}"
    rl_observe(len(s.chunks), f"chunks naming a loaded snapshot ({', '.join(sorted(seen))})")


part("loaded-before", lambda dep, _: loaded(dep), lambda _, before, __: before)


@clause("VER-STREAM-1")
@requires("policy_version")
@loads(shared())
@shares(lambda _: share_for(None), CROSSING, "loaded-before")
def test_versions_across_a_swap_name_the_snapshot_loaded_then(rl_deployment, rl_shared, rl_observe):
    """On a hot-load deployment every streamed chunk's model is '<model>@<snapshot_identity>' on /v1/completions and
    /v1/chat/completions, naming a snapshot the serving replica had loaded at that moment."""
    seen = rl_shared.parts(share_for(None), ["loaded-before", CROSSING])
    before, c = seen["loaded-before"], seen[CROSSING]
    if not c.chunks:
        inconclusive(f"the stream returned no chunks ({c.error!r})")
    if not c.served:
        inconclusive(f"the swap to {c.new} did not complete (see HL-GET-2)")
    versions = suffixes(c.chunks)
    early = {i: versions[i] for i in c.before_swap() if versions[i] not in before}
    assert not early, (
        f"chunks {sorted(early)} arrived before any replica served {c.new} and name {set(early.values())}; "
        f"loaded: {before}"
    )
    late = c.after_served()
    stale = [i for i in late if versions[i] != c.new]
    assert not stale, (
        f"chunks {stale[:10]} (of {len(versions)}) arrived {c.arrivals[stale[0]] - c.t_served:.3f} s and more after "
        f"every replica served {c.new}, and name {sorted({versions[i] for i in stale})}"
    )
    between = {versions[i] for i in range(len(versions))} - before - {c.new}
    assert not between, f"chunks name {between}; loaded were {before} and then {c.new}"
    rl_observe(len(c.before_swap()), "chunks before any replica served the new snapshot naming the old one")
    rl_observe(len(late), f"chunks after every replica served it naming {c.new}")


@clause("VER-NONSTREAM-1")
@requires("nonstream_version")
def test_non_streaming_responses_carry_the_version(rl_deployment, rl_observe):
    """Non-streaming responses carry the same '@<identity>' suffix."""
    r = request(rl_deployment, "ver-nonstream", False, stream=False).expect_ok()
    version = r.versions[-1] if r.versions else None
    assert version is not None, f"the response names no policy version (its model is {r.final.get('model')!r})"
    now = loaded(rl_deployment)
    assert version in now, f"the response names {version!r}, which nothing has loaded ({sorted(now)})"
    rl_observe(1, f"non-streaming response naming {version}")


@clause("VER-NONSTREAM-1")
@requires("nonstream_version")
@loads(served())
def test_non_streaming_version_follows_a_swap(rl_deployment, rl_swap, rl_observe):
    """Non-streaming responses carry the same '@<identity>' suffix."""
    new = rl_swap("nonstream").built.identity
    r = request(rl_deployment, "ver-nonstream-swap", False, stream=False).expect_ok()
    version = r.versions[-1] if r.versions else None
    assert version == new, f"after the swap to {new} a response names {version!r} (model {r.final.get('model')!r})"
    rl_observe(1, f"non-streaming response after the swap naming {new}")


def output_tokens(s) -> int:
    """The stream's output tokens: its logprobs entries, which usage must agree with."""
    n = len(s.entries)
    told = (s.usage or {}).get("completion_tokens")
    assert told in (None, n), f"usage.completion_tokens {told}, but {n} tokens streamed (see INF-USAGE-1)"
    return n


@clause("VER-SPAN-1")
@requires("policy_version", "logprobs")
def test_spans_cover_the_output_tokens_once(rl_deployment, rl_observe):
    """Where policy versions come as spans, they cover the output tokens exactly once: ordered, contiguous, half-open
    [start, end) from 0 to the number of output tokens; no output tokens, no spans; each span names a snapshot loaded
    while those tokens were generated."""
    s = rl_deployment.complete(
        {
            "prompt": rl_deployment.prompt("ver-span", 8).body,
            "max_tokens": 12,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
            "logprobs": True,
        }
    ).expect_ok()
    spans = s.spans
    assert spans is not None, "the stream carried no policy-version spans"
    n = output_tokens(s)
    found = span_problems(spans, n)
    assert not found, f"spans {spans} over {n} output tokens: {'; '.join(found)}"
    named, now = {x["version"] for x in spans}, loaded(rl_deployment)
    assert named <= now, f"the spans name {sorted(named - now)}; loaded is {sorted(now)}"
    rl_observe(n, f"output tokens covered once by {len(spans)} span(s) naming {', '.join(sorted(named))}")


@clause("VER-SPAN-1")
@requires("policy_version", "logprobs")
@loads(shared())
@shares(lambda _: share_for(None), CROSSING)
def test_spans_across_a_swap_name_old_then_new(rl_deployment, rl_shared, rl_observe):
    """Where policy versions come as spans, they cover the output tokens exactly once: ordered, contiguous, half-open
    [start, end) from 0 to the number of output tokens; no output tokens, no spans; each span names a snapshot loaded
    while those tokens were generated."""
    c = rl_shared(share_for(None), CROSSING)
    if c.stream is None or not c.stream.ok:
        inconclusive(f"the stream did not complete ({c.error!r}; see SWAP-ASYNC-1)")
    if not c.served:
        inconclusive(f"the swap to {c.new} did not complete (see HL-GET-2)")
    s = c.stream
    spans = s.spans
    assert spans is not None, "the stream carried no policy-version spans"
    n = output_tokens(s)
    found = span_problems(spans, n)
    assert not found, f"spans {spans} over {n} output tokens: {'; '.join(found)}"
    named = [x["version"] for x in spans]
    assert set(named) <= {c.old, c.new}, f"the spans name {named}; the stream met {c.old} and then {c.new}"
    assert named == sorted(named, key=[c.old, c.new].index), f"the spans go back to the old snapshot: {named}"
    if c.new not in named:
        inconclusive("the stream ended before the new snapshot served")
    rl_observe(n, f"output tokens across the swap covered once by spans {named}")
