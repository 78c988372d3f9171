"""Everything that configures a reference deployment (names, replicas, timings, faults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pytest_rlrollout import refmodel
from pytest_rlrollout.deployment.faults import check_faults

Transition = Literal["ASYNC", "SYNC"]


@dataclass(frozen=True)
class Settings:
    bucket: Path
    account: str = "rlrollout"
    deployment_id: str = "reference"
    model: str = refmodel.MODEL_NAME
    api_key: str = "rl-reference-key"
    replicas: int = 2
    transition: Transition = "ASYNC"
    base_identity: str = refmodel.BASE_IDENTITY
    load_delay: float = 0.0  # seconds a replica spends downloading + loading a snapshot
    stagger: float = 0.0  # extra load delay per replica index, so replica swaps are staggered
    swap_delay: float = 0.0  # seconds a replica pauses at the swap itself
    token_delay: float = 0.0  # seconds per decode step, so streams last long enough to observe
    drain_timeout: float = 90.0  # default x-fireworks-hot-load-drain-timeout
    block_size: int = 16  # prompt-cache granularity (tokens)
    cache_entries: int = 256  # prompt-cache entries per replica
    max_context: int = 2048
    seed: int = 0
    faults: frozenset[str] = field(default_factory=frozenset)

    @property
    def deployment(self) -> str:
        return f"accounts/{self.account}/deployments/{self.deployment_id}"

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", check_faults(self.faults))

    def fault(self, clause: str) -> bool:
        return clause in self.faults
