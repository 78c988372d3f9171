"""Valid reference snapshots of every kind, built from the tiny reference base.

A *case* is a snapshot plus what validation needs around it (base, parent, signal). The
broken variants (`broken.py`) start from these, and the tests prove each is valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_rlrollout.snapshot import build, tiny_moe
from pytest_rlrollout.snapshot.validate import Context, Report, validate


@dataclass(frozen=True)
class Case:
    snapshot: Path
    base: Path | None = None
    parent: Path | None = None
    signal: dict[str, Any] | None = None
    ledger_reset: bool = False
    base_model: tuple[str, ...] = ()
    identity: str | None = None

    def context(self, **overrides: Any) -> Context:
        fields = dict(
            base=self.base,
            parent=self.parent,
            signal=self.signal,
            ledger_reset=self.ledger_reset,
            base_model=self.base_model,
            identity=self.identity,
        )
        return Context(**{**fields, **overrides})

    def validate(self, **overrides: Any) -> Report:
        return validate(self.snapshot, context=self.context(**overrides))


@dataclass
class ReferenceCases:
    """Valid snapshots of every kind, built from the reference base in `root`."""

    root: Path
    base: Path = field(init=False)
    cases: dict[str, Case] = field(init=False)

    def __post_init__(self) -> None:
        root = self.root
        self.base = tiny_moe.make_base(root / tiny_moe.BASE_IDENTITY)
        names = (tiny_moe.MODEL_NAME,)
        step = build.derive(self.base, root / "step-1", build.perturbed(self.base, seed=1))
        signal = build.make_incremental(self.base, step, root / "step-2-diff")
        self.cases = {
            "full": Case(step, base=self.base),
            "incremental": Case(root / "step-2-diff", base=self.base, parent=self.base, signal=signal),
            "lora": Case(
                build.make_lora(self.base, root / "lora-1", base_model=tiny_moe.MODEL_NAME),
                base=self.base,
                base_model=names,
            ),
            "quantized": Case(build.quantize_fp8(self.base, root / "fp8-1"), base=self.base),
        }

    def __getitem__(self, kind: str) -> Case:
        return self.cases[kind]
