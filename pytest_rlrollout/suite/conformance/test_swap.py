"""SWAP — what streams and requests see while a snapshot is swapped in.

Each test starts a stream or sends requests around a real swap. When the observation could not
be made (the swap finished before any probe landed inside it, the stream ended first) the
clause is `inconclusive`, never a pass.
"""

import itertools
import statistics

import pytest

from pytest_rlrollout.remote.stream import logprob_entries
from pytest_rlrollout.suite.observe import WHITELIST, across_swap, probes_during_swap, unique_prompt
from pytest_rlrollout.suite.outcomes import inconclusive, not_applicable

clause = pytest.mark.rl_clause
swaps = pytest.mark.rl_swaps
requires = pytest.mark.rl_requires


def long_body(rl_deployment, name):
    return {"prompt": unique_prompt(name, 40), "max_tokens": rl_deployment.long_stream_tokens, "temperature": 0,
            "logprobs": True, "ignore_eos": True}  # fmt: skip


def crossing(rl_deployment, rl_swap, request, **signal):
    c = across_swap(rl_deployment, rl_swap, long_body(rl_deployment, request.node.name), **signal)
    if c.response.status_code != 200:
        inconclusive(f"the swap could not be signalled ({c.response.status_code}: {c.response.text[:200]})")
    return c


def judge_completion(c) -> None:
    assert c.error is None, f"the stream broke: {c.error!r}"
    s = c.stream
    assert s.status == 200, f"HTTP {s.status}"
    assert s.done, f"no data: [DONE] (finish_reason {s.finish_reason!r})"
    assert s.finish_reason in WHITELIST, f"finish_reason {s.finish_reason!r}"
    usage = s.usage or {}
    streamed = len(logprob_entries(c.chunks))
    assert streamed == usage.get("completion_tokens"), (
        f"{streamed} tokens streamed, usage says {usage.get('completion_tokens')} (restarted?)"
    )


@swaps
@clause("SWAP-ASYNC-1")
@requires("transition:ASYNC")
def test_async_stream_survives_the_swap(rl_deployment, rl_swap, request):
    c = crossing(rl_deployment, rl_swap, request)
    if not c.crossed:
        inconclusive("the stream ended before the swap reached its replica")
    judge_completion(c)


@swaps
@clause("SWAP-ASYNC-2")
@requires("transition:ASYNC")
def test_async_policy_version_changes_once(rl_deployment, rl_swap, request):
    c = crossing(rl_deployment, rl_swap, request)
    v = c.versions
    if None in v:
        inconclusive("some chunks carry no policy version (see VER-STREAM-1)")
    if c.new not in v:
        inconclusive("no chunk of the stream was generated after the swap")
    changes = [(a, b) for a, b in itertools.pairwise(v) if a != b]
    assert changes == [(c.old, c.new)] or (v[0] == c.new and not changes), f"policy versions along the stream: {v}"
    first_new = v.index(c.new)
    assert set(v[first_new:]) == {c.new}, f"old-version chunks after the first new one: {v}"


@swaps
@clause("SWAP-ASYNC-3")
@requires("transition:ASYNC")
def test_async_requests_during_the_swap_are_queued(rl_deployment, rl_swap):
    _, probes = probes_during_swap(rl_deployment, rl_swap)
    if not probes:
        inconclusive("no status poll caught the swap in progress")
    assert [p.status for p in probes] == [200] * len(probes), [(p.status, round(p.seconds, 3)) for p in probes]


@swaps
@clause("SWAP-ASYNC-4")
@requires("transition:ASYNC")
def test_async_drain_timeout_gets_425(rl_deployment, rl_swap):
    timeout = 0.01
    with rl_deployment.observable_swaps():  # the baseline at the pace the probes meet
        baseline = statistics.median(_latency(rl_deployment) for _ in range(3))
        _, probes = probes_during_swap(
            rl_deployment, rl_swap, headers={"x-fireworks-hot-load-drain-timeout": str(timeout)}
        )
    if not probes:
        inconclusive("no status poll caught the swap in progress")
    waited_too_long = [p for p in probes if p.status == 200 and p.seconds - baseline > timeout + 0.05]
    assert not waited_too_long, (
        f"requests waited {[round(p.seconds - baseline, 3) for p in waited_too_long]} s past a drain timeout of "
        f"{timeout} s and still got 200"
    )
    assert all(p.status in (200, 425) for p in probes), [p.status for p in probes]
    if not any(p.status == 425 for p in probes):
        inconclusive("no request waited longer than the drain timeout")


def _latency(rl_deployment) -> float:
    t = rl_deployment.mark("baseline-sent")
    rl_deployment.complete({"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0, "stream": True})
    return rl_deployment.mark("baseline-answered") - t


@swaps
@clause("SWAP-SYNC-1")
@requires("transition:SYNC")
def test_sync_stream_finishes_on_the_old_snapshot(rl_deployment, rl_swap, request):
    c = crossing(rl_deployment, rl_swap, request)
    if not c.in_flight_at_signal:
        inconclusive("the stream had ended before the signal was answered")
    v = c.versions
    if None in v:
        inconclusive("some chunks carry no policy version (see VER-STREAM-1)")
    judge_completion(c)
    assert set(v) == {c.old}, f"a stream in flight at a SYNC swap changed policy: {v}"


@swaps
@clause("SWAP-SYNC-2")
@requires("transition:SYNC")
def test_sync_requests_during_the_swap_get_425_then_succeed(rl_deployment, rl_swap):
    built, probes = probes_during_swap(rl_deployment, rl_swap, every=True)
    judged = [p for p in probes if p.all_in_swap]
    if not judged:
        inconclusive("no request was sent while every replica was swapping")
    assert all(p.status == 425 for p in judged), f"statuses during the swap: {[p.status for p in judged]}"
    for p in judged:  # retried with the same session key once the swap is over
        s = rl_deployment.complete({"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0, "stream": True},
                                   headers={"x-multi-turn-session-id": p.session})  # fmt: skip
        assert s.status == 200, f"the retry got {s.status}"
        if s.versions and s.versions[0] is not None:
            assert s.versions[0] == built.identity, f"the retry was served by {s.versions[0]}"


@swaps
@clause("SWAP-NEW-1")
def test_new_requests_carry_the_new_identity(rl_deployment, rl_swap):
    new = rl_swap("new-1").built.identity
    versions = []
    for i in range(8):
        s = rl_deployment.complete({"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0, "stream": True},
                                   headers={"x-multi-turn-session-id": f"new-1-{new}-{i % 4}"})  # fmt: skip
        assert s.status == 200, s.status
        versions += s.versions
    if None in versions:
        inconclusive("some chunks carry no policy version (see VER-STREAM-1)")
    assert set(versions) == {new}, f"requests after the status said {new}: {versions}"


@swaps
@clause("SWAP-KV-1")
@pytest.mark.parametrize("policy", ["all", "new_session", "none"])
def test_cache_reset_never_disturbs_an_in_flight_stream(rl_deployment, rl_swap, request, policy):
    if rl_deployment.capabilities["transition"] == "SYNC":
        not_applicable("SYNC swaps wait for in-flight streams, so no reset can meet one")
    c = crossing(rl_deployment, rl_swap, request, reset_prompt_cache=policy)
    if not c.crossed:
        inconclusive("the stream ended before the swap reached its replica")
    judge_completion(c)
