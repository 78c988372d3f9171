"""How close numbers must be, by the precision the deployment serves in: a float32 figure is not
a bfloat16 one. A bf16 engine's own kernels differ between shapes (a cache hit, a batch, another
load path) by far more than an fp32 engine's, and it differs from the suite's float32 local scorer
by more still; judged with fp32 figures, a healthy bf16 deployment would fail.

Two figures per precision:

- `fingerprint`: the deployment against itself (FID-*, a canary before and after a refused load,
  a stream's numbers across a swap);
- `logprob`: the deployment against the local float32 scorer of the same weights (NUM-LOGPROB-1,
  CTL-LABEL-1).

Sources. float32: the contract's defaults (1e-3 absolute for fingerprints; the same for the local
scorer). bfloat16 and float16: measured by `benchmarks/bench_tolerances.py` on the reference
model and its Qwen3-30B-A3B-shaped layout (48 layers, top-8 of 128 experts): transformers on the
CPU in that precision, a prompt scored whole against its prefix-then-rest through the KV cache
(itself), and against the numpy engine in float32 (the local scorer); each figure is about twice
the largest |Δlogprob| measured over 24 prompts x 48 tokens of both models. Measured here
(2026-11-27; max over both models, p99 in brackets):

    float32   itself 1.5e-4 (5.6e-5)   against float32 2.5e-6 (1.4e-6)
    bfloat16  itself 7.7e-2 (2.7e-2)   against float32 1.2e-1 (3.8e-2)
    float16   itself 4.2e-2 (4.0e-3)   against float32 4.0e-2 (5.1e-3)

An FP8 deployment (`quantization_config`) is not covered by these: set its tolerances
(`rl_*_tolerance`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BENCH = "benchmarks/bench_tolerances.py"


@dataclass(frozen=True)
class Tolerance:
    dtype: str
    fingerprint: float  # the deployment against itself
    logprob: float  # the deployment against the local float32 scorer
    source: str


TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance("float32", 1e-3, 1e-3, "the contract's defaults (FID: 1e-3 absolute)"),
    "bfloat16": Tolerance("bfloat16", 0.15, 0.25, f"about 2x the largest |Δ| of bf16 measured by {BENCH}"),
    "float16": Tolerance("float16", 0.1, 0.1, f"about 2x the largest |Δ| of fp16 measured by {BENCH}"),
}
_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
}


def dtype_name(name: str) -> str:
    """A precision's one name (bf16 -> bfloat16); ValueError for one without figures here."""
    key = name.strip().lower().removeprefix("torch.")
    if key not in _NAMES:
        raise ValueError(f"no tolerances for dtype {name!r} (known: {', '.join(TOLERANCES)}); set rl_*_tolerance")
    return _NAMES[key]


def served_dtype(config: Mapping[str, Any] | None) -> str | None:
    """The precision a model's config.json declares (`torch_dtype`, or `dtype` as transformers 5
    writes it), as `dtype_name` names it; None when it declares none or one without figures."""
    if not config:
        return None
    declared = config.get("torch_dtype") or config.get("dtype")
    try:
        return dtype_name(str(declared)) if declared else None
    except ValueError:
        return None
