"""A run's plan: what each test that changes the deployment will load, priced on the run's own
base before anything is loaded (`rlrollout plan`), and beside what the run then did.

Every such test declares its loads (the `rl_loads` mark: `Load`s, or a function of the
deployment's capabilities giving them): how each snapshot is built, which tensors it changes
and what the deployment is to do with it (serve it, refuse it). The planner builds each one
with the run's own snapshot factory on a `DryBucket`, which writes nothing and says what each
write would cost: so the same code decides sentinel diff or full snapshot, in-bucket copy or
upload, link or send, in the plan as in the run. A deployment that behaves as the contract says
then loads exactly what was planned; the report shows any test that did otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_rlrollout.remote.bucket import DryBucket
from pytest_rlrollout.runs.snapshots import Built, SnapshotFactory

BYTES = ("uploaded", "copied", "linked", "written")  # a load's costs, as the factory notes them
How = Literal["step", "known", "sentinel", "full", "copy", "base", "lora", "given", "nested", "reset", "shared"]
End = Literal["served", "refused", "unsignalled", "failed"]


@dataclass(frozen=True)
class Load:
    """One snapshot a test builds, and what the deployment is to do with it.

    how: `step` (a sentinel diff on what is served, or a full snapshot where the engine takes no
    diffs or the chain has no start: the factory decides), `known` (a step only when what is
    served is not a snapshot the run knows), `sentinel`, `full`, `copy` (the base
    under a new identity, copied inside the bucket where it holds the base), `base` (a copy only
    when what is served is not the base), `lora`, `given` (a broken variant of the reference
    model, violating SNAP clause `variant`), `nested` (the snapshot built last, copied under a
    nested name) or `reset` (a ledger reset: nothing built, the next diff must be a full load).
    `shared` is a swap a test shares with others (`suite.shared`): the plan prices it as its share
    builds it, never as `shared`.
    """

    how: How
    change: str | None = None  # a change by name (SnapshotFactory.change); None: the factory's own
    config: str | None = None  # a config edit by name (SnapshotFactory.config_edit)
    end: End = "served"
    variant: str | None = None  # how == "given": the SNAP clause the variant violates

    def __post_init__(self) -> None:
        if (self.how == "given") != (self.variant is not None):
            raise ValueError("a `given` load names the SNAP clause its variant violates, and only it does")

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Load:
        return cls(**doc)


def served(how: How = "step", change: str | None = None, config: str | None = None) -> Load:
    return Load(how, change, config)


def shared(end: End = "served") -> Load:
    """The swap of one of the test's shares (`suite.shared`), served or left unsignalled."""
    return Load("shared", end=end)


def refused(how: How = "step", change: str | None = None, config: str | None = None) -> Load:
    return Load(how, change, config, end="refused")


def unsignalled(how: How = "step", change: str | None = None) -> Load:
    """Built and put in the bucket, never loaded (a signal with bad credentials, a hint)."""
    return Load(how, change, end="unsignalled")


@dataclass(frozen=True)
class Context:
    """What a test's loads may depend on: the deployment's capabilities, its engine, whether
    it serves the reference model, and the test's parameters."""

    has: Callable[[str], bool]
    engine: str
    spans_only: bool = False  # its streams date tokens by spans only (said once, at the end)
    reset_policies: tuple[str, ...] = ("all", "new_session", "none")  # the reset_prompt_cache values it binds
    params: dict[str, Any] = field(default_factory=dict)


def declared(marks: list[Any], context: Context) -> list[Load] | None:
    """A test's loads from its `rl_loads` marks (None when it declares none)."""
    if not marks:
        return None
    loads: list[Load] = []
    for mark in marks:
        for arg in mark.args:
            loads += arg(context) if callable(arg) else [arg]
    for load in loads:
        if not isinstance(load, Load):
            raise TypeError(f"rl_loads takes Load values or functions giving them, not {load!r}")
    return loads


@dataclass
class Priced:
    """One planned (or done) load and what it cost: the factory's note, and what became of it."""

    kind: str  # full | incremental | lora | given | nested (a copy under a nested name) | reset
    uploaded: int = 0
    copied: int = 0
    linked: int = 0
    written: int = 0
    end: str = "served"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "uploaded": self.uploaded,
            "copied": self.copied,
            "linked": self.linked,
            "written": self.written,
            "end": self.end,
        }

    @property
    def swap(self) -> bool:
        return self.end == "served" and self.kind != "reset"

    def is_full_upload(self, full_bytes: int) -> bool:
        """A whole snapshot sent from this machine (no copy inside the bucket)."""
        return self.kind == "full" and self.uploaded >= full_bytes


@dataclass
class TestPlan:
    """One test's loads, priced (and as it declared them)."""

    nodeid: str
    loads: list[Priced]
    declared: list[Load] = field(default_factory=list)

    @property
    def swaps(self) -> int:
        return sum(p.swap for p in self.loads)

    @property
    def signals(self) -> int:
        return sum(p.end in ("served", "refused", "failed") and p.kind != "reset" for p in self.loads)

    def figures(self) -> dict[str, int]:
        """What the test loads in the figures a run's report compares with what it did: swaps,
        snapshots built and their `BYTES`."""
        return {
            "swaps": self.swaps,
            "built": sum(p.kind != "reset" for p in self.loads),
            **{k: sum(getattr(p, k) for p in self.loads) for k in BYTES},
        }

    def totals(self, full_bytes: int) -> dict[str, int]:
        return {
            **self.figures(),
            "signals": self.signals,
            "full_uploads": sum(p.is_full_upload(full_bytes) for p in self.loads),
        }

    def as_dict(self, full_bytes: int) -> dict[str, Any]:
        return {
            "test": self.nodeid,
            "loads": [p.as_dict() for p in self.loads],
            **self.totals(full_bytes),
            "declared": [load.as_dict() for load in self.declared],
        }


def totals(plans: list[TestPlan], full_bytes: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in plans:
        for k, v in p.totals(full_bytes).items():
            out[k] = out.get(k, 0) + v
    return out


def priced(note: dict[str, Any], end: str) -> Priced:
    """A load as the factory noted it (`Built.note`)."""
    return Priced(note["kind"], note["uploaded"], note["copied"], note["linked"], note["written"], end)


class Planner:
    """Prices tests' declared loads in run order on a dry copy of the run's snapshot factory:
    the run's base and bucket (read, never written), what it knows is served, and a record of
    its own (so the plan never touches the run's)."""

    def __init__(
        self,
        factory: SnapshotFactory,
        serving: str | None,
        *,
        reference_cases: Callable[[], Any] | None = None,
        dry: bool = True,
        on_load: Callable[[Priced], None] | None = None,
    ):
        """`dry=False` builds on `factory` itself, for real: a replay of a run's factory work
        without a deployment (what a benchmark times); `on_load` sees each load once built."""
        self.real = factory
        self.dir = Path(tempfile.mkdtemp(prefix="rl-plan-"))
        self.factory = factory.dry(DryBucket(factory.bucket), self.dir) if dry else factory
        self.on_load = on_load
        self.serving = serving
        self.synced = False  # whether the plan started from what the deployment serves
        self.cases = reference_cases  # gives the reference model's snapshots, for broken variants (given loads)
        self._cases: dict[str, Any] = {}

    def sync(self, serving: str | None) -> None:
        """Start the next test's plan from what the run knows now (a run whose tests did other
        than planned is planned from where it is)."""
        self.factory.restore(self.real.state())
        self.serving = serving
        self.synced = True

    def mark(self) -> tuple[dict[str, Any], str | None]:
        """Where the plan is, to go back to (`back`) when a test's loads are left out."""
        return json.loads(json.dumps(self.factory.state())), self.serving

    def back(self, mark: tuple[dict[str, Any], str | None]) -> None:
        state, self.serving = mark
        self.factory.record.overlays, self.factory.record.parents = state["overlays"], state["parents"]
        self.factory.record.needs_full = state["needs_full"]
        self.factory.record.save()

    def plan(self, nodeid: str, loads: list[Load], *, key: str | None = None) -> TestPlan:
        """Price `loads` from where the plan is; `key` names the test as the run's factory does
        (the scale a sentinel diff applies follows it, and with it the diff's bytes)."""
        notes: list[dict[str, Any]] = []
        self.factory.for_test(key or nodeid, notes)
        out: list[Priced] = []
        last: Built | None = None
        for load in [step for given in loads for step in self._expand(given)]:
            if load.how == "shared":
                raise ValueError(f"{nodeid}: a shared load is priced as its share builds it (suite.shared)")
            if load.how == "reset":
                self.factory.ledger_reset()
                out.append(Priced("reset", end=load.end))
                if self.on_load is not None:
                    self.on_load(out[-1])
                continue
            before = len(notes)
            built = self._build(load, last)
            last = built or last
            if load.end == "served" and built is not None and built.kind in ("full", "incremental"):
                self.serving = built.identity
                if built.kind == "full":
                    self.factory.loaded_full()
            if built is not None and load.end != "unsignalled":
                self.factory.signalled(built.identity)
            if built is not None and load.end == "served":  # as `Swapper.follow` retires after a load
                self.factory.retire({i for i in (self.serving, *self.factory.adapters) if i is not None})
            for note in notes[before:]:
                out.append(priced(note, load.end))
                if self.on_load is not None:
                    self.on_load(out[-1])
        return TestPlan(nodeid, out, list(loads))

    def _build(self, load: Load, last: Built | None) -> Built | None:
        f, serving = self.factory, self.serving
        change, edit = f.change(load.change, serving), f.config_edit(load.config)
        if load.how == "step" or (load.how == "known" and not f.knows(serving)):
            return f.step(serving, "plan", change, edit)
        if load.how == "known":  # what is served is known already
            return None
        if load.how == "sentinel":
            return f.sentinel(serving or "", "plan", change, edit)
        if load.how == "full":
            return f.full("plan", change, edit)
        if load.how == "copy" or (load.how == "base" and f.record.overlays.get(serving or "") != {}):
            return f.base_copy("plan")
        if load.how == "base":  # what is served holds the base already
            return None
        if load.how == "lora":
            return f.lora("plan")
        if load.how == "nested":
            if last is None:
                raise ValueError("a nested load copies the snapshot built before it: none was")
            f.copy_nested(last.identity, f"{last.identity}-dir", "inner")
            return None
        case = self._case(load.variant or "")
        return f.copy_in(case.snapshot, "plan", case.signal)

    def _case(self, variant: str) -> Any:
        """The broken variant violating `variant`, built once."""
        from pytest_rlrollout.snapshot import broken

        if variant not in self._cases:
            self._cases[variant] = broken.broken_case(variant, self._reference(), Path(tempfile.mkdtemp(dir=self.dir)))
        return self._cases[variant]

    def _reference(self) -> Any:
        """The reference model's snapshots, which broken variants are built from."""
        if self.cases is None:
            raise ValueError("a `given` load needs the reference model's snapshots (reference_cases)")
        return self.cases()

    def _expand(self, load: Load) -> list[Load]:
        """A broken variant comes with what signalling it needs (as HL-POST-5 does it): a served
        copy of the base first when it diffs the base, a ledger reset when it must follow one."""
        if load.how != "given":
            return [load]
        from pytest_rlrollout.snapshot import broken

        case = self._case(load.variant or "")
        return [
            *([served("base")] if broken.diffs_the_base(case, self._reference()) else []),
            *([Load("reset")] if case.ledger_reset else []),
            load,
        ]

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)
