"""A soak's figures as the report holds them (`soak.summary` makes them): rows of figures, each
swap, each replica, and the series the pictures draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from pytest_rlrollout.suite.report.fields import ReportError, Scalar, as_object, as_strings


@dataclass(frozen=True)
class SoakSwap:
    """One of a soak's swaps: when (seconds since the soak began), the stall the streams across it
    saw (each stream's longest gap between chunks), and the least any replica's fingerprint moved."""

    epoch: int
    identity: str
    kind: str  # full, incremental
    reset: str  # its reset_prompt_cache
    signalled_at: float
    served_at: float | None  # None: never served everywhere (`error` says why)
    streams: int = 0  # streams in flight across it
    stall_p50: float | None = None
    stall_p99: float | None = None
    stall_max: float | None = None
    moved: float | None = None  # max |Δlogprob| of the replica whose fingerprint moved least
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class SoakReplica:
    """What one replica (a fleet: one engine) served through a soak, as the answers named it, and
    how its fingerprint moved across the swaps (FID-SWAP-1 judges each move)."""

    name: str
    turns: int
    tokens: int
    errors: int = 0
    ttft_p50: float | None = None  # seconds
    ttft_p99: float | None = None
    gap_p99: float | None = None
    fingerprinted: int = 0  # swaps after which its fingerprint was read
    moved: int = 0  # ... and moved past the tolerance
    least_moved: float | None = None  # max |Δlogprob| on the swap it moved least

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class SoakSummary:
    """A soak's figures as the report shows them (`soak.summary` makes one): rows of figures,
    each swap, series over time for the pictures, and the pictures written beside the report."""

    rows: tuple[tuple[str, Scalar], ...]
    swaps: tuple[SoakSwap, ...] = ()
    # name (tokens_per_s, ttft_p50, ttft_p99, gap_p50, gap_p99) -> (seconds since the start, value)
    series: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    pictures: tuple[str, ...] = ()  # files beside the report: <stem>.soak-<name>.png
    no_pictures: str | None = None
    replicas: tuple[SoakReplica, ...] = ()  # per replica the answers named (a fleet: per engine)

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [list(r) for r in self.rows],
            "swaps": [s.to_json() for s in self.swaps],
            "series": {k: [list(p) for p in v] for k, v in self.series.items()},
            "pictures": list(self.pictures),
            "no_pictures": self.no_pictures,
            "replicas": [r.to_json() for r in self.replicas],
        }

    @classmethod
    def from_json(cls, doc: Any) -> SoakSummary:
        doc = as_object(doc, "soak")
        try:
            return cls(
                tuple((str(k), v) for k, v in doc["rows"]),
                tuple(SoakSwap(**as_object(s, "soak: swap")) for s in doc.get("swaps") or []),
                {
                    str(k): tuple((float(t), float(x)) for t, x in v)
                    for k, v in as_object(doc.get("series") or {}, "soak: series").items()
                },
                tuple(as_strings(doc.get("pictures") or [], "soak: pictures")),
                doc.get("no_pictures"),
                tuple(SoakReplica(**as_object(r, "soak: replica")) for r in doc.get("replicas") or []),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ReportError(f"soak: {e}") from None
