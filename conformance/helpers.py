"""Small helpers the conformance modules share."""

from __future__ import annotations

import hashlib


def unique_prompt(name: str, n: int = 80, vocab: int = 500) -> list[int]:
    """A prompt no other test sends (tests share one deployment and its prompt cache)."""
    seed = hashlib.sha256(name.encode()).digest()
    return [(seed[i % 32] * 7 + i * 13) % (vocab - 20) + 10 for i in range(n)]


def moe_shape(config: dict | None) -> tuple[int, int, int] | None:
    """(L, k, E) of an MoE base config, or None for a dense model or no config."""
    if not config:
        return None
    from pytest_rlrollout.refmodel import moe_layers, num_experts

    experts = num_experts(config)
    if not experts:
        return None
    return len(moe_layers(config)), config["num_experts_per_tok"], experts
