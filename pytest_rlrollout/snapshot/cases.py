"""Valid reference snapshots of every kind, built from the tiny reference base or a run's own.

A *case* is a snapshot plus what validation needs around it (base, parent, signal). The
broken variants (`broken.py`) start from these, and the tests prove each is valid.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
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


class ReferenceCases:
    """Valid snapshots of every kind (full, incremental, lora, quantized), built in `root` from
    the tiny reference base (written there), each when first asked for.

    `ReferenceCases.of` builds them from another model's base instead (a live run's), so the
    broken variants of HL-POST-5 are that model's."""

    KINDS = ("full", "incremental", "lora", "quantized")

    def __init__(
        self,
        root: str | os.PathLike[str],
        base: Path | None = None,
        *,
        model: str = tiny_moe.MODEL_NAME,
        step: bool = True,
    ) -> None:
        self.root = Path(root)
        self.base = tiny_moe.make_base(self.root / tiny_moe.BASE_IDENTITY) if base is None else base
        self.model = model
        self.step = step  # whether the full case is a training step from the base, or the base itself
        self._cases: dict[str, Case] = {}

    @classmethod
    def of(cls, root: str | os.PathLike[str], base: str | os.PathLike[str], model: str) -> ReferenceCases:
        """The cases of `base` (read, never written), served as `model`, costing on a
        production-sized base what they change: the full case is the base itself, every shard
        hard-linked, so a broken variant of it carries only what it breaks (and `copy_in` copies
        the rest inside the bucket); the diff is the base's to itself. A base out of the hot-load
        layout (a plain checkpoint) is re-laid once first, as the snapshot factory does."""
        root, base = Path(root), Path(base)
        if build.layout_problem(base) is not None:
            base = build.export_checkpoint(base, root / "base" / base.name)
        return cls(root, base, model=model, step=False)

    def __getitem__(self, kind: str) -> Case:
        if kind not in self.KINDS:
            raise KeyError(f"no reference case {kind!r} (one of {', '.join(self.KINDS)})")
        if kind not in self._cases:
            self._cases[kind] = self._build(kind)
        return self._cases[kind]

    def _build(self, kind: str) -> Case:
        base, root = self.base, self.root
        if kind == "full":
            change = build.perturbed(base, seed=1) if self.step else {}
            return Case(build.derive(base, root / "step-1", change, link=not self.step), base=base)
        if kind == "incremental":
            signal = build.make_incremental(base, self["full"].snapshot, root / "step-2-diff")
            return Case(root / "step-2-diff", base=base, parent=base, signal=signal)
        if kind == "lora":
            lora = build.make_lora(base, root / "lora-1", base_model=self.model)
            return Case(lora, base=base, base_model=(self.model,))
        return Case(build.quantize_fp8(base, root / "fp8-1"), base=base)
