"""Replicas in the hot-load status's shape, and how a wait for a snapshot ended: what every
driver's status and `Driver.wait` speak, whatever the engine's own wire."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from pytest_rlrollout.remote.stream import as_object

BUSY_STAGES = ("pending", "downloading", "loading", "swapping", "draining")
FIRST_POLL = 0.01  # waits poll at once, then back off to their interval


class WaitEnd(enum.Enum):
    """How a wait for a snapshot ended; verdicts branch on this, never on the message's words."""

    SERVED = "served"  # every replica serves it
    UNREADABLE = "unreadable"  # the status answered 200 but its replicas cannot be read (HL-GET-1)
    FAILED = "failed"  # a replica reported stage 'error' for it
    STALLED = "stalled"  # some replicas serve it and none is loading any more (a rollout that stopped)
    TIMED_OUT = "timed out"  # not served everywhere by the deadline


@dataclass(frozen=True)
class Waited:
    """How a wait for a snapshot ended (`end`), after how long, the replicas as last read, and
    what to tell a person when it was not served (`error`)."""

    end: WaitEnd
    seconds: float
    replicas: list[dict[str, Any]]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.end is WaitEnd.SERVED


def loading_state(replica: dict[str, Any]) -> dict[str, Any]:
    """A replica's `loading_state`, {} when the deployment sent something other than an object."""
    return as_object(replica.get("loading_state"))


def busy(replica: dict[str, Any]) -> bool:
    """The replica is loading or swapping a snapshot."""
    stage = loading_state(replica).get("stage")
    return isinstance(stage, str) and stage in BUSY_STAGES


def serves(replica: dict[str, Any], identity: str, lora: bool = False) -> bool:
    """The replica is ready and serves `identity` (LoRA: lists it as a loaded adapter)."""
    if not replica.get("readiness"):
        return False
    if lora:
        adapters = replica.get("loaded_adapters")
        return isinstance(adapters, list) and any(
            as_object(a).get("identity") == identity and as_object(a).get("status") == "loaded" for a in adapters
        )
    return replica.get("current_snapshot_identity") == identity
