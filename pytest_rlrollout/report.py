"""Clause outcomes: from test reports to a per-clause verdict, rolled up by area and level.

Tests say why they did not judge a clause through `not_applicable`, `unsupported` and
`inconclusive` (pytest skips with a typed reason); failures and errors come from pytest itself.
Data flows one way: catalogue → test reports → Outcome per clause → JSON / Markdown / terminal.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from pytest_rlrollout.catalogue import catalogue

Verdict = Literal["pass", "fail", "unsupported", "not-applicable", "inconclusive", "error"]
# When several tests judge one clause, the most telling outcome wins.
SEVERITY: tuple[Verdict, ...] = ("error", "fail", "inconclusive", "unsupported", "not-applicable", "pass")
TYPED_SKIPS: tuple[Verdict, ...] = ("not-applicable", "unsupported", "inconclusive")


def not_applicable(reason: str) -> None:
    pytest.skip(f"not-applicable: {reason}")


def unsupported(reason: str) -> None:
    pytest.skip(f"unsupported: {reason}")


def inconclusive(reason: str) -> None:
    pytest.skip(f"inconclusive: {reason}")


def verdict_of(report: pytest.TestReport) -> tuple[Verdict, str]:
    """The lattice outcome of one test phase report, with its evidence text."""
    if report.passed:
        return "pass", ""
    if getattr(report, "wasxfail", "").startswith("rl-should-failure:"):  # judged, not counted (--rl-level=must)
        return "fail", "\n".join(report.longreprtext.strip().splitlines()[-12:])
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        for typed in TYPED_SKIPS:
            if reason.startswith(f"{typed}: "):
                return typed, reason[len(typed) + 2 :]
        return "inconclusive", f"skipped without a typed outcome: {reason}"
    text = report.longreprtext.strip().splitlines()
    evidence = "\n".join(text[-12:])
    return ("fail" if report.when == "call" else "error"), evidence


@dataclass
class ClauseResult:
    clause: str
    level: str
    area: str
    outcome: Verdict = "pass"
    tests: list[dict[str, Any]] = field(default_factory=list)
    duration: float = 0.0

    def add(self, nodeid: str, verdict: Verdict, evidence: str, duration: float) -> None:
        self.tests.append({"test": nodeid, "outcome": verdict, "evidence": evidence})
        self.duration += duration
        if SEVERITY.index(verdict) < SEVERITY.index(self.outcome):
            self.outcome = verdict


class Collector:
    """Gathers the outcome of every clause-tagged test (worker reports included): the worst of
    its setup, call and teardown phases."""

    def __init__(self) -> None:
        self.by_test: dict[str, list[Any]] = {}  # nodeid -> [clauses, verdict, evidence, seconds]

    def record(self, report: pytest.TestReport) -> None:
        clauses = [v for k, v in report.user_properties if k == "rl_clause"]
        if not clauses:
            return
        verdict, evidence = verdict_of(report)
        entry = self.by_test.setdefault(report.nodeid, [clauses, "pass", "", 0.0])
        entry[3] += report.duration
        if SEVERITY.index(verdict) < SEVERITY.index(entry[1]):
            entry[1], entry[2] = verdict, evidence

    def clauses(self) -> dict[str, ClauseResult]:
        cat = catalogue()
        out: dict[str, ClauseResult] = {}
        for nodeid, (clauses, verdict, evidence, duration) in sorted(self.by_test.items()):
            for cid in clauses:
                c = cat[cid]
                out.setdefault(cid, ClauseResult(cid, c.level, c.area)).add(nodeid, verdict, evidence, duration)
        return dict(sorted(out.items()))


def rollup(results: dict[str, ClauseResult]) -> dict[str, dict[str, dict[str, int]]]:
    """Counts of outcomes by area and by level."""
    areas: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    levels: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in results.values():
        areas[r.area][r.outcome] += 1
        levels[r.level][r.outcome] += 1
    return {
        "areas": {k: dict(v) for k, v in sorted(areas.items())},
        "levels": {k: dict(v) for k, v in sorted(levels.items())},
    }


def document(results: dict[str, ClauseResult], provenance: dict[str, Any]) -> dict[str, Any]:
    return {"provenance": provenance, "summary": rollup(results), "clauses": {k: asdict(v) for k, v in results.items()}}


def markdown(doc: dict[str, Any]) -> str:
    p = doc["provenance"]
    lines = ["# RL-rollout deployment conformance report", ""]
    lines += [f"- **{k}**: {v}" for k, v in p.items()]
    lines += ["", "## Summary", "", "| | " + " | ".join(SEVERITY[::-1]) + " |", "|---" * (len(SEVERITY) + 1) + "|"]
    for group in ("levels", "areas"):
        for name, counts in doc["summary"][group].items():
            lines.append(f"| {name} | " + " | ".join(str(counts.get(v, 0)) for v in SEVERITY[::-1]) + " |")
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
