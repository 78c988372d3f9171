"""A diagnosis as the report holds it (`rlrollout diagnose`): each cause's gap against its
threshold, each replica's weights against the trainer's numbers, and the picture drawn from them.
Its JSON is the document `runs.diagnose.Diagnosis.as_dict` writes (`schemas/diagnosis.schema.json`),
with the picture files named once the report is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_rlrollout.runs.diagnose import json_gap, verdict
from pytest_rlrollout.suite.report.fields import ReportError, as_object, as_strings


def gap_of(value: Any) -> float | None:
    """A gap as the JSON spells it (a number, "inf", "nan", or null: not measured)."""
    return None if value is None else float(value)


@dataclass(frozen=True)
class CauseFinding:
    """One cause, measured: its gap (None: not measured, `detail` says why) against its threshold."""

    cause: str
    gap: float | None
    threshold: float
    blamed: bool
    detail: str
    figures: tuple[tuple[str, float | None], ...] = ()
    replicas: tuple[str, ...] = ()  # the replicas it is found on

    @property
    def verdict(self) -> str:
        return verdict(self.cause, self.gap, self.blamed)

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "gap": json_gap(self.gap),
            "threshold": self.threshold,
            "blamed": self.blamed,
            "measured": self.gap is not None,
            "detail": self.detail,
            "figures": {k: json_gap(v) for k, v in self.figures},
            "replicas": list(self.replicas),
        }

    @classmethod
    def from_json(cls, doc: Any) -> CauseFinding:
        doc = as_object(doc, "diagnosis: finding")
        figures = as_object(doc.get("figures") or {}, "diagnosis: figures")
        return cls(
            str(doc["cause"]),
            gap_of(doc.get("gap")),
            float(doc["threshold"]),
            bool(doc["blamed"]),
            str(doc.get("detail") or ""),
            tuple((str(k), gap_of(v)) for k, v in figures.items()),
            as_strings(doc.get("replicas") or [], "diagnosis: finding's replicas"),
        )


@dataclass(frozen=True)
class ReplicaWeights:
    """One replica's canary, scored fresh, against the trainer's numbers."""

    replica: str
    label: str | None
    max_abs: float
    mean_abs: float
    worst_token: int
    blamed: bool  # it serves other weights than the trainer's

    def to_json(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "label": self.label,
            "max_abs_dlogprob": json_gap(self.max_abs),
            "mean_abs_dlogprob": json_gap(self.mean_abs),
            "worst_token": self.worst_token,
            "blamed": self.blamed,
        }

    @classmethod
    def from_json(cls, doc: Any) -> ReplicaWeights:
        doc = as_object(doc, "diagnosis: replica")
        label = doc.get("label")
        return cls(
            str(doc["replica"]),
            None if label is None else str(label),
            float(doc["max_abs_dlogprob"]),
            float(doc["mean_abs_dlogprob"]),
            int(doc["worst_token"]),
            bool(doc["blamed"]),
        )


@dataclass(frozen=True)
class DiagnosisSummary:
    """A diagnosis as the report shows it: the trainer's numbers it was given, the thresholds,
    every cause's finding, every replica's weights, and its picture once written."""

    source: str  # where the trainer's numbers come from
    tokens: int  # the canary's length
    label: str | None  # the version the trainer expects served
    self_tolerance: float
    numerics_band: float
    findings: tuple[CauseFinding, ...]
    replicas: tuple[ReplicaWeights, ...]
    requests: int
    seconds: float
    pictures: tuple[str, ...] = ()  # files beside the report: <stem>.diagnosis-<name>.png
    no_pictures: str | None = None

    @property
    def blamed(self) -> list[str]:
        return [f.cause for f in self.findings if f.blamed]

    def to_json(self) -> dict[str, Any]:
        return {
            "expected": {"source": self.source, "tokens": self.tokens, "label": self.label},
            "self_tolerance": self.self_tolerance,
            "numerics_band": self.numerics_band,
            "replicas": [r.to_json() for r in self.replicas],
            "findings": [f.to_json() for f in self.findings],
            "blamed": self.blamed,
            "requests": self.requests,
            "seconds": self.seconds,
            "pictures": list(self.pictures),
            "no_pictures": self.no_pictures,
        }

    @classmethod
    def from_json(cls, doc: Any) -> DiagnosisSummary:
        """The document `Diagnosis.as_dict` writes (or a report's, pictures named); ReportError
        saying what is wrong otherwise."""
        doc = as_object(doc, "diagnosis")
        try:
            expected = as_object(doc["expected"], "diagnosis: expected")
            label = expected.get("label")
            return cls(
                str(expected["source"]),
                int(expected["tokens"]),
                None if label is None else str(label),
                float(doc["self_tolerance"]),
                float(doc["numerics_band"]),
                tuple(CauseFinding.from_json(f) for f in doc["findings"]),
                tuple(ReplicaWeights.from_json(r) for r in doc["replicas"]),
                int(doc["requests"]),
                float(doc["seconds"]),
                tuple(as_strings(doc.get("pictures") or [], "diagnosis: pictures")),
                doc.get("no_pictures"),
            )
        except KeyError as e:
            raise ReportError(f"diagnosis: no {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ReportError(f"diagnosis: {e}") from None
