"""What a soak's rollout workers are told: where the deployment is and what rollouts to run.

The soak writes its plan as JSON for the Locust master, which hands it to every worker that
connects (workers on other machines need nothing but the master's address). The API key is never
part of it: each Locust process reads it from its own environment (`KEY_ENV`), so it crosses no
wire of the soak's and lands in no file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from pytest_rlrollout.engines import Engine

PLAN_ENV = "RLROLLOUT_SOAK_PLAN"  # the plan file's path, in the master's environment
KEY_ENV = "RLROLLOUT_SOAK_API_KEY"  # the deployment's API key, in every Locust process's environment
# The soak's process id, in the environment of the Locust processes it starts (not of workers on
# other machines): they end when it is gone, however it went (SIGKILL included).
PARENT_ENV = "RLROLLOUT_SOAK_PARENT"
SESSION_HEADER = "x-multi-turn-session-id"
EVENT_PREFIX = "SOAK "  # the hub's lines on its stdout for the soak (Locust's own logs go to stderr)


@dataclass(frozen=True)
class Plan:
    """The deployment (as `remote.client.Target` has it, less the key) and the rollouts."""

    engine: Engine
    base_url: str
    model: str
    deployment: str | None = None
    inference_url: str = ""
    bucket: str | None = None  # where the engine reads snapshots from (vLLM's driver needs it)
    members: tuple[str, ...] = ()  # a fleet's engines, where the suite reaches each itself (`Target.members`)
    vocab: int = 512  # token ids are drawn below it
    turns: int = 4  # per rollout
    max_tokens: int = 32  # per turn
    max_context: int = 1024
    think: tuple[float, float] = (0.0, 0.05)  # seconds a rollout waits between turns (least, most)
    routing: bool = False  # ask for routing matrices (R3)
    seed: int = 0
    grace: float = 0.5  # seconds after a worker heard a swap served before its chunks must name it
    timeout: float = 60.0  # per request
    t0: float = 0.0  # the soak's start, wall-clock seconds (each worker's times count from it)
    # what the soak's probes found (`Discovery.as_dict`): a worker's driver adopts it, as an xdist
    # worker's does, and sends what the deployment was found to answer (vLLM: its generate route)
    discovery: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.turns < 1 or self.max_tokens < 1 or self.vocab < 2:
            raise ValueError(f"a plan needs turns, tokens and a vocabulary: {self}")
        if not 0 <= self.think[0] <= self.think[1]:
            raise ValueError(f"think time (least, most): {self.think}")
        if self.grace < 0 or self.timeout <= 0:
            raise ValueError(f"grace {self.grace} and timeout {self.timeout}: grace >= 0, timeout > 0")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Plan:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ValueError(f"unknown plan fields {unknown} (a worker of another version?)")
        return cls(**{**doc, "think": tuple(doc.get("think", (0.0, 0.05))), "members": tuple(doc.get("members", ()))})

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path
