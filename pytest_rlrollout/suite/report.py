"""Clause outcomes: from test reports to a per-clause verdict, rolled up by area and level.

Data flows one way: catalogue → test reports → one outcome per clause → JSON / Markdown /
terminal. When several tests judge one clause, the most telling outcome wins (`SEVERITY`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_rlrollout.contract import SEVERITY, Outcome, catalogue, worst
from pytest_rlrollout.suite.outcomes import outcome_of

CONTRACT_DOC = "docs/contract.md (or `rlrollout clauses --format md`)"


@dataclass
class ClauseResult:
    clause: str
    level: str
    area: str
    rule: str
    outcome: Outcome = Outcome.PASS
    tests: list[dict[str, Any]] = field(default_factory=list)
    duration: float = 0.0

    def add(self, nodeid: str, outcome: Outcome, evidence: str, duration: float) -> None:
        self.tests.append({"test": nodeid, "outcome": outcome, "evidence": evidence})
        self.duration += duration
        self.outcome = worst(self.outcome, outcome)


@dataclass
class _TestRecord:
    clauses: list[str]
    outcome: Outcome = Outcome.PASS
    evidence: str = ""
    duration: float = 0.0


class Collector:
    """Gathers the outcome of every clause-tagged test (xdist workers' reports included): the
    worst of its setup, call and teardown phases."""

    def __init__(self) -> None:
        self.by_test: dict[str, _TestRecord] = {}

    def record(self, report: pytest.TestReport) -> None:
        clauses = [v for k, v in report.user_properties if k == "rl_clause"]
        if not clauses:
            return
        outcome, evidence = outcome_of(report)
        entry = self.by_test.setdefault(report.nodeid, _TestRecord(clauses))
        entry.duration += report.duration
        if outcome.severity < entry.outcome.severity:
            entry.outcome, entry.evidence = outcome, evidence

    def clauses(self) -> dict[str, ClauseResult]:
        cat = catalogue()
        out: dict[str, ClauseResult] = {}
        for nodeid, t in sorted(self.by_test.items()):
            for cid in t.clauses:
                c = cat[cid]
                result = out.setdefault(cid, ClauseResult(cid, c.level, c.area, c.rule))
                result.add(nodeid, t.outcome, t.evidence, t.duration)
        order = {c.id: i for i, c in enumerate(cat)}
        return dict(sorted(out.items(), key=lambda kv: order[kv[0]]))


def rollup(results: dict[str, ClauseResult]) -> dict[str, dict[str, dict[str, int]]]:
    """Counts of outcomes by level and by area."""
    areas: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    levels: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in results.values():
        areas[r.area][r.outcome] += 1
        levels[r.level][r.outcome] += 1
    return {
        "levels": {k: dict(levels[k]) for k in ("MUST", "SHOULD", "MAY") if k in levels},
        "areas": {k: dict(v) for k, v in areas.items()},
    }


def document(results: dict[str, ClauseResult], provenance: dict[str, Any]) -> dict[str, Any]:
    return {
        "provenance": provenance,
        "contract": CONTRACT_DOC,
        "summary": rollup(results),
        "clauses": {k: asdict(v) for k, v in results.items()},
    }


def markdown(doc: dict[str, Any]) -> str:
    order = [str(o) for o in reversed(SEVERITY)]
    lines = ["# RL-rollout deployment conformance report", ""]
    lines += [f"- **{k}**: {v}" for k, v in doc["provenance"].items()]
    lines += [f"- **contract**: {doc['contract']}"]
    lines += ["", "## Summary", "", "| | " + " | ".join(order) + " |", "|---" * (len(order) + 1) + "|"]
    for group in ("levels", "areas"):
        for name, counts in doc["summary"][group].items():
            lines.append(f"| {name} | " + " | ".join(str(counts.get(v, 0)) for v in order) + " |")
    lines += ["", "## Clauses", "", "| clause | level | outcome | seconds | evidence |", "|---|---|---|---|---|"]
    for cid, r in doc["clauses"].items():
        evidence = next((t["evidence"] for t in r["tests"] if t["outcome"] == r["outcome"] and t["evidence"]), "")
        evidence = evidence.replace("|", "\\|").replace("\n", " ")[:160]
        lines.append(f"| {cid} | {r['level']} | {r['outcome']} | {r['duration']:.2f} | {evidence} |")
    return "\n".join(lines) + "\n"


def write(path: str | Path, doc: dict[str, Any]) -> tuple[Path, Path]:
    """`path` (JSON) and the same name with .md beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    md = path.with_suffix(".md")
    md.write_text(markdown(doc))
    return path, md
