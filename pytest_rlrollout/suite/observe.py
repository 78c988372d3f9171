"""What the conformance tests observe around a swap: a stream crossing it, probes sent while it
is under way, and prompts no other test sends."""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pytest_rlrollout.remote.polling import ticks
from pytest_rlrollout.remote.stream import policy_versions
from pytest_rlrollout.suite.outcomes import inconclusive

T = TypeVar("T")


def unique_prompt(name: str, n: int = 80, vocab: int = 500) -> list[int]:
    """A prompt no other test sends (tests share one deployment and its prompt cache)."""
    seed = hashlib.sha256(name.encode()).digest()
    return [(seed[i % 32] * 7 + i * 13) % (vocab - 20) + 10 for i in range(n)]


WHITELIST = ("stop", "length", "tool_calls")


def in_swap(replica: dict, identity: str) -> bool:
    """The replica is between the old and the new snapshot."""
    state = replica.get("loading_state") or {}
    return state.get("target_snapshot_identity") == identity and (
        state.get("stage") == "swapping" or not replica.get("readiness")
    )


@dataclass
class Crossing:
    """A stream started before a swap was signalled, and what was seen of both."""

    chunks: list = field(default_factory=list)
    arrivals: list = field(default_factory=list)
    stream: object = None  # client.Stream when the request returned normally
    error: BaseException | None = None
    t_signal: float = 0.0
    t_posted: float = 0.0
    t_served: float = 0.0
    done_at: float = 0.0
    old: str | None = None
    new: str = ""
    response: object = None
    waited: object = None

    @property
    def versions(self) -> list:
        return policy_versions(self.chunks)

    @property
    def completed(self) -> bool:
        s = self.stream
        return self.error is None and s is not None and s.status == 200 and s.done

    @property
    def in_flight_at_signal(self) -> bool:
        return bool(self.arrivals) and self.arrivals[0] < self.t_signal and self.done_at > self.t_posted

    @property
    def crossed(self) -> bool:
        """Evidence that the swap happened while the stream was being generated: chunks of the
        new version, a stream still running once every replica served the new snapshot, or a
        stream that broke after the signal."""
        if not self.in_flight_at_signal:
            return False
        return self.new in self.versions or self.done_at > self.t_served or not self.completed


def observed(fn: Callable[..., T]) -> Callable[..., T]:
    """Run `fn(rl_deployment, ...)` at a pace at which a swap in progress can be observed."""

    @functools.wraps(fn)
    def at_observable_pace(rl_deployment, *args, **kwargs):
        with rl_deployment.observable_swaps():
            return fn(rl_deployment, *args, **kwargs)

    return at_observable_pace


@observed
def across_swap(rl_deployment, rl_swap, body: dict, headers: dict | None = None, **signal) -> Crossing:
    """Stream `body`; once its first chunk arrives, signal a new snapshot and wait for it."""
    c = Crossing(old=rl_deployment.serving())
    built = rl_swap.build("cross")
    c.new = built.identity
    first = threading.Event()

    def seen(chunk):
        c.chunks.append(chunk)
        c.arrivals.append(rl_deployment.mark("chunk"))
        first.set()

    def run():
        try:
            c.stream = rl_deployment.complete({**body, "stream": True}, headers=headers, on_chunk=seen)
        except BaseException as e:  # a dropped connection is an observation, not a crash
            c.error = e
        finally:
            c.done_at = rl_deployment.mark("done")
            first.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    first.wait(timeout=rl_deployment.timeouts.request)
    c.t_signal = rl_deployment.mark("signal")
    c.response = rl_swap.post(built, **signal)
    c.t_posted = rl_deployment.mark("posted")
    c.waited = rl_swap.follow(built, c.response).waited
    c.t_served = rl_deployment.mark("served")
    thread.join(timeout=rl_deployment.swap_timeout + 60)
    return c


@dataclass
class Probe:
    status: int
    seconds: float
    version: str | None
    session: str
    all_in_swap: bool  # every replica was in the swap when the probe was sent
    any_in_swap: bool


@observed
def probes_during_swap(rl_deployment, rl_swap, n: int = 6, headers: dict | None = None, every: bool = False, **signal):
    """Signal a new snapshot; while the status shows it being swapped in (on `every` replica
    at once, or on any), send `n` short requests at once (distinct sessions). Returns
    (built, probes); probes is empty when no status poll landed inside the swap."""
    built = rl_swap.build("probe")
    r = rl_swap.post(built, **signal)
    assert r.status_code == 200, f"the swap could not be signalled: {r.status_code} {r.text[:200]}"
    replicas, states = [], []
    for _ in ticks(rl_deployment.swap_timeout, rl_deployment.timeouts.probe):
        replicas = rl_deployment.replicas()
        states = [in_swap(x, built.identity) for x in replicas]
        if all(states) if every else any(states):
            break
        if replicas and all(x.get("current_snapshot_identity") == built.identity for x in replicas):
            rl_swap.follow(built, r)
            return built, []
    all_in, any_in = bool(replicas) and all(states), any(states)
    out: list = [None] * n

    def one(i):
        session = f"probe-{built.identity}-{i}"
        t = rl_deployment.mark(f"probe-{i}-sent")
        s = rl_deployment.complete(
            {"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0, "stream": True},
            headers={"x-multi-turn-session-id": session, **(headers or {})},
        )
        v = s.versions[0] if s.chunks else None
        out[i] = Probe(s.status, rl_deployment.mark(f"probe-{i}-answered") - t, v, session, all_in, any_in)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=rl_deployment.swap_timeout + 60)
    rl_swap.follow(built, r)
    return built, [p for p in out if p is not None]


def expect_loaded(result, *, own: bool = False) -> None:
    """The swap a test relies on was accepted and rolled out. A status the suite cannot read
    (HL-GET-1) or, unless the test is about rollouts (`own`), a rollout that stopped part-way
    (HL-GET-2) leaves the test inconclusive instead of failing it."""
    r, w = result.response, result.waited
    assert r.status_code == 200, f"the signal for {result.built.identity} got {r.status_code}: {r.text[:300]}"
    if w.ok:
        return
    if "(HL-GET-1)" in (w.error or ""):
        inconclusive(f"the status cannot be read, so the load cannot be followed: {w.error}")
    if not own and "rollout stopped" in (w.error or ""):
        inconclusive(f"{w.error} (see HL-GET-2)")
    raise AssertionError(f"{result.built.identity} was not served on every replica: {w.error}; {w.replicas}")
