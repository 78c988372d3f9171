"""A soak: rollout workers on Locust against a deployment while a trainer swaps snapshots into
it, every turn judged as it comes in.

The trainer runs here (a thread), through the suite's own swap path (`Swapper`: build the next
snapshot, signal it, wait until every replica serves it), and tells the workers, through the
Locust hub, when each swap was signalled and when it was served everywhere; after each swap it
fingerprints every replica (FID-SWAP-1). The workers' turns come back through the hub and are
judged here, with the clauses of `judge`, and counted into the figures.
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.remote.fingerprint import FingerprintError, Sweep, sweep
from pytest_rlrollout.soak.figures import Figures, Timed
from pytest_rlrollout.soak.judge import Judge, Verdict
from pytest_rlrollout.soak.locust import Locust, LocustError, remote_worker_command
from pytest_rlrollout.soak.plan import Plan

if TYPE_CHECKING:
    from pytest_rlrollout.suite.deployment import RLDeployment
    from pytest_rlrollout.suite.swaps import Swapper

PROGRESS_EVERY = 5.0  # seconds between progress lines
# The least patience for a swap under load: a SYNC swap drains every stream in flight first, and
# the suite's local profile (3 s, for a quiet reference deployment) is no measure of that.
UNDER_LOAD = {"swap": 60.0, "stalled_after": 10.0}


@dataclass(frozen=True)
class Settings:
    """How long and how hard a soak runs, and how its trainer swaps."""

    seconds: float = 600.0  # the soak ends after this long ...
    swaps: int = 20  # ... or once this many swaps were made and the load ran `every` more seconds
    every: float = 20.0  # seconds of load before each swap's signal (and after the last swap)
    users: int = 64  # rollouts in flight at once (each a session)
    workers: int = 0  # Locust worker processes on this machine (0 and no remote ones: Locust in one process)
    remote_workers: int = 0  # Locust workers the master also waits for, started on other machines
    full_every: int = 5  # every n-th swap loads a full snapshot, the others a sentinel delta (0: never)
    resets: tuple[str, ...] = ("all",)  # each swap's reset_prompt_cache, in turn
    fingerprints: bool = True  # fingerprint every replica after every swap (FID-SWAP-1)
    turns: int = 4  # per rollout
    max_tokens: int = 32  # per turn
    think: tuple[float, float] = (0.2, 1.0)  # seconds between a rollout's turns (the environment's step)
    grace: float = 0.5  # see `Plan.grace`
    seed: int = 0

    def __post_init__(self) -> None:
        if (
            self.seconds <= 0
            or self.swaps < 0
            or self.every < 0
            or self.users < 1
            or self.workers < 0
            or self.remote_workers < 0
        ):
            raise ValueError(f"a soak needs time, users, and no negative counts: {self}")
        bad = [r for r in self.resets if r not in ("all", "new_session", "none")]
        if not self.resets or bad:
            raise ValueError(f"resets {self.resets}: each one of all, new_session, none")


@dataclass
class Swap:
    """One of the trainer's swaps: when it was signalled and served (seconds since the soak
    began, on this process's clock), or why it was not; and how far each replica's fingerprint moved."""

    epoch: int
    identity: str
    kind: str  # full, incremental
    reset: str
    signalled_at: float
    served_at: float | None = None
    error: str | None = None
    moved: dict[str, float] = field(default_factory=dict)  # replica -> max |Δlogprob| against before the swap


@dataclass
class Result:
    transition: str
    settings: Settings
    verdicts: dict[str, Verdict]
    figures: Figures  # every turn the hub passed on
    workers: dict[str, Figures]  # each worker's own count, sent when it drained
    swaps: list[Swap]
    seconds: float
    exit_codes: list[int | None]
    tolerance: float = 0.0  # the fingerprint distance a swap must move every replica's past (FID-SWAP-1)

    def summed(self) -> Figures:
        """The workers' figures added up: equal to `figures` when no turn was lost on the way."""
        return functools.reduce(Figures.merge, self.workers.values(), Figures())

    def to_json(self) -> dict[str, Any]:
        return {
            "transition": self.transition,
            "settings": asdict(self.settings),
            "seconds": self.seconds,
            "verdicts": {
                c: {
                    "judged": v.judged,
                    "violations": v.violations,
                    "examples": v.examples,
                    "uncounted": v.uncounted,
                    "outcome": v.outcome.value,
                }
                for c, v in sorted(self.verdicts.items())
            },
            "figures": self.figures.to_json(),
            "workers": {w: f.to_json() for w, f in sorted(self.workers.items())},
            "swaps": [asdict(s) for s in self.swaps],
            "exit_codes": self.exit_codes,
            "tolerance": self.tolerance,
        }


class Soak:
    """One soak of `dep`, swapping through `swapper` (whose factory builds the snapshots)."""

    def __init__(
        self, dep: RLDeployment, swapper: Swapper, settings: Settings, workdir: Path, say: Callable[[str], None] = print
    ):
        self.dep, self.swapper, self.settings, self.workdir, self.say = dep, swapper, settings, workdir, say
        found = dep.capabilities
        self.transition = (found.transition or dep.options.transition or "ASYNC").upper()
        serving = dep.serving()
        if serving is None:
            raise ValueError("the deployment says no snapshot it serves: the soak needs one to start from")
        self.judge = Judge(self.transition, [serving], versions=found.has("policy_version"))  # type: ignore[arg-type]
        self.lock = threading.Lock()  # the judge: turns come in here while the trainer adds swaps
        self.figures = Figures()
        self.workers: dict[str, Figures] = {}  # each worker's own count, sent when it drained
        self.swaps: list[Swap] = []
        self.stop = threading.Event()
        self.t0 = time.time()
        self._start = time.monotonic()
        self.replicas = max(1, len(dep.replicas()))
        self.last_sweep: Sweep | None = None
        self.failure: Exception | None = None  # what stopped the trainer, other than a verdict

    def clock(self) -> float:
        return time.monotonic() - self._start

    def plan(self) -> Plan:
        s, t = self.settings, self.dep.target
        vocab = int((self.dep.base_config or {}).get("vocab_size", 512))
        return Plan(
            t.engine,
            t.base_url,
            t.model,
            t.deployment,
            t.inference_url,
            getattr(self.dep.driver, "bucket", None),
            t.members,
            vocab=vocab,
            turns=s.turns,
            max_tokens=s.max_tokens,
            think=s.think,
            routing=self.dep.capabilities.has("routing_matrix"),
            seed=s.seed,
            grace=s.grace,
            timeout=self.dep.timeouts.request,
            t0=self.t0,
            discovery=self.dep.capabilities.as_dict(),
        )

    # ----------------------------------------------------------------------- the soak

    def run(self) -> Result:
        quiet = self.dep.timeouts
        self.dep.timeouts = quiet.with_(**{k: max(v, getattr(quiet, k)) for k, v in UNDER_LOAD.items()})
        try:
            return self._run()
        finally:
            self.dep.timeouts = quiet

    def _run(self) -> Result:
        s = self.settings
        self.workdir.mkdir(parents=True, exist_ok=True)
        plan = self.plan().write(self.workdir / "plan.json")
        key = self.dep.target.api_key.reveal() if self.dep.target.api_key else None
        with Locust(
            plan,
            users=s.users,
            workers=s.workers,
            workdir=self.workdir / "locust",
            api_key=key,
            remote=s.remote_workers,
        ) as loc:
            if s.remote_workers:
                self.say(
                    f"waiting for {s.remote_workers} Locust workers from other machines; on each, run:\n"
                    + remote_worker_command(socket.getfqdn(), loc.port or 0)
                )
            self._until(loc, "spawned", loc.start_timeout)
            if s.fingerprints:
                self.last_sweep = self._sweep(0)
            self.trainer = threading.Thread(target=self._train, args=(loc,), name="rlrollout-soak-trainer", daemon=True)
            self.trainer.start()
            deadline, said = self._start + s.seconds, self.clock()
            while self.trainer.is_alive() and time.monotonic() < deadline:
                self._take(loc.poll(max(0.01, min(1.0, deadline - time.monotonic()))))
                if self.clock() - said >= PROGRESS_EVERY:
                    said = self.clock()
                    self.say(self.progress())
            self.stop.set()
            self.trainer.join(timeout=self.dep.timeouts.swap + 60)
            loc.send({"stop": True})
            self._until(loc, "finished")
        if self.failure is not None:  # the trainer's own error (not a verdict): after Locust has ended
            raise self.failure
        self.say(self.progress())
        return Result(
            self.transition,
            s,
            self.judge.verdicts,
            self.figures,
            self.workers,
            self.swaps,
            self.clock(),
            loc.exit_codes,
            self.dep.options.numerics.fingerprint_tolerance,
        )

    def _until(self, loc: Locust, kind: str, timeout: float = 0.0) -> dict[str, Any]:
        """Take the hub's events until one of `kind`: within `timeout` or a request's timeout and a
        minute, whichever is longer (a drain waits for the turns in flight)."""
        limit = max(timeout, self.dep.timeouts.request + 60)
        deadline = time.monotonic() + limit
        while (left := deadline - time.monotonic()) > 0:
            event = loc.next(left)
            self._take(event)
            if kind in event:
                return event
        raise LocustError(f"Locust did not say {kind!r} within {limit:g} s")

    def _take(self, event: dict[str, Any] | None) -> None:
        if not event:
            return
        for doc in event.get("turns", ()):
            timed = Timed.from_json(doc)
            with self.lock:
                self.judge.judge(timed.turn)
            self.figures.record(timed)
        if "final" in event:
            self.workers[event["final"]["worker"]] = Figures.from_json(event["final"]["figures"])

    def progress(self) -> str:
        f, n = self.figures, len(self.swaps)
        broken = {c: v.violations for c, v in sorted(self.judge.verdicts.items()) if v.violations}
        return (
            f"{self.clock():6.1f} s  swaps {n}/{self.settings.swaps}  sessions {len(f.sessions)}  turns {f.turns}  "
            f"tokens {f.tokens}  errors {sum(f.errors.values())}  "
            + (f"violations {broken}" if broken else "no violation")
        )

    # ----------------------------------------------------------------------- the trainer

    def _train(self, loc: Locust) -> None:
        try:
            self._swaps(loc)
        except Exception as e:  # raised in the soak's thread once the load has stopped
            self.failure = e

    def _swaps(self, loc: Locust) -> None:
        s = self.settings
        for n in range(1, s.swaps + 1):
            if self.stop.wait(s.every):  # the load's pace between swaps, cut short when time is up
                return
            if not self._swap(loc, n):
                return
        self.stop.wait(s.every)

    def _swap(self, loc: Locust, n: int) -> bool:
        """Swap n: build it, say it is signalled, signal it, wait, say it is served, fingerprint."""
        s, factory = self.settings, self.swapper.factory
        serving = self.judge.loaded[-1]
        change = factory.visible_change(serving)  # every swap moves every fingerprint
        full = s.full_every > 0 and n % s.full_every == 0
        built = factory.full(f"soak-{n}", change) if full else self.swapper.build(f"soak-{n}", change)
        reset = s.resets[(n - 1) % len(s.resets)]
        with self.lock:
            epoch = self.judge.swapped(built.identity, reset)
        swap = Swap(epoch, built.identity, built.kind, reset, self.clock())
        self.swaps.append(swap)
        loc.send({"signalled": epoch})
        result = self.swapper.signal(built, reset_prompt_cache=reset)
        served = result.waited is not None and result.waited.ok
        why = f"swap {epoch} to {built.identity}: " + (
            f"the signal was answered {result.response.status_code}: {result.response.text[:200]}"
            if result.waited is None
            else str(result.waited.error)
        )
        self._rule("HL-GET-2", not served, why)
        if not served:
            swap.error = why
            return False
        swap.served_at = self.clock()
        loc.send({"served": epoch})
        if s.fingerprints and self.last_sweep is not None:
            after = self._sweep(epoch)
            if after is not None:
                tol = self.dep.options.numerics.fingerprint_tolerance
                for replica, before in self.last_sweep.prints.items():
                    if replica in after.prints:
                        d = after.prints[replica].distance(before)
                        swap.moved[replica] = d
                        self._rule(
                            "FID-SWAP-1",
                            d <= tol,
                            f"swap {epoch} to {built.identity} (a norm vector "
                            f"scaled) served, yet {replica} scores the canaries as before (max |Δ| {d:.2g} "
                            f"<= tolerance {tol:g}): the label changed, the weights did not",
                        )
                self.last_sweep = after
        return True

    def _sweep(self, epoch: int) -> Sweep | None:
        vocab = (self.dep.base_config or {}).get("vocab_size")
        sessions = self.last_sweep.sessions if self.last_sweep is not None else None
        try:
            return sweep(
                self.dep.driver,
                self.replicas,
                self.dep.salted(f"soak-fp-{epoch}"),
                vocab=vocab,
                key=lambda i: self.dep.salted(f"soak-fp-session-{i}"),
                sessions=sessions,
            )
        except FingerprintError as e:  # no verdict: the NUM and R3 clauses judge what the answers lack
            self.say(f"fingerprints after swap {epoch} could not be read: {e}")
            return None

    def _rule(self, clause: str, broken: bool, why: str) -> None:
        with self.lock:
            self.judge.record(clause, broken, lambda: why)
