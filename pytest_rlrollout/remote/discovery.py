"""What answers, and what it offers: the types the preflight and the capability probes fill
(`Answered`, `Discovery`) and the few helpers every driver's probes share. A leaf: it imports
no driver, so the drivers import it and `remote.preflight` runs them.

Nothing here changes a deployment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from pytest_rlrollout.contract.capabilities import CAPABILITIES
from pytest_rlrollout.engines import Engine
from pytest_rlrollout.remote.limits import LimitExceeded

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.stream import Stream

PROBE_TEXT = "Hello"
PROBE_IDS = [1, 2, 3]


class PreflightError(Exception):
    """The run cannot judge this deployment; the message says what to fix."""


@dataclass
class Discovery:
    """The deployment's engine and capabilities, each with how the probe saw it."""

    engine: Engine
    decided: str  # how the engine was chosen
    capabilities: dict[str, bool] = field(default_factory=dict)
    seen: dict[str, str] = field(default_factory=dict)  # capability -> what the probe observed
    replicas: int = 0
    transition: str | None = None
    # the base's fingerprint as the deployment served it before the run loaded anything (its own
    # start-up load: no later load path can show it again): {"identity", "logprobs"}, or None
    start: dict[str, Any] | None = None
    version: str | None = None  # the engine's version, where it says (vLLM: GET /version)
    # routes of the engine's own found answering, which a driver sends to when they do (vLLM's
    # /inference/v1/generate): an xdist or Locust worker's driver adopts them without probing
    routes: list[str] = field(default_factory=list)

    def has(self, name: str) -> bool:
        if name not in CAPABILITIES:
            raise KeyError(f"unknown capability {name!r} (known: {', '.join(CAPABILITIES)})")
        return self.capabilities.get(name, False)

    def table(self) -> list[tuple[str, str, str]]:
        """(capability, yes/no, what was seen) rows, in vocabulary order."""
        rows = []
        for name, cap in CAPABILITIES.items():
            if name in self.capabilities:
                rows.append((name, "yes" if self.capabilities[name] else "no", self.seen.get(name, cap.probe)))
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "decided": self.decided,
            "capabilities": self.capabilities,
            "seen": self.seen,
            "replicas": self.replicas,
            "transition": self.transition,
            "start": self.start,
            "version": self.version,
            "routes": self.routes,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Discovery:
        return cls(**doc)


@dataclass
class Answered:
    """What the preflight's first reads found, for the drivers to recognise their engine by (and
    to check the names given against): the hot-load status, whether it or the control plane
    answered, and what an engine's own probe read (each read once)."""

    status: httpx.Response
    hot_load_api: bool
    control_plane: bool
    reads: dict[str, Any] = field(default_factory=dict)

    def read(self, key: str, ask: Callable[[], Any]) -> Any:
        if key not in self.reads:
            self.reads[key] = ask()
        return self.reads[key]


def get(client: DeploymentClient, url: str, headers: dict[str, str], option: str) -> httpx.Response:
    try:
        return client.request("GET", url, headers=headers)
    except (httpx.HTTPError, LimitExceeded) as e:
        raise PreflightError(f"nothing answers at {url} ({type(e).__name__}: {e}): check {option}") from None


def excerpt(r: httpx.Response) -> str:
    return r.text[:200]


def mark(d: Discovery, name: str, value: bool, seen: str) -> None:
    """Record what the probe of capability `name` saw."""
    d.capabilities[name] = bool(value)
    d.seen[name] = seen


def said(s: Stream) -> str:
    """A probe's answer in a few words, for the capability table."""
    return "HTTP 200" if s.ok else f"HTTP {s.status} {(s.body or '; '.join(s.problems))[:120]}"
