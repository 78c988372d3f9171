"""What the conformance tests observe around an action: a stream kept in flight while the test
acts (`with_stream`), how late its chunks may still be on their way (`in_transit`), the
continuation of a prompt (`continued`, `cached_continued`), and whether a load a test relies on
completed (`expect_loaded`). A stream across a swap is `suite.crossing`'s; requests sent while a
swap is under way, `suite.probing`'s."""

from __future__ import annotations

import contextlib
import functools
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, TypeVar

from pytest_rlrollout.remote.fingerprint import Continuation, FingerprintError, continuation
from pytest_rlrollout.remote.replicas import WaitEnd
from pytest_rlrollout.remote.stream import CONTRACT_READING, Reading, Stream
from pytest_rlrollout.suite.outcomes import inconclusive

if TYPE_CHECKING:
    from pytest_rlrollout.suite.deployment import RLDeployment
    from pytest_rlrollout.suite.evidence import Timeline
    from pytest_rlrollout.suite.swaps import Swapper, SwapResult

T = TypeVar("T")

WHITELIST = ("stop", "length", "tool_calls")
IN_TRANSIT_CHUNKS = 3  # chunk gaps a chunk may lag behind the engine


def in_transit(arrivals: Sequence[float], least: float) -> float:
    """How long after an event (a pause answered, a swap served) a chunk of a stream whose chunks
    came at `arrivals` may still have been generated before it: a few of its median gaps, at least
    `least` seconds (`Timeouts.in_transit`: chunks arrive behind the engine)."""
    gaps = [b - a for a, b in pairwise(arrivals)]
    return max(least, IN_TRANSIT_CHUNKS * statistics.median(gaps)) if gaps else least


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
    """A stream started before an action (a pause, a label, a cache reset, a swap), and when things happened."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    stream: Stream | None = None
    error: BaseException | None = None
    done_at: float = 0.0
    reading: Reading = CONTRACT_READING

    @property
    def entries(self) -> list[dict[str, Any]]:
        """The logprobs entries of the chunks that arrived."""
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
    into: InFlight,
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
