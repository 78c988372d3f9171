"""SWAP — what streams and requests see while a snapshot is swapped in.

Each test starts a stream or sends requests around a real swap, and draws what it saw on its
timeline (the report's picture). When the observation could not be made (the swap finished
before any probe landed inside it, the stream ended first) the clause is `inconclusive`, never
a pass.
"""

import itertools

import pytest

from pytest_rlrollout.remote.stream import span_version
from pytest_rlrollout.runs.plan import served, shared
from pytest_rlrollout.suite.marks import clause, loads, loads_from, requires
from pytest_rlrollout.suite.outcomes import inconclusive
from pytest_rlrollout.suite.testing import (
    CROSSING,
    GREEDY_BEFORE,
    PROBES,
    WHITELIST,
    across_swap,
    completed,
    crossing_body,
    not_cut_by_the_suite,
    part,
    parting,
    probes_during_swap,
    share_for,
    shares,
)


def crossing(rl_deployment, rl_swap, rl_observe, name, change=None, **signal):
    return signalled(
        across_swap(rl_deployment, rl_swap, rl_observe, crossing_body(rl_deployment, name), change=change, **signal)
    )


def signalled(c):
    if c.response.status_code != 200:
        inconclusive(f"the swap could not be signalled ({c.response.status_code}: {c.response.text[:200]})")
    return c


def judge_completion(c, rl_observe, asked: int) -> None:
    not_cut_by_the_suite(c.error, len(c.entries), asked)
    assert c.error is None, f"the stream broke: {c.error!r}"
    s = c.stream
    assert s.status == 200, f"HTTP {s.status}: {s.body[:200]!r}"
    assert s.done, f"no data: [DONE] (finish_reason {s.finish_reason!r})"
    assert s.finish_reason in WHITELIST, f"finish_reason {s.finish_reason!r}"
    streamed, told = len(c.entries), (s.usage or {}).get("completion_tokens")
    if told is not None:
        assert streamed == told, f"{streamed} tokens streamed, usage says {told} (restarted?)"
    else:  # a stream's usage is an option (stream_options.include_usage): count by max_tokens instead
        if s.finish_reason != "length":
            inconclusive(
                f"the stream carried no usage (stream_options.include_usage) and ended {s.finish_reason!r} "
                f"before max_tokens (ignore_eos): whether it restarted cannot be counted"
            )
        assert streamed == asked, f"{streamed} tokens streamed for max_tokens={asked}, and no usage (restarted?)"
    rl_observe(streamed, f"tokens of a stream across the swap, ended {s.finish_reason!r} and [DONE]")


@clause("SWAP-ASYNC-1")
@requires("transition:ASYNC", "logprobs")
@loads(shared())
@shares(lambda _: share_for(None), CROSSING)
def test_async_stream_survives_the_swap(rl_deployment, rl_shared, rl_observe):
    """ASYNC: a stream in flight across the swap completes with 200, a whitelisted finish_reason (stop, length,
    tool_calls) and [DONE]; it is not restarted: the streamed token count equals usage.completion_tokens and the text
    is one continuous sequence."""
    c = signalled(rl_shared(share_for(None), CROSSING))
    if not c.crossed:
        inconclusive("the stream ended before the swap reached its replica")
    judge_completion(c, rl_observe, rl_deployment.long_stream_tokens)


@clause("SWAP-ASYNC-2")
@requires("transition:ASYNC", "policy_version")
@loads(shared())
@shares(lambda _: share_for(None), CROSSING, GREEDY_BEFORE)
def test_async_policy_version_changes_once(rl_deployment, rl_dated_crossing, rl_observe):
    """ASYNC: the streamed policy version changes at most once, from old to new; every chunk after the swap carries the
    new identity."""
    # Where spans (said once, at the end) date tokens by index, the tokens' own numbers date them:
    # the first token scored unlike the same greedy request before the swap (`old`) was generated
    # after it, and it and every later token must name the new snapshot.
    c, old = rl_dated_crossing(share_for(None))
    c = signalled(c)
    v = c.versions
    if not v or None in v:
        inconclusive("some chunks carry no policy version (see VER-STREAM-1)")
    if not c.served:
        inconclusive(f"the swap to {c.new} did not complete (see HL-GET-2)")
    if old is not None and c.stream is not None and c.stream.spans is not None:
        judge_by_numbers(c, old, rl_deployment.options.numerics.fingerprint_tolerance, rl_observe)
    late = c.after_served() if c.stream is not None and c.stream.spans is None else []
    stale = [i for i in late if v[i] != c.new]
    assert not stale, (
        f"chunks {stale[:10]} arrived {c.arrivals[stale[0]] - c.t_served:.3f} s and more after every replica "
        f"served {c.new}, and name {sorted({v[i] for i in stale})}"
    )
    if c.new not in v:
        inconclusive("the stream ended before every replica served the new snapshot")
    changes = [(a, b) for a, b in itertools.pairwise(v) if a != b]
    assert changes == [(c.old, c.new)] or (v[0] == c.new and not changes), f"policy versions along the stream: {v}"
    first_new = v.index(c.new)
    assert set(v[first_new:]) == {c.new}, f"old-version chunks after the first new one: {v}"
    rl_observe(1, f"change {c.old} -> {c.new} at chunk {first_new} of {len(v)}")
    rl_observe(len(late), "chunks after every replica served the new snapshot, all naming it")


def judge_by_numbers(c, old, tolerance, rl_observe) -> None:
    """Every token from the first one the new weights scored on must be labelled new by the spans."""
    entries, spans = c.entries, c.stream.spans
    p = parting(old, entries, tolerance)
    if p.token is None:
        return  # no token scored unlike the old weights: the spans' order is all there is to judge
    if p.token < c.tokens_before_swap():
        inconclusive(
            f"token {p.token}, which arrived before any replica served {c.new}, already scores unlike the "
            f"same greedy request before it (|Δlogprob| {p.delta:.3g} > {tolerance:g}): the numbers cannot "
            "date this stream (see FID-BATCH-1)"
        )
    named = [span_version(spans, i) for i in range(p.token, len(entries))]
    stale = [p.token + i for i, version in enumerate(named) if version != c.new]
    assert not stale, (
        f"tokens {stale[0]}..{stale[-1]} ({len(stale)}) are labelled {sorted(set(map(str, named)) - {c.new})} by the "
        f"spans {spans}, but token {p.token} on scores unlike the old weights (|Δlogprob| {p.delta:.3g} > "
        f"{tolerance:g} against the same greedy request before the swap; the {p.token} before it score alike): "
        f"the new weights generated them"
    )
    rl_observe(
        len(named),
        f"tokens from {p.token} on, generated by the new weights by their numbers, labelled {c.new} by the spans",
    )


@clause("SWAP-ASYNC-3")
@requires("transition:ASYNC")
@loads(shared())
# (on the share whose reset is `none`, not the default's: the probes a pause holds are served once
# the swap is, before the requests SWAP-NEW-1 sends after it, which must be the first)
@shares(lambda _: share_for("none"), PROBES)
def test_async_requests_during_the_swap_are_queued(rl_deployment, rl_shared, rl_observe):
    """ASYNC: requests arriving during the swap are queued, not rejected (200), unless their drain timeout is exceeded."""
    probing = rl_shared(share_for("none"), PROBES)
    if probing is None or (probing.result is not None and probing.result.response.status_code != 200):
        inconclusive("the swap could not be signalled (see HL-POST-1)")
    probes = [p for p in probing.probes if p.any_in_swap]
    if not probes:
        inconclusive(
            "no request reached the deployment while the swap was under way (no status poll caught it "
            "in progress, or no answer began while it was held midway)"
        )
    assert [p.status for p in probes] == [200] * len(probes), [(p.status, round(p.seconds, 3)) for p in probes]
    rl_observe(len(probes), "requests sent while the swap was under way, answered 200")


DRAIN = 0.01  # seconds: the drain timeout the probes carry


@clause("SWAP-ASYNC-4")
@requires("transition:ASYNC")
@loads(served())
def test_async_drain_timeout_gets_425(rl_deployment, rl_swap, rl_observe):
    """ASYNC: a request carrying x-fireworks-hot-load-drain-timeout: S that waits longer than S seconds gets 425
    (default 90 s)."""
    run = probes_during_swap(
        rl_deployment, rl_swap, rl_observe, every=True, headers={"x-fireworks-hot-load-drain-timeout": str(DRAIN)}
    )
    assert all(p.status in (200, 425) for p in run.probes), [p.status for p in run.probes]
    # A probe sent while every replica was swapping, and the status still showed the swap a
    # while later, cannot have been served before then: it waited past its drain timeout.
    # Judged on the status's clock (less the time a poll's answer travels), not on how long
    # generating the answer took.
    margin = DRAIN + max(0.02, 2 * run.round_trip)
    waited = [p for p in run.probes if p.all_in_swap and run.in_swap_until - p.sent > margin]
    if not waited:
        inconclusive(f"no request was sent more than {margin:.2f} s before the swap ended")
    served = [p for p in waited if p.status != 425]
    assert not served, (
        f"requests sent {[round(run.in_swap_until - p.sent, 3) for p in served]} s before the swap ended, with a "
        f"drain timeout of {DRAIN} s, got {[p.status for p in served]}, not 425"
    )
    rl_observe(len(waited), f"requests waiting past a drain timeout of {DRAIN} s, refused 425")


@clause("SWAP-SYNC-1")
@requires("transition:SYNC", "logprobs", "policy_version")
@loads(served())
def test_sync_stream_finishes_on_the_old_snapshot(rl_deployment, rl_swap, rl_observe):
    """SYNC: a stream in flight when the swap is signalled finishes entirely on the old identity."""
    c = crossing(rl_deployment, rl_swap, rl_observe, "swap-sync-1")
    if not c.in_flight_at_signal:
        inconclusive("the stream had ended before the signal was answered")
    v = c.versions
    if None in v:
        inconclusive("some chunks carry no policy version (see VER-STREAM-1)")
    judge_completion(c, rl_observe, rl_deployment.long_stream_tokens)
    assert set(v) == {c.old}, f"a stream in flight at a SYNC swap changed policy: {v}"
    rl_observe(len(v), f"chunks all naming {c.old}, the snapshot of the stream's start")


@clause("SWAP-SYNC-2")
@requires("transition:SYNC")
@loads(served())
def test_sync_requests_during_the_swap_get_425_then_succeed(rl_deployment, rl_swap, rl_observe):
    """SYNC: requests arriving during the swap get 425 Too Early; the same request retried with the same session key
    after the swap succeeds on the new identity."""
    run = probes_during_swap(rl_deployment, rl_swap, rl_observe, every=True)
    # A 425 is the deployment's own word that the swap was on; any other answer counts only if it
    # came before a later status poll still showed the swap on every replica.
    built = run.built
    judged = [p for p in run.probes if p.all_in_swap and (p.status == 425 or p.answered <= run.answered_in_swap_before)]
    if not judged:
        inconclusive("no request was answered while every replica was still shown swapping")
    served = [p for p in judged if p.status != 425]
    assert not served, (
        f"statuses during the swap: {[p.status for p in judged]}; answered "
        f"{[round(run.answered_in_swap_before - p.answered, 3) for p in served]} s before a status poll still showed the swap"
    )
    probe = rl_deployment.prompt("probe", 3).body
    for p in judged:  # retried with the same session key once the swap is over
        s = rl_deployment.complete({"prompt": probe, "max_tokens": 1, "stream": True}, headers=p.session)
        assert s.status == 200, f"the retry got {s.status}: {s.body[:200]!r}"
        if s.versions and s.versions[0] is not None:
            assert s.versions[0] == built.identity, f"the retry was served by {s.versions[0]}"
    rl_observe(len(judged), "requests refused 425 during the swap and answered 200 on retry")


def new_requests(rl_deployment, name, swapped):
    """Once the swap is served: the new identity, and the versions 8 one-token requests name."""
    new = completed(swapped).built.identity
    versions = []
    probe = rl_deployment.prompt(f"swap-{name}", 3).body
    for i in range(8):
        s = rl_deployment.complete(
            {"prompt": probe, "max_tokens": 1, "stream": True}, headers=rl_deployment.session(f"{name}-{new}-{i % 4}")
        ).expect_ok()
        versions += s.versions
    return new, versions


part("new-requests", lambda _, name: name, new_requests, first=True)


@clause("SWAP-NEW-1")
@requires("policy_version")
@loads(shared())
@shares(lambda _: share_for(None), "new-requests")
def test_new_requests_carry_the_new_identity(rl_deployment, rl_shared, rl_observe):
    """Once status reports the new identity on a replica, new requests served there carry it."""
    new, versions = rl_shared(share_for(None), "new-requests")
    if not versions or None in versions:
        inconclusive("some chunks carry no policy version (see VER-STREAM-1)")
    assert set(versions) == {new}, f"requests after the status said {new}: {versions}"
    rl_observe(len(versions), f"chunks of 8 requests after the swap naming {new}")


@clause("SWAP-KV-1")
@requires("logprobs", "transition:ASYNC")  # SYNC swaps wait for in-flight streams: no reset can meet one
@pytest.mark.parametrize("policy", ["all", "new_session", "none"])
@loads_from(lambda ctx: [shared() if ctx.params["policy"] in ctx.reset_policies else shared("unsignalled")])
@shares(lambda params: share_for(params["policy"]), CROSSING)
def test_cache_reset_never_disturbs_an_in_flight_stream(rl_deployment, rl_shared, rl_observe, policy):
    """reset_prompt_cache never disturbs an in-flight stream, under every policy value."""
    c = signalled(rl_shared(share_for(policy), CROSSING))
    if not c.crossed:
        inconclusive("the stream ended before the swap reached its replica")
    judge_completion(c, rl_observe, rl_deployment.long_stream_tokens)
