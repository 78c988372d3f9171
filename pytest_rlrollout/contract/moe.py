"""R3's terms for a Mixture-of-Experts config: L (MoE layers), k (experts per token), E (experts).

The families name these differently; every convention below is in published configs
(transformers 5 writes Qwen3-MoE's expert count as `num_local_experts`, the published
Qwen3-30B-A3B config says `num_experts`, DeepSeek says `n_routed_experts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def num_experts(config: Mapping[str, Any]) -> int:
    """E, or 0 for a dense model."""
    for key in EXPERT_COUNT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def moe_layers(config: Mapping[str, Any]) -> list[int]:
    """Indices of the MoE layers (layers not in `mlp_only_layers`, honouring `decoder_sparse_step`,
    `first_k_dense_replace` and `moe_layer_freq`)."""
    if num_experts(config) == 0:
        return []
    dense = set(config.get("mlp_only_layers") or [])
    step = config.get("decoder_sparse_step") or 1
    first_dense = config.get("first_k_dense_replace") or 0
    freq = config.get("moe_layer_freq") or 1
    return [
        i
        for i in range(config["num_hidden_layers"])
        if i not in dense and (i + 1) % step == 0 and i >= first_dense and (i - first_dense) % freq == 0
    ]


@dataclass(frozen=True)
class MoeShape:
    layers: int  # L
    k: int  # experts per token
    experts: int  # E


def moe_shape(config: Mapping[str, Any] | None) -> MoeShape | None:
    """(L, k, E) of an MoE config, or None for a dense model or no config."""
    if not config or not num_experts(config):
        return None
    return MoeShape(len(moe_layers(config)), config["num_experts_per_tok"], num_experts(config))
