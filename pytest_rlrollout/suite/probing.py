"""Requests sent while a swap is under way (`probes_during_swap`, `Probes`), and where each was
sent from: the status showing the swap on every replica, on any, or the swap held midway."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.remote.polling import ticks
from pytest_rlrollout.remote.replicas import loading_state
from pytest_rlrollout.suite.observe import observed

if TYPE_CHECKING:
    from pytest_rlrollout.suite.deployment import RLDeployment
    from pytest_rlrollout.suite.evidence import Observed, Timeline
    from pytest_rlrollout.suite.swaps import Swapper, SwapResult


def in_swap(replica: dict[str, Any], identity: str) -> bool:
    """The replica is between the old and the new snapshot."""
    state = loading_state(replica)
    return state.get("target_snapshot_identity") == identity and (
        state.get("stage") == "swapping" or not replica.get("readiness")
    )


@dataclass
class Probe:
    """One request sent while a swap was under way: its answer, when, and what the status showed."""

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
    # A poll answered at `in_swap_until` was asked after the poll before it was answered: an
    # answer that arrived before that earlier moment was given while the swap was still shown.
    # (A probe launched by a poll may itself be sent after the swap ended, on a busy machine.)
    answered_in_swap_before: float = 0.0
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
        self.last_poll = float("-inf")  # when the latest status poll was answered
        self.body = {"prompt": rl_deployment.prompt("probe", 3).body, "max_tokens": 1, "stream": True}

    def showing(self, replicas: list[dict[str, Any]]) -> bool:
        states = [in_swap(x, self.identity) for x in replicas]
        return bool(states) and (all(states) if self.every else any(states))

    def progress(self, replicas: list[dict[str, Any]], t: float) -> None:
        """One status poll (seen at `t`): the swap still shown, or the probes sent when first shown."""
        before, self.last_poll = self.last_poll, t
        if not self.showing(replicas):
            return
        self.out.in_swap_until, self.out.answered_in_swap_before = t, before
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
        self.out.in_swap_until = self.out.answered_in_swap_before = self.dep.mark("midway")
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
