"""The docs' runnable examples (docs/examples/), imported from their files for the tests that run
them, and what those tests record of a run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
TRAINING_LOOP = EXAMPLES / "training_loop.py"


def training_loop() -> ModuleType:
    """docs/examples/training_loop.py as a module, registered under its name (its dataclass looks
    its module up); imported once per process (it imports torch and transformers: seconds)."""
    name = "training_loop"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TRAINING_LOOP)
        assert spec is not None and spec.loader is not None
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


class Logged:
    """A logger for the loop's `main`: what each step logged (the step, its check's result, and
    the flat figures a metrics logger would get)."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.results: list[Any] = []
        self.figures: list[dict[str, float]] = []

    def __call__(self, step: int, loss: float | None, result: Any) -> None:
        self.steps.append(step)
        self.results.append(result)
        self.figures.append({**result.metrics(), **({"train/loss": loss} if loss is not None else {})})
