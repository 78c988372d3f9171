"""Sampling a token from logits: greedy, temperature, top-k and top-p, with the logprob the
model gives the token and the logprob under the distribution it was actually drawn from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pytest_rlrollout.reference.model import log_softmax


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> tuple[int, float, float]:
    """(token, logprob under the model, logprob under the sampling distribution)."""
    logprobs = log_softmax(logits.astype(np.float64))
    if params.temperature <= 0:
        token = int(np.argmax(logits))
        return token, float(logprobs[token]), 0.0
    scaled = logits.astype(np.float64) / params.temperature
    keep = np.ones_like(scaled, dtype=bool)
    top_k = int(params.top_k)
    if 0 < top_k < scaled.size:  # at or beyond the vocabulary, top-k keeps every token
        kth = np.partition(scaled, -top_k)[-top_k]
        keep &= scaled >= kth
    probs = np.exp(log_softmax(np.where(keep, scaled, -np.inf)))
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        cut = order[np.searchsorted(cum, params.top_p) + 1 :]
        probs[cut] = 0.0
        probs /= probs.sum()
    if not np.all(np.isfinite(probs)):  # NaN logits: fail this sequence with a message that says so
        raise ValueError(f"no sampling distribution for temperature {params.temperature} (non-finite logits)")
    token = int(rng.choice(len(probs), p=probs))
    return token, float(logprobs[token]), float(np.log(probs[token]))
