"""CTL — engine control semantics: pausing generation, publishing a policy label, resetting the
prompt cache, and what each does to the requests in flight and to what is served.

Each test starts a stream, acts while it is in flight (`with_stream`), and judges what the
stream and the deployment did, on the run's clock (the recording's in replay). A pause is held
for `Timeouts.hold` (a few `paused()` reads) so that tokens generated meanwhile would show. A
test that leaves generation paused or a label changed puts it back before it ends.
"""

from __future__ import annotations

import threading
import time

from pytest_rlrollout.remote.drivers.base import Unbound
from pytest_rlrollout.remote.fingerprint import (
    ECHO,
    ISOLATION,
    FingerprintError,
    largest_difference,
    prompt_logprobs,
)
from pytest_rlrollout.remote.stream import json_object, span_problems
from pytest_rlrollout.runs.plan import served
from pytest_rlrollout.suite.marks import clause, loads, requires, swaps
from pytest_rlrollout.suite.outcomes import inconclusive
from pytest_rlrollout.suite.testing import (
    CACHED_PREFIX,
    WHITELIST,
    InFlight,
    cached_and_a_visible_change,
    cached_continued,
    continued,
    in_transit,
    with_stream,
)

HOLD_READS = 4  # paused() reads while a pause is held (a fixed count: a replay asks as often)


def long_stream(rl_deployment, name: str, **more) -> dict:
    return {
        "prompt": rl_deployment.prompt(name, 16).body,
        "max_tokens": rl_deployment.long_stream_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "logprobs": True,
        **more,
    }


def ok(r, what: str) -> None:
    assert r.status_code == 200, f"{what}: HTTP {r.status_code} {r.text[:200]}"


def hold(rl_deployment) -> list[bool | None]:
    """Keep generation paused for `Timeouts.hold`, asking whether it is paused meanwhile."""
    seen = []
    for _ in range(HOLD_READS):
        time.sleep(rl_deployment.timeouts.hold / HOLD_READS)  # the window itself, not a wait for a condition
        seen.append(rl_deployment.paused())
    return seen


def froze(f: InFlight, paused: float, resumed: float) -> float:
    """When the stream went quiet during a pause held from `paused` to `resumed`: the last chunk
    to arrive in that window. Chunks arrive behind the engine (a loaded server sends what it
    generated late), so a pause shows as the stream falling silent for the rest of the window,
    not at once; inconclusive unless it was still sending afterwards (it was paused mid-way)."""
    if not f.arrivals or f.arrivals[-1] <= resumed:
        inconclusive("the stream had ended before the pause reached it; set a larger rl_long_stream_tokens")
    during = f.between(paused, resumed)
    return f.arrivals[during[-1]] if during else paused


class Arrival:
    """A request sent while generation is paused, from a thread of its own: answered only after the
    resume if the engine holds it."""

    def __init__(self, rl_deployment, name: str):
        self.dep, self.name, self.stream, self.answered = rl_deployment, name, None, None
        body = {"prompt": rl_deployment.prompt(name, 8).body, "max_tokens": 2, "stream": True}
        self.thread = threading.Thread(target=self._send, args=(body,), daemon=True)
        self.thread.start()

    def _send(self, body: dict) -> None:
        self.stream = self.dep.complete(body)
        self.answered = self.dep.mark(f"{self.name}-answered")

    def judged(self, mode: str, resumed: float) -> None:
        """Held, not refused, and answered after `resumed`; the refusal shown, with the engine's version."""
        self.thread.join(self.dep.timeouts.exchange)
        s, where = self.stream, f"a request sent while paused in {mode} mode"
        assert s is not None, f"{where} was never answered"
        refusal = next((c["error"] for c in s.chunks if isinstance(c.get("error"), dict)), None)
        version = self.dep.capabilities.version
        engine = f" (the deployment is {self.dep.capabilities.engine}: {version})" if version else ""
        assert s.status == 200 and refusal is None, (
            f"{where} was refused, not held: HTTP {s.status}, "
            + (f"an error event in the stream {refusal}" if refusal is not None else repr(s.body[:300]))
            + engine
        )
        assert self.answered >= resumed, f"{where} was answered before the resume"
        assert s.done and s.finish_reason in WHITELIST, f"{where} did not complete after the resume: {s!r}"


@swaps
@clause("CTL-PAUSE-1")
@requires("pause")
@loads()
def test_nothing_is_generated_while_paused_and_arrivals_are_held(rl_deployment, rl_observe):
    """While generation is paused no token is generated; requests that arrive are held, not refused, and complete after
    resume."""
    # A stream in flight generates nothing while paused (keep mode) and completes after; a request
    # arriving meanwhile is held and answered after the resume, in every mode (the rule knows no
    # mode: an engine that refuses arrivals in abort or wait mode, as vLLM 0.33 does, breaks it).
    marks: dict[str, float] = {}
    held: dict[str, object] = {}

    def act(f: InFlight) -> None:
        r = rl_deployment.pause("keep")
        marks["paused"] = rl_deployment.mark("paused")
        ok(r, "POST pause (keep)")
        late = Arrival(rl_deployment, "ctl-pause-1-held")
        try:
            held["arrival"] = late
            held["paused_reads"] = hold(rl_deployment)
        finally:
            marks["resume"] = rl_deployment.mark("resume")
            ok(rl_deployment.resume(), "POST resume")

    f, _ = with_stream(rl_deployment, long_stream(rl_deployment, "ctl-pause-1"), act)
    quiet = marks["resume"] - froze(f, marks["paused"], marks["resume"])
    held_for = marks["resume"] - marks["paused"]
    assert quiet >= held_for / 2, (
        f"the stream kept sending through a pause held {held_for:.2f} s: its last chunk before the resume came "
        f"{quiet:.3f} s before it ({len(f.between(marks['paused'], marks['resume']))} chunks during the pause)"
    )
    held["arrival"].judged("keep", marks["resume"])
    assert f.completed, f"the paused stream did not complete after the resume ({f.error!r})"
    modes = ["keep"]
    for mode in ("abort", "wait"):  # nothing in flight: what these modes do to an arrival alone
        try:
            ok(rl_deployment.pause(mode), f"POST pause ({mode})")
        except Unbound:  # a mode the engine does not have (SGLang: no wait mode)
            continue
        try:
            late = Arrival(rl_deployment, f"ctl-pause-1-held-{mode}")
            hold(rl_deployment)
        finally:
            resumed = rl_deployment.mark(f"resume-{mode}")
            ok(rl_deployment.resume(), "POST resume")
        late.judged(mode, resumed)
        modes.append(mode)
    rl_observe(1, f"stream paused {marks['resume'] - marks['paused']:.2f} s with no chunk generated, completed after")
    rl_observe(
        len(modes), f"requests sent while paused ({', '.join(modes)}), each held and answered 200 after the resume"
    )


@swaps
@clause("CTL-PAUSE-2")
@requires("pause", "logprobs")  # the partial output is counted by its logprobs entries
@loads()
def test_abort_ends_in_flight_requests_with_their_partial_output(rl_deployment, rl_observe):
    """Abort mode: every in-flight request ends promptly with its partial output, a terminal finish reason ('abort') and
    a well-formed end of stream; never a dropped connection or a 5xx."""
    marks: dict[str, float] = {}

    def act(f: InFlight) -> None:
        try:
            ok(rl_deployment.pause("abort"), "POST pause (abort)")
            marks["paused"] = rl_deployment.mark("paused")
        finally:
            ok(rl_deployment.resume(), "POST resume")

    f, _ = with_stream(rl_deployment, long_stream(rl_deployment, "ctl-pause-2"), act)
    s = f.stream
    assert f.error is None, f"the stream broke at the abort: {f.error!r}"
    assert s is not None and s.status == 200, f"HTTP {s.status if s else '?'}"
    n = len(f.entries)
    if n >= rl_deployment.long_stream_tokens:
        inconclusive("the stream had finished before the abort reached it; set a larger rl_long_stream_tokens")
    if s.finish_reason in WHITELIST and f.arrivals and f.arrivals[-1] < marks["paused"]:
        # a stream that stopped early (ignore_eos is an option a server may not honour) was over
        # before the pause: there was nothing in flight to abort
        inconclusive(
            f"the stream had ended ({s.finish_reason!r}, {n} of {rl_deployment.long_stream_tokens} tokens; "
            "ignore_eos not honoured?) before the abort reached it; set a larger rl_long_stream_tokens"
        )
    assert s.finish_reason == "abort", f"an aborted stream ended with finish_reason {s.finish_reason!r}"
    assert s.done, "an aborted stream did not end with data: [DONE]"
    assert n > 0, "the aborted stream returned none of the tokens it had generated"
    rl_observe(n, "tokens of a stream aborted by the pause, returned with finish_reason 'abort' and [DONE]")


@swaps
@clause("CTL-PAUSE-3")
@requires("pause", "policy_version", "logprobs")
@loads()
def test_keep_continues_in_flight_requests_under_their_versions(rl_deployment, rl_observe):
    """Keep (in-place) mode: in-flight requests keep the tokens they generated and continue after resume; the tokens
    before and after are attributed to their versions (VER-SPAN-1)."""
    old = rl_deployment.serving()
    label = rl_deployment.salted("ctl-pause-3")
    marks: dict[str, float] = {}

    def act(f: InFlight) -> int:
        try:
            ok(rl_deployment.pause("keep"), "POST pause (keep)")
            marks["paused"] = rl_deployment.mark("paused")
            before = len(f.entries)
            ok(rl_deployment.set_label(label), f"setting the label {label}")
            hold(rl_deployment)
            return before
        finally:
            marks["resume"] = rl_deployment.mark("resume")
            ok(rl_deployment.resume(), "POST resume")

    try:
        f, before = with_stream(rl_deployment, long_stream(rl_deployment, "ctl-pause-3"), act)
    finally:
        if old is not None:
            ok(rl_deployment.set_label(old), f"restoring the label {old}")
    held_for = marks["resume"] - marks["paused"]
    if marks["resume"] - froze(f, marks["paused"], marks["resume"]) < held_for / 2:
        inconclusive(
            f"the stream did not fall silent during a pause held {held_for:.2f} s: it had been generated "
            "before the pause reached it (see CTL-PAUSE-1); set a larger rl_long_stream_tokens"
        )
    assert f.completed, f"a stream paused in keep mode did not complete after the resume ({f.error!r})"
    s = f.stream
    n = len(f.entries)
    assert n == rl_deployment.long_stream_tokens, f"{n} tokens of {rl_deployment.long_stream_tokens} (restarted?)"
    assert s.finish_reason in WHITELIST, f"finish_reason {s.finish_reason!r}"
    spans = s.spans
    assert spans is not None, "the stream carried no policy-version spans"
    found = span_problems(spans, n)
    assert not found, f"spans {spans}: {'; '.join(found)}"
    named = [x["version"] for x in spans]
    assert named[0] == old and named[-1] == label and set(named) == {old, label}, (
        f"the spans name {named}; the stream began under {old} and was resumed under {label}"
    )
    boundary = spans[0]["end"]
    assert boundary >= before, f"the span of {old} ends at token {boundary}, yet {before} had arrived before the pause"
    rl_observe(n, f"tokens of a stream kept across a pause, {boundary} under {old} and {n - boundary} under {label}")


@swaps
@clause("CTL-PAUSE-4")
@requires("pause")
@loads()
def test_wait_returns_after_in_flight_requests_finished(rl_deployment, rl_observe):
    """Wait (drain) mode: the pause returns only after the in-flight requests finished with their normal finish reason."""
    marks: dict[str, float] = {}

    def act(f: InFlight) -> None:
        try:
            ok(rl_deployment.pause("wait"), "POST pause (wait)")
            marks["paused"] = rl_deployment.mark("paused")
        finally:
            ok(rl_deployment.resume(), "POST resume")

    body = long_stream(rl_deployment, "ctl-pause-4", max_tokens=max(8, rl_deployment.long_stream_tokens // 4))
    f, _ = with_stream(rl_deployment, body, act)
    assert f.completed, f"a stream drained by a pause in wait mode did not complete ({f.error!r})"
    assert f.stream.finish_reason in WHITELIST, f"a drained stream ended with {f.stream.finish_reason!r}"
    last = f.arrivals[-1] if f.arrivals else f.done_at
    assert last <= marks["paused"] + in_transit(
        f.arrivals, rl_deployment.timeouts.in_transit
    ), (  # the last chunk may still be on its way
        f"the pause (wait) answered {last - marks['paused']:.3f} s before the in-flight stream's last chunk"
    )
    rl_observe(1, f"pause (wait) answered after the in-flight stream ended {f.stream.finish_reason!r}")


@swaps
@clause("CTL-PAUSE-5")
@requires("pause")
@loads()
def test_pause_and_resume_are_idempotent_and_unknown_modes_refused(rl_deployment, rl_observe):
    """Pause and resume are idempotent; an unknown mode gets a 4xx and changes no state."""
    # an engine with no route that says whether it is paused (SGLang) is asked by a request: one
    # answered after the resumes and after the refusal shows generation runs (a paused engine holds it)
    says = rl_deployment.paused() is not None
    try:
        for i in (1, 2):
            ok(rl_deployment.pause("keep"), f"pause {i}")
            assert not says or rl_deployment.paused() is True, f"after pause {i}, the deployment says it is not paused"
    finally:
        for i in (1, 2):
            ok(rl_deployment.resume(), f"resume {i}")
    assert generates(rl_deployment, says), "after two resumes, the deployment says it is paused"
    r = rl_deployment.pause("sideways")
    try:
        assert 400 <= r.status_code < 500, f"pause with an unknown mode got HTTP {r.status_code} {r.text[:200]}"
        assert generates(rl_deployment, says), f"a refused pause (HTTP {r.status_code}) paused generation"
    finally:
        if r.status_code == 200:
            rl_deployment.resume()
    rl_observe(5, "pauses and resumes repeated without error, an unknown mode refused with no state change")


def generates(rl_deployment, says: bool) -> bool:
    """Whether generation runs: as the deployment says, or (`says` False) as a one-token
    completion shows by being answered (bounded by the request timeout)."""
    if says:
        return rl_deployment.paused() is False
    s = rl_deployment.complete({"prompt": rl_deployment.prompt("ctl-pause-5").body, "max_tokens": 1})
    return s.ok and bool(s.chunks)


def scored(rl_deployment, ids: list[int], isolation: str) -> list[float]:
    """The prompt's logprobs as the deployment scores it, under an isolation key of its own."""
    s = rl_deployment.complete({"prompt": ids, **ECHO}, headers={ISOLATION: isolation}).expect_ok()
    try:
        return prompt_logprobs(s, len(ids))
    except FingerprintError as e:
        inconclusive(f"the prompt's logprobs cannot be read: {e} (see FID-DECODE-1)")


@clause("CTL-LABEL-1")
@requires("logprobs", "echo", "token_id_prompts")
@loads(served(change="visible"))
def test_a_label_names_the_weights_it_was_published_for(rl_deployment, rl_swap, rl_observe):
    """A policy label is published only after the weights it names serve: a token attributed to label N is sampled from
    N's weights (checked by fingerprint under the label). Setting a label never ends in-flight requests unless the
    caller asked for that."""
    from pytest_rlrollout.numerics.scorer import local_scorer

    # the deployment's numbers against the local scorer's: NUM's tolerance (a bf16 engine needs more)
    factory, tol = rl_swap.factory, rl_deployment.options.numerics.logprob_tolerance
    try:
        change = factory.visible_change(rl_deployment.serving())
    except LookupError as e:
        inconclusive(f"no tensor to change visibly: {e}")
    built = rl_swap.build("ctl-label", change)
    result = rl_swap.to(built)
    ids = rl_deployment.token_ids("ctl-label", 32)
    served = scored(rl_deployment, ids, rl_deployment.salted("ctl-label-served"))  # at once, under the new label
    label = rl_deployment.serving()
    assert label == built.identity, f"after loading {built.identity} the deployment names {label}"
    numerics = rl_deployment.options.numerics
    local = local_scorer(factory.local_copy(built.identity), numerics.scorer, numerics.scorer_device)
    expected = [float(x) for x in local.score(ids).logprobs[1:]]
    d, i = largest_difference(served, expected)
    assert d <= tol, (
        f"tokens attributed to {label} are not sampled from its weights: the prompt scored under the label differs "
        f"from {built.identity}'s weights scored locally by max |Δlogprob| {d:.3g} at token {i + 1} > {tol:g}"
    )
    rl_observe(
        len(served),
        f"prompt tokens scored under {label} as its weights score them (max |Δ| {d:.2g}, "
        f"{local.name} scorer; load took {result.waited.seconds:.2f} s)",
    )


@swaps
@clause("CTL-LABEL-1")
@requires("policy_version")
@loads()
def test_setting_a_label_does_not_end_in_flight_requests(rl_deployment, rl_observe):
    """A policy label is published only after the weights it names serve: a token attributed to label N is sampled from
    N's weights (checked by fingerprint under the label). Setting a label never ends in-flight requests unless the
    caller asked for that."""
    old = rl_deployment.serving()
    label = rl_deployment.salted("ctl-label-inflight")

    def act(f: InFlight) -> None:
        ok(rl_deployment.set_label(label), f"setting the label {label}")

    try:
        f, _ = with_stream(rl_deployment, long_stream(rl_deployment, "ctl-label-inflight"), act)
    finally:
        if old is not None:
            ok(rl_deployment.set_label(old), f"restoring the label {old}")
    assert f.error is None, f"the stream broke when the label was set: {f.error!r}"
    assert f.completed, f"the stream did not complete (HTTP {f.stream.status if f.stream else '?'})"
    assert f.stream.finish_reason in WHITELIST, (
        f"setting a label ended an in-flight stream with finish_reason {f.stream.finish_reason!r}"
    )
    rl_observe(
        len(f.entries), f"tokens of a stream that went on across a label change, ended {f.stream.finish_reason!r}"
    )


@clause("CTL-CACHE-1")
@requires("cache_reset", "logprobs", "token_id_prompts", "cached_tokens")
@loads(served(change="visible-kv"))
def test_a_reset_that_reports_success_leaves_nothing_to_reuse(rl_deployment, rl_swap, rl_observe):
    """A prompt-cache reset that reports success leaves nothing computed before it to be reused: a prefix cached before
    it scores, after it, like the same prefix under an unused isolation key (by numbers, whatever the counters say).
    A reset that could not happen says so; it never reports success."""
    # Judged on every replica (a fleet's engines each reset their own cache): a prompt cached on
    # each before the swap, under a session that reaches it.
    tol = rl_deployment.options.numerics.fingerprint_tolerance
    ids = rl_deployment.token_ids("ctl-cache", CACHED_PREFIX)
    places = rl_deployment.sessions_per_replica("ctl-cache")
    keys = {
        replica: {ISOLATION: rl_deployment.salted(f"ctl-cache-{n}"), **session}
        for n, (replica, session) in enumerate(sorted(places.items()))
    }
    first = next(iter(sorted(keys)))
    old, change = cached_and_a_visible_change(rl_deployment, rl_swap, ids, keys[first], "the reset")
    olds = {first: old} | {
        r: cached_continued(rl_deployment, ids, k, "the reset") for r, k in keys.items() if r != first
    }
    rl_swap("ctl-cache", change=change, reset_prompt_cache="none")  # new weights; the cache kept
    r = rl_deployment.reset_cache()
    said = (json_object(r) or {}).get("success")
    if r.status_code != 200 or said is False:
        inconclusive(f"the reset said it did not happen (HTTP {r.status_code} {r.text[:200]}): no success to judge")
    for n, (replica, key) in enumerate(sorted(keys.items())):
        repeated = continued(rl_deployment, ids, key)
        fresh = continued(rl_deployment, ids, {**key, ISOLATION: rl_deployment.salted(f"ctl-cache-fresh-{n}")})
        moved, _ = olds[replica].difference(fresh)
        if moved <= tol:
            inconclusive(
                f"the new weights did not change the prompt's continuation on {replica} (max |Δ| "
                f"{moved:.2g}): stale KV would not show"
            )
        d, where = repeated.difference(fresh)
        assert d <= tol, (
            f"{replica}: after a prompt-cache reset that reported success (HTTP {r.status_code} {r.text[:80]}), a "
            f"prompt cached before it continues unlike the same prompt under an unused isolation key: {where} > "
            f"{tol:g} (the deployment reported {repeated.cached} cached tokens)"
        )
    rl_observe(
        len(keys) * len(repeated.logprobs),
        f"tokens continuing a prompt cached before a reset scored as "
        f"uncached after it, on {len(keys)} replica(s) (the last: max |Δ| {d:.2g}; the new weights moved them "
        f"{moved:.2g})",
    )
