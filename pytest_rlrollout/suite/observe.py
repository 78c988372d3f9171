"""What the conformance tests observe around a swap: a stream crossing it, and probes sent while
it is under way. Both draw the test's timeline (`rl_observe.timeline`) for the report."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, TypeVar

from pytest_rlrollout.remote.fingerprint import Continuation, FingerprintError, continuation
from pytest_rlrollout.remote.polling import ticks
from pytest_rlrollout.remote.replicas import WaitEnd, loading_state
from pytest_rlrollout.remote.stream import CONTRACT_READING, Reading, Stream
from pytest_rlrollout.suite.outcomes import inconclusive

if TYPE_CHECKING:
    import httpx

    from pytest_rlrollout.suite.deployment import RLDeployment
    from pytest_rlrollout.suite.evidence import Observed, Timeline
    from pytest_rlrollout.suite.swaps import Swapper, SwapResult

T = TypeVar("T")

WHITELIST = ("stop", "length", "tool_calls")
# A chunk arriving this soon after every replica reported the new snapshot may have been
# generated before (it was on its way): at least this many seconds, or a few chunk intervals.
IN_TRANSIT = 0.05
IN_TRANSIT_CHUNKS = 3


def in_transit(arrivals: Sequence[float]) -> float:
    """How long after an event (a pause answered, a swap served) a chunk of a stream whose chunks
    came at `arrivals` may still have been generated before it: a few of its median gaps, at least
    IN_TRANSIT seconds (chunks arrive behind the engine)."""
    gaps = [b - a for a, b in pairwise(arrivals)]
    return max(IN_TRANSIT, IN_TRANSIT_CHUNKS * statistics.median(gaps)) if gaps else IN_TRANSIT


def in_swap(replica: dict[str, Any], identity: str) -> bool:
    """The replica is between the old and the new snapshot."""
    state = loading_state(replica)
    return state.get("target_snapshot_identity") == identity and (
        state.get("stage") == "swapping" or not replica.get("readiness")
    )


@dataclass
class Crossing:
    """A stream started before a swap was signalled, and what was seen of both."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    stream: Stream | None = None  # when the request returned normally
    error: BaseException | None = None
    t_signal: float = 0.0
    t_posted: float = 0.0
    t_served: float = 0.0
    done_at: float = 0.0
    old: str | None = None
    new: str = ""
    response: httpx.Response | None = None
    result: SwapResult | None = None
    reading: Reading = CONTRACT_READING  # the engine's: where its chunks say their version
    # the latest moment this stream was known in flight while no replica served the new snapshot
    # yet: the signal, or a status poll showing none did sent after its first chunk (None: none)
    t_before: float | None = None
    started: int = 0  # which of the streams `across_swap` kept in flight this is (0: the one before the signal)
    probing: Probing | None = None  # requests sent while the swap was under way, where asked for

    @property
    def versions(self) -> list[str | None]:
        """The policy version of each chunk that arrived (an engine that says them once, at the
        end of the stream, has them only once it ended)."""
        return self.reading.versions(self.chunks)

    @property
    def entries(self) -> list[dict[str, Any]]:
        """The logprobs entries of the chunks that arrived."""
        return self.reading.entries(self.chunks)

    @property
    def served(self) -> bool:
        """The swap completed: every replica served the new snapshot at `t_served`."""
        return self.result is not None and self.result.waited is not None and self.result.waited.ok

    @property
    def completed(self) -> bool:
        s = self.stream
        return self.error is None and s is not None and s.status == 200 and s.done

    @property
    def in_flight_at_signal(self) -> bool:
        return bool(self.arrivals) and self.arrivals[0] < self.t_signal and self.done_at > self.t_posted

    @property
    def crossed(self) -> bool:
        """Evidence that the swap happened while the stream was being generated: tokens of both
        versions in it (however late they arrived), or, for a stream that was sending while no
        replica served the new snapshot yet (`t_before`), chunks of the new version, a stream
        still running once every replica served it, or a stream that broke after the signal."""
        if self.old in self.versions and self.new in self.versions:
            return True
        if self.t_before is None or self.done_at <= max(self.t_before, self.t_posted):
            return False
        return self.new in self.versions or self.done_at > self.t_served or not self.completed

    @property
    def in_transit(self) -> float:
        """How long after `t_served` a chunk may still have been generated before it."""
        return in_transit(self.arrivals)

    def after_served(self) -> list[int]:
        """Indices of the chunks generated after every replica served the new snapshot."""
        if not self.served:
            return []
        since = self.t_served + self.in_transit
        return [i for i, t in enumerate(self.arrivals) if t > since]

    def before_swap(self) -> list[int]:
        """Indices of the chunks that arrived while no replica served the new snapshot yet (before
        `t_before`): generated on the old one."""
        t = self.t_signal if self.t_before is None else self.t_before
        return [i for i, at in enumerate(self.arrivals) if at < t]

    def tokens_before_swap(self) -> int:
        """How many output tokens had arrived while no replica served the new snapshot yet."""
        return sum(len(self.reading.entries([self.chunks[i]])) for i in self.before_swap())


@dataclass(frozen=True)
class Parting:
    """Where a stream's numbers leave those of the same greedy request under the old weights."""

    token: int | None  # the first token scored unlike them (None: every compared token alike)
    delta: float  # its |Δlogprob|
    compared: int  # tokens compared (up to the first that differs, in id or in number)


def parting(old: list[dict[str, Any]], crossed: list[dict[str, Any]], tolerance: float) -> Parting:
    """The first token of `crossed` whose logprob differs from the same greedy request's under the
    old weights (`old`) by more than `tolerance`: it was generated by other weights than the old.
    The comparison stops at the first token whose id differs (a near tie may have gone the other
    way; the prefixes differ after it), or that carries no logprob."""
    for i, (a, b) in enumerate(zip(old, crossed, strict=False)):
        la, lb = a.get("logprob"), b.get("logprob")
        if a.get("token_id") != b.get("token_id") or not isinstance(la, int | float) or not isinstance(lb, int | float):
            return Parting(None, 0.0, i)
        if abs(la - lb) > tolerance:
            return Parting(i, abs(la - lb), i + 1)
    return Parting(None, 0.0, min(len(old), len(crossed)))


# The suite's bounds on time: a stream they cut was slow, which no clause judged here forbids
TIME_BOUNDS = ("Limits.exchange", "the test's deadline", "the swap timeout")


def not_cut_by_the_suite(error: BaseException | None, tokens: int, asked: int | None) -> None:
    """Inconclusive when a stream ended because one of the suite's own time bounds cut it while it
    was still within the tokens it was asked for: slow is not wrong, and a bound of the suite's is
    never the deployment's fail. (One that sent more than asked fails by the events bound.)"""
    from pytest_rlrollout.remote.limits import LimitExceeded

    if not isinstance(error, LimitExceeded) or not error.bound.startswith(TIME_BOUNDS):
        return
    if asked is None or tokens <= asked:
        inconclusive(
            f"the stream was cut by the suite's own bound after {tokens} of {asked or 'its'} tokens "
            f"({error}); raise rl_exchange_timeout or rl_test_timeout, or lower rl_long_stream_tokens"
        )


def observed(fn: Callable[..., T]) -> Callable[..., T]:
    """Run `fn(rl_deployment, ...)` at a pace at which a swap in progress can be observed."""

    @functools.wraps(fn)
    def at_observable_pace(rl_deployment: RLDeployment, *args: Any, **kwargs: Any) -> T:
        with rl_deployment.observable_swaps():
            return fn(rl_deployment, *args, **kwargs)

    return at_observable_pace


def watch(rl_deployment: RLDeployment, timeline: Timeline) -> Callable[[list[dict[str, Any]]], None]:
    """A status-poll callback that draws each replica's state changes on the timeline."""
    return lambda replicas: timeline.status(rl_deployment.mark("status"), replicas)


MAX_STREAMS = 500  # streams one crossing keeps in flight, at most (a swap that outlasts them is inconclusive)
RELAY_AT = 0.75  # the next stream starts once this share of the current one's tokens arrived


class Relay:
    """Streams of one body kept in flight, one after another, while a swap is under way: the
    next starts once `RELAY_AT` of the current one's tokens arrived (or it ended), until the
    relay is closed. Whenever the deployment gets to the swap, a stream is in flight there,
    however long it takes to get there, and no stream has to be sized to outlast the swap.
    Whether one more stream starts is the live clock's decision: a recording keeps it, and a
    replay starts the streams the recording started."""

    def __init__(
        self,
        rl_deployment: RLDeployment,
        body: dict[str, Any],
        headers: dict[str, str] | None,
        on_arrival: Callable[[float, dict[str, Any]], None],
        hold: float | None,
    ) -> None:
        self.dep, self.body, self.headers, self.on_arrival, self.hold = rl_deployment, body, headers, on_arrival, hold
        self.streams: list[Crossing] = []
        self.threads: list[threading.Thread] = []
        self.open = False  # whether a stream that reaches its relay point starts the next one
        self.relayed_at = max(1, int(RELAY_AT * int(body.get("max_tokens") or 1)))

    def start(self, wait: bool = True) -> Crossing:
        """Start the next stream (`wait`: return once its first chunk arrived)."""
        k = len(self.streams)
        c = Crossing(reading=self.dep.driver.reading, started=k)
        self.streams.append(c)
        passed = threading.Event()

        def arrived(t: float, chunk: dict[str, Any]) -> None:
            self.on_arrival(t, chunk)
            if len(c.chunks) >= self.relayed_at:
                self._next(k, passed)

        self.threads.append(
            stream_in_background(
                self.dep,
                c,
                self.body,
                self.headers,
                on_arrival=arrived,
                on_end=lambda: self._next(k, passed),
                suffix=f"-{k}" if k else "",
                wait=wait,
                hold=self.hold,
            )
        )
        return c

    def _next(self, k: int, passed: threading.Event) -> None:
        if passed.is_set():
            return
        passed.set()
        if self.dep.decide(f"relay-{k + 1}", self.open and k + 1 < MAX_STREAMS):
            self.dep.mark(f"relay-{k + 1}-started")
            self.start(wait=False)

    def join(self, timeout: float) -> None:
        """Wait for every stream to end (each within `timeout`), the ones started meanwhile too."""
        done = 0
        while done < len(self.threads):
            self.threads[done].join(timeout=timeout)
            done += 1


def crossing_body(rl_deployment: RLDeployment, name: str) -> dict[str, Any]:
    """The request a stream across a swap sends: a greedy stream of `long_stream_tokens`, with its
    usage (which counts what was generated: a stream restarted by the swap shows)."""
    return {
        "prompt": rl_deployment.prompt(name, 40).body,
        "max_tokens": rl_deployment.long_stream_tokens,
        "temperature": 0,
        "logprobs": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }


@observed
def across_swap(
    rl_deployment: RLDeployment,
    rl_swap: Swapper,
    rl_observe: Observed,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    change: dict[str, Any] | None = None,
    probes: int = 0,
    **signal: Any,
) -> Crossing:
    """Stream `body`; once its first chunk arrives, signal a new snapshot (the next step, with
    `change` on it) and wait for it; the stream that crossed the swap is returned.

    Where the engine's load holds the streams in flight (`Driver.holds_streams`) that stream
    is the one begun before the signal, allowed to fall silent for the swap's time. Where the
    deployment swaps when it gets to it (ASYNC), streams are kept in flight (`Relay`) until the
    status shows every replica serving the new snapshot: one of them is on the swap however long
    the download before it takes. The one returned is a stream that crossed it (one that broke,
    if any did), else the first. With `probes`, that many one-token requests go out while the
    swap is under way as well (`Probes`; the crossing's `probing`)."""
    timeline = rl_observe.swap("a stream across a swap")
    old = rl_deployment.serving()
    built = rl_swap.build("cross", change)
    timeline.old, timeline.new = old, built.identity
    reading = rl_deployment.driver.reading

    def drawn(t: float, chunk: dict[str, Any]) -> None:  # on the timeline as it arrives
        timeline.chunks.append((t, reading.versions([chunk])[0]))

    held = rl_deployment.driver.holds_streams
    relay = Relay(rl_deployment, body, headers, drawn, hold=rl_deployment.swap_timeout if held else None)
    probing = Probes(rl_deployment, timeline, built.identity, probes) if probes else None
    # Open from the signal on: a deployment may take seconds to answer the signal (it checks the
    # snapshot first) and start swapping meanwhile, and a stream that reached its relay point
    # then must already hand over to the next one.
    relay.open = not held and rl_deployment.capabilities.transition == "ASYNC"
    relay.start()
    t_signal = rl_deployment.mark("signal")
    response = rl_swap.post(built, midway=probing.midway if probing else None, **signal)
    t_posted = rl_deployment.mark("posted")
    relay.open = relay.open and response.status_code == 200
    # (when each poll's answer was seen, whether it showed no replica serving the new snapshot)
    polls: list[tuple[float, bool]] = []

    def progress(replicas: list[dict[str, Any]]) -> None:
        t = rl_deployment.mark("status")
        timeline.status(t, replicas)
        polls.append((t, not any(x.get("current_snapshot_identity") == built.identity for x in replicas)))
        if probing is not None:
            probing.progress(replicas, t)

    result = rl_swap.follow(built, response, progress=progress)
    relay.open = False
    t_served = rl_deployment.mark("served")
    timeline.mark(t_signal, "signal")
    timeline.mark(t_posted, f"answered {response.status_code}")
    timeline.mark(t_served, "served" if result.waited is not None and result.waited.ok else "gave up")
    relay.join(timeout=rl_deployment.swap_timeout + rl_deployment.timeouts.exchange + 60)
    probed = probing.finish(built) if probing is not None else None
    # A poll is sent after the previous one's answer was seen (the first after the signal was
    # answered): a stream whose first chunk came before that was in flight when the poll's status
    # was read, and the poll says whether a replica had swapped by then.
    sent_after = [t_posted] + [t for t, _ in polls[:-1]]
    not_yet = [t_signal] + [t for t, (_, none_new) in zip(sent_after, polls, strict=True) if none_new]
    for c in relay.streams:
        c.old, c.new, c.response, c.result = old, built.identity, response, result
        c.t_signal, c.t_posted, c.t_served, c.probing = t_signal, t_posted, t_served, probed
        c.t_before = max((t for t in not_yet if c.arrivals and c.arrivals[0] < t), default=None)
    for c in relay.streams:
        timeline.mark(c.done_at, f"stream {c.started} ended" if c.started else "stream ended")
    crossed = [c for c in relay.streams if c.crossed]
    timeline.chunks[:] = sorted(  # versions said at the end, too
        (t, v) for c in relay.streams for t, v in zip(c.arrivals, c.versions, strict=False)
    )
    return next((c for c in crossed if not c.completed), crossed[0] if crossed else relay.streams[0])


@dataclass
class Probe:
    status: int
    sent: float
    answered: float
    version: str | None
    session: dict[str, str]  # the probe's session headers
    all_in_swap: bool  # every replica was in the swap when the probe was sent
    any_in_swap: bool

    @property
    def seconds(self) -> float:
        return self.answered - self.sent


@dataclass
class Probing:
    """Requests sent while a swap was under way, and how long the status kept showing it."""

    built: Any  # the snapshot swapped in
    probes: list[Probe]
    in_swap_until: float = 0.0  # the last status poll that still showed the swap (as the probes were sent)
    round_trip: float = 0.0  # the fastest status poll: how stale a poll's view may be
    result: SwapResult | None = None  # how the swap ended


class Probes:
    """`n` one-token requests (distinct sessions) sent at once while a swap is under way, and
    where they were sent from: in the middle of a swap this side sequences (`midway`, which goes
    on once every probe's answer has begun, at most `Timeouts.hold`: a probe whose answer began
    then reached the deployment during the swap), else once a status poll (`progress`) shows the
    swap on `every` replica at once, or on any. No probes when no poll landed inside the swap."""

    def __init__(
        self,
        rl_deployment: RLDeployment,
        timeline: Timeline,
        identity: str,
        n: int = 6,
        headers: dict[str, str] | None = None,
        every: bool = False,
    ) -> None:
        self.dep, self.timeline, self.identity, self.n = rl_deployment, timeline, identity, n
        self.headers, self.every = headers or {}, every
        self.out = Probing(None, [])
        self.sent: list[Probe | None] = [None] * n  # where they were sent from is set once the swap ended
        self.began = [threading.Event() for _ in range(n)]
        self.began_at = [float("inf")] * n  # when each probe's answer began (held midway)
        self.threads: list[threading.Thread] = []
        self.held = False
        self.all_in = self.any_in = False  # what the poll that sent them showed
        self.body = {"prompt": rl_deployment.prompt("probe", 3).body, "max_tokens": 1, "stream": True}

    def showing(self, replicas: list[dict[str, Any]]) -> bool:
        states = [in_swap(x, self.identity) for x in replicas]
        return bool(states) and (all(states) if self.every else any(states))

    def progress(self, replicas: list[dict[str, Any]], t: float) -> None:
        """One status poll (seen at `t`): the swap still shown, or the probes sent when first shown."""
        if not self.showing(replicas):
            return
        self.out.in_swap_until = t
        if not self.threads:
            states = [in_swap(x, self.identity) for x in replicas]
            self.all_in, self.any_in = all(states), any(states)
            self.launch()

    def midway(self) -> None:  # the swap is under way until this returns
        self.held = True
        self.launch()
        until = time.monotonic() + self.dep.timeouts.hold  # one bound for all the probes
        for event in self.began:
            event.wait(timeout=max(0.0, until - time.monotonic()))
        self.out.in_swap_until = self.dep.mark("midway")
        self.timeline.mark(self.out.in_swap_until, "swap held midway")

    def launch(self) -> None:
        self.threads.extend(threading.Thread(target=self._one, args=(i,), daemon=True) for i in range(self.n))
        for th in self.threads:
            th.start()

    def _one(self, i: int) -> None:
        def beginning(_: int) -> None:
            if self.held:  # (a time asked for only where it is used: a replay has the recording's times only)
                self.began_at[i] = self.dep.mark(f"probe-{i}-began")
            self.began[i].set()

        session = self.dep.session(f"probe-{self.identity}-{i}")
        t = self.dep.mark(f"probe-{i}-sent")
        try:
            s = self.dep.complete(self.body, headers={**session, **self.headers}, on_status=beginning)
        finally:
            self.began[i].set()
        answered = self.dep.mark(f"probe-{i}-answered")
        self.sent[i] = Probe(s.status, t, answered, s.versions[0] if s.chunks else None, session, False, False)
        self.timeline.probes.append((t, answered, s.status))

    def finish(self, built: Any) -> Probing:
        """Once the swap ended: every probe answered, each with where it was sent from."""
        for th in self.threads:
            th.join(timeout=self.dep.swap_timeout + 60)
        self.out.built, self.out.probes = built, [p for p in self.sent if p is not None]
        for i, p in enumerate(self.sent):
            if p is not None:  # held midway: in the swap when its answer began before the swap went on
                in_it = self.began_at[i] <= self.out.in_swap_until
                p.all_in_swap, p.any_in_swap = (in_it, in_it) if self.held else (self.all_in, self.any_in)
        return self.out


@observed
def probes_during_swap(
    rl_deployment: RLDeployment,
    rl_swap: Swapper,
    rl_observe: Observed,
    n: int = 6,
    headers: dict[str, str] | None = None,
    every: bool = False,
    change: dict[str, Any] | None = None,
    **signal: Any,
) -> Probing:
    """Signal a new snapshot (the next step, with `change` on it) and, while it is being swapped in, send `n` one-token requests at
    once (`Probes`); then follow the swap to its end. Where this side does not sequence the swap,
    the status is polled for it, no faster than the probe interval."""
    timeline = rl_observe.swap("requests sent while a swap is under way")
    timeline.old = rl_deployment.serving()
    built = rl_swap.build("probe", change)
    timeline.new = built.identity
    probes = Probes(rl_deployment, timeline, built.identity, n, headers, every)

    def progress(replicas: list[dict[str, Any]]) -> None:
        t = rl_deployment.mark("status")
        timeline.status(t, replicas)
        probes.progress(replicas, t)

    timeline.mark(rl_deployment.mark("signal"), "signal")
    r = rl_swap.post(built, midway=probes.midway, **signal)
    timeline.mark(rl_deployment.mark("posted"), f"answered {r.status_code}")
    assert r.status_code == 200, f"the swap could not be signalled: {r.status_code} {r.text[:200]}"
    round_trip = float("inf")
    if not probes.held:
        for _ in ticks(rl_deployment.swap_timeout, rl_deployment.timeouts.probe):
            asked = rl_deployment.mark("poll")
            replicas = rl_deployment.replicas()
            # the poll's own round trip, taken before `progress` starts the probes' threads
            round_trip = min(round_trip, rl_deployment.mark("poll-answered") - asked)
            progress(replicas)
            if probes.threads:
                break
            if replicas and all(x.get("current_snapshot_identity") == built.identity for x in replicas):
                result = rl_swap.follow(built, r, progress=progress)
                return dataclasses.replace(probes.finish(built), round_trip=round_trip, result=result)
    result = rl_swap.follow(built, r, progress=progress)  # polls the status while the probes wait
    out = probes.finish(built)
    timeline.mark(rl_deployment.mark("served"), "served" if result.waited and result.waited.ok else "gave up")
    return dataclasses.replace(out, round_trip=0.0 if probes.held else round_trip, result=result)


def expect_loaded(result: SwapResult, *, own: bool = False) -> None:
    """The swap a test relies on was accepted and rolled out. A status the suite cannot read
    (HL-GET-1) or, unless the test is about rollouts (`own`), a rollout that stopped part-way
    (HL-GET-2) leaves the test inconclusive instead of failing it."""
    r, w = result.response, result.waited
    # the whole answer (a gateway's names each engine's), as far as a report shows one
    assert r.status_code == 200, f"the signal for {result.built.identity} got {r.status_code}: {r.text[:3000]}"
    assert w is not None
    if w.ok:
        return
    if w.end is WaitEnd.UNREADABLE:
        inconclusive(f"the status cannot be read, so the load cannot be followed: {w.error}")
    if not own and w.end is WaitEnd.STALLED:
        inconclusive(f"{w.error} (see HL-GET-2)")
    raise AssertionError(f"{result.built.identity} was not served on every replica: {w.error}; {w.replicas}")


@dataclass
class InFlight:
    """A stream started before an action (a pause, a label, a cache reset), and when things happened."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    stream: Stream | None = None
    error: BaseException | None = None
    done_at: float = 0.0
    reading: Reading = CONTRACT_READING

    @property
    def entries(self) -> list[dict[str, Any]]:
        return self.reading.entries(self.chunks)

    @property
    def completed(self) -> bool:
        """Answered 200 and ended with data: [DONE], the transport intact."""
        s = self.stream
        return self.error is None and s is not None and s.status == 200 and s.done

    def between(self, start: float, end: float) -> list[int]:
        """Indices of the chunks that arrived in [start, end]."""
        return [i for i, t in enumerate(self.arrivals) if start <= t <= end]


def stream_in_background(
    rl_deployment: RLDeployment,
    into: Crossing | InFlight,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    on_arrival: Callable[[float, dict[str, Any]], None] | None = None,
    *,
    on_end: Callable[[], None] | None = None,
    suffix: str = "",
    wait: bool = True,
    hold: float | None = None,
) -> threading.Thread:
    """Stream `body` on a thread of its own into `into` (the chunks and when each arrived, the
    stream or the error that ended it, when it ended; `on_end` is called then); return the thread
    once the first chunk arrived or the stream ended (at once unless `wait`). Its marks are
    named with `suffix` (one per stream of a relay). With `hold`, the stream may be held silent
    that many seconds (`DeploymentClient.held`)."""
    first = threading.Event()

    def seen(chunk: dict[str, Any]) -> None:
        into.chunks.append(chunk)
        into.arrivals.append(t := rl_deployment.mark(f"chunk{suffix}"))
        if on_arrival is not None:
            on_arrival(t, chunk)
        first.set()

    def run() -> None:
        try:
            with contextlib.ExitStack() as stack:
                if hold is not None:
                    stack.enter_context(rl_deployment.client.held(hold))
                into.stream = rl_deployment.complete({**body, "stream": True}, headers=headers, on_chunk=seen)
        except BaseException as e:  # a dropped connection is an observation, not a crash
            into.error = e
        finally:
            into.done_at = rl_deployment.mark(f"done{suffix}")
            first.set()
            if on_end is not None:
                on_end()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if wait:
        first.wait(timeout=rl_deployment.timeouts.request)
    return thread


@observed
def with_stream(
    rl_deployment: RLDeployment, body: dict[str, Any], action: Callable[[InFlight], T]
) -> tuple[InFlight, T]:
    """Stream `body`; once its first chunk arrived, run `action` (with the stream so far), then
    wait for the stream to end. The stream's chunks keep arriving while the action runs."""
    f = InFlight(reading=rl_deployment.driver.reading)
    thread = stream_in_background(rl_deployment, f, body)
    try:
        result = action(f)
    finally:
        thread.join(timeout=rl_deployment.timeouts.exchange + 60)
    return f, result


def continued(rl_deployment: RLDeployment, ids: list[int], headers: dict[str, str]) -> Continuation:
    """The deployment's continuation of `ids`; inconclusive when it cannot be read."""
    try:
        return continuation(rl_deployment.driver, ids, headers)
    except FingerprintError as e:
        inconclusive(f"the prompt's continuation cannot be read: {e} (see INF-LOGPROBS-1)")


def cached_and_a_visible_change(
    rl_deployment: RLDeployment, rl_swap: Swapper, ids: list[int], headers: dict[str, str], before: str
) -> tuple[Continuation, dict[str, Any]]:
    """The continuation of `ids` served from the prompt cache (`cached_continued`), and a change
    to the served snapshot that moves it (through the KV); inconclusive when there is none."""
    old = cached_continued(rl_deployment, ids, headers, before)
    try:
        return old, rl_swap.factory.visible_change(rl_deployment.serving(), kv=True)
    except LookupError as e:
        inconclusive(f"no tensor to change visibly: {e}")


def cached_continued(rl_deployment: RLDeployment, ids: list[int], headers: dict[str, str], before: str) -> Continuation:
    """The continuation of `ids` served from the prompt cache (asked twice); inconclusive when it
    was not (`before`: what the cache must have been filled before, for the message)."""
    continued(rl_deployment, ids, headers)
    old = continued(rl_deployment, ids, headers)
    if old.cached == 0:
        inconclusive(f"the prompt was not served from the prompt cache before {before} (see CACHE-HIT-1)")
    return old
