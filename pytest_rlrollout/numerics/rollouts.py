"""Rollouts sampled from a deployment with what the R3 figures need (token ids, logprobs, routing),
and their comparison with a local scorer."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_rlrollout.numerics.figures import Figures, logprob_figures, routing_figures
from pytest_rlrollout.numerics.scorer import Scorer

if TYPE_CHECKING:
    from pytest_rlrollout.remote.drivers import Driver

# the served routing of a generated token is the router's choice at the position that produced
# it (the reference deployment's reading) or at the token's own position: both are tried
ALIGNMENTS = {"producing position": -1, "own position": 0}


class RolloutError(ValueError):
    """A deployment's answer cannot be compared (what is missing, and in which rollout)."""


@dataclass
class Rollout:
    prompt: list[int]
    completion: list[int]
    logprobs: list[float]  # as reported while generating
    routing: list[np.ndarray] | None  # [L, k] per generated token, when reported
    versions: frozenset[str] = frozenset()  # the policy versions (model@identity) its chunks named

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.completion


def sample(
    driver: Driver,
    prompts: list[list[int]],
    tokens: int,
    *,
    shape: tuple[int, int] | None,
    seed: int = 0,
    headers: dict[str, str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Rollout]:
    """One sampled completion (temperature 1) of `tokens` tokens per prompt, with logprobs and,
    for an MoE model (`shape` = (L, k)), routing matrices."""
    out = []
    for i, prompt in enumerate(prompts):
        body: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 1.0,
            "seed": seed + i,
            "logprobs": True,
            "stream": True,
        }
        if shape is not None:
            body["include_routing_matrix"] = True
        s = driver.complete(body, headers=headers)
        if not s.ok:
            raise RolloutError(f"rollout {i}: HTTP {s.status}: {s.body[:200]}")
        entries = s.entries
        if not entries:
            raise RolloutError(f"rollout {i}: no logprobs entries in the answer")
        ids = [t for e in entries if isinstance(t := e.get("token_id"), int)]
        lps = [float(x) for e in entries if isinstance(x := e.get("logprob"), int | float)]
        if len(ids) != len(entries) or len(lps) != len(entries):
            raise RolloutError(f"rollout {i}: entries without an integer token_id and a numeric logprob")
        routing = None
        if shape is not None:
            try:
                routing = [
                    np.frombuffer(base64.b64decode(e["routing_matrix"]), np.uint8).reshape(shape) for e in entries
                ]
            except (KeyError, ValueError, TypeError) as e:
                raise RolloutError(
                    f"rollout {i}: a routing_matrix is missing or not L*k = {shape} bytes ({e})"
                ) from None
        versions = frozenset(v for v in s.versions if v)
        out.append(Rollout(list(prompt), ids, lps, routing, versions))
        if progress is not None:
            progress(i + 1, len(prompts))
    return out


def compare(
    rollouts: list[Rollout], scorer: Scorer, progress: Callable[[int, int], None] | None = None
) -> tuple[Figures, str | None]:
    """The figures of `rollouts` against `scorer`, and the routing alignment that was used."""
    served, local, positions = [], [], []
    routed: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {a: ([], []) for a in ALIGNMENTS}
    for n, r in enumerate(rollouts):
        scored = scorer.score(r.ids)
        start = len(r.prompt)
        served += r.logprobs
        local += list(scored.logprobs[start:])
        positions += list(range(len(r.completion)))
        if r.routing is not None and scored.routing is not None:
            for name, shift in ALIGNMENTS.items():
                for j, m in enumerate(r.routing):
                    routed[name][0].append(m)
                    routed[name][1].append(scored.routing[start + j + shift])
        if progress is not None:
            progress(n + 1, len(rollouts))
    figures = logprob_figures(np.array(served), np.array(local), np.array(positions))
    if not routed["own position"][0]:
        return figures, None
    candidates = [
        (routing_figures(replace(figures), np.stack(s), np.stack(loc).astype(np.uint8)), name)
        for name, (s, loc) in routed.items()
    ]
    # the first of the best (routing_figures sets every candidate's agreement)
    return max(candidates, key=lambda c: c[0].route_agreement or 0.0)
