"""The figures of trainer–inference mismatch (the R3 paper's): from the logprobs and routing a
deployment reported for the tokens it generated, and a local scorer's for the same tokens.

- mean and max |Δlogprob|;
- a k3 estimate of KL(served ‖ local): with r = p_local / p_served over tokens the deployment
  sampled, mean(r − 1 − log r), which is unbiased and never negative;
- the fraction of tokens whose probability ratio r leaves [0.5, 2] (what PPO-style clipping
  would cut);
- routing: agreement per (layer, token) as expert *sets* (the order within a row is the
  server's), per layer, and the fraction of tokens where any layer disagrees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

RATIO_BAND = (0.5, 2.0)
KEPT = 50_000  # per-token values kept for the pictures and the JSON report


@dataclass
class Figures:
    tokens: int
    mean_abs: float
    max_abs: float
    k3_kl: float
    ratio_outside: float  # fraction of tokens with p_local / p_served outside RATIO_BAND
    route_tokens: int = 0  # tokens with routing on both sides
    route_agreement: float | None = None  # over (layer, token) pairs
    layer_agreement: list[float] = field(default_factory=list)
    any_disagreement: float | None = None  # fraction of tokens with at least one layer differing
    deltas: list[float] = field(default_factory=list, repr=False)  # local − served, per token (first KEPT)
    positions: list[int] = field(default_factory=list, repr=False)  # each token's index in its completion

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Figures:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})

    def lines(self) -> list[str]:
        """The figures as a few lines of text (terminal and Markdown)."""
        out = [
            f"tokens compared          {self.tokens}",
            f"mean |Δlogprob|          {self.mean_abs:.3g}",
            f"max |Δlogprob|           {self.max_abs:.3g}",
            f"k3 KL(served‖local)      {self.k3_kl:.3g}",
            f"ratio outside [0.5, 2]   {self.ratio_outside:.3%}",
        ]
        if self.route_agreement is not None:
            out += [
                f"routing agreement        {self.route_agreement:.3%} of (layer, token) over {self.route_tokens} tokens",
                f"tokens with any layer disagreeing {self.any_disagreement:.3%}",
                "per layer                " + " ".join(f"{a:.1%}" for a in self.layer_agreement),
            ]
        return out


def logprob_figures(served: np.ndarray, local: np.ndarray, positions: np.ndarray | None = None) -> Figures:
    """Figures of two aligned arrays of logprobs of the same sampled tokens."""
    served, local = np.asarray(served, np.float64), np.asarray(local, np.float64)
    if served.shape != local.shape or served.ndim != 1:
        raise ValueError(f"logprobs do not line up: {served.shape} served, {local.shape} local")
    if served.size == 0:
        raise ValueError("no tokens to compare")
    delta = local - served
    log_r = np.clip(delta, -50.0, 50.0)  # a ratio beyond e^50 is infinite for every purpose here
    r = np.exp(log_r)
    lo, hi = RATIO_BAND
    pos = np.arange(served.size) if positions is None else np.asarray(positions)
    return Figures(
        tokens=int(served.size),
        mean_abs=float(np.abs(delta).mean()),
        max_abs=float(np.abs(delta).max()),
        k3_kl=float(np.mean(np.expm1(log_r) - log_r)),  # expm1: no rounding below zero for tiny log r
        ratio_outside=float(np.mean((r < lo) | (r > hi))),
        deltas=[float(x) for x in delta[:KEPT]],
        positions=[int(x) for x in pos[:KEPT]],
    )


def routing_figures(figures: Figures, served: np.ndarray, local: np.ndarray) -> Figures:
    """Add routing agreement to `figures`: `served` and `local` are [tokens, layers, k] expert
    indices of the same tokens."""
    served, local = np.asarray(served), np.asarray(local)
    if served.shape != local.shape or served.ndim != 3:
        raise ValueError(f"routing does not line up: {served.shape} served, {local.shape} local")
    agree = np.sort(served, axis=-1) == np.sort(local, axis=-1)
    rows = agree.all(axis=-1)  # [tokens, layers]: the same set of experts
    figures.route_tokens = int(rows.shape[0])
    figures.route_agreement = float(rows.mean()) if rows.size else None
    figures.layer_agreement = [float(x) for x in rows.mean(axis=0)] if rows.size else []
    figures.any_disagreement = float((~rows).any(axis=1).mean()) if rows.size else None
    return figures
