"""Clause outcomes: from test reports to a per-clause verdict, rolled up by area and level.

Data flows one way: catalogue → test reports (outcome + evidence) → one outcome per clause →
JSON / Markdown / HTML / terminal. When several tests judge one clause, the most telling outcome
wins (`SEVERITY`), and its test's evidence is the row's.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_rlrollout.contract import SEVERITY, Outcome, catalogue, worst
from pytest_rlrollout.suite.evidence import evidence_of
from pytest_rlrollout.suite.outcomes import outcome_of

CONTRACT_DOC = "docs/contract.md (or `rlrollout clauses --format md`)"
SUFFIXES = (".json", ".md", ".html")


@dataclass
class TestResult:
    """One test's outcome and the evidence for it."""

    test: str
    outcome: Outcome = Outcome.PASS
    reason: str = ""  # fail/error: the assertion message; unjudged: why; pass: empty
    observed: str = ""  # what the test observed (what a pass rests on)
    exchanges: list[str] = field(default_factory=list)  # requests and answers behind a failure
    timeline: dict[str, Any] | None = None  # a swap test's observations over time
    uploads: list[dict[str, Any]] = field(default_factory=list)  # snapshots the test built and what they cost
    figures: dict[str, Any] | None = None  # numbers the test reports (NUM figures, FID's max |Δ|)
    duration: float = 0.0

    @property
    def evidence(self) -> str:
        """The one-line case for this outcome: the reason, else the observation."""
        return self.reason or (f"observed: {self.observed}" if self.observed else "")


@dataclass
class ClauseResult:
    clause: str
    level: str
    area: str
    rule: str
    outcome: Outcome = Outcome.PASS
    evidence: str = ""  # the deciding test's case
    tests: list[TestResult] = field(default_factory=list)
    duration: float = 0.0

    def add(self, t: TestResult) -> None:
        self.tests.append(t)
        self.duration += t.duration
        self.outcome = worst(self.outcome, t.outcome)
        deciding = next(x for x in self.tests if x.outcome == self.outcome)
        self.evidence = deciding.evidence


class Collector:
    """Gathers the outcome of every clause-tagged test (xdist workers' reports included): the
    worst of its setup, call and teardown phases, with the call's evidence."""

    def __init__(self) -> None:
        self.by_test: dict[str, tuple[list[str], TestResult]] = {}

    def record(self, report: pytest.TestReport) -> None:
        clauses = [v for k, v in report.user_properties if k == "rl_clause"]
        if not clauses:
            return
        outcome, reason = outcome_of(report)
        _, t = self.by_test.setdefault(report.nodeid, (clauses, TestResult(report.nodeid)))
        t.duration += report.duration
        evidence = evidence_of(report)
        if evidence:
            t.observed, t.exchanges, t.timeline = evidence["observed"], evidence["exchanges"], evidence["timeline"]
            t.uploads, t.figures = evidence.get("uploads") or [], evidence.get("figures")
            if outcome in (Outcome.FAIL, Outcome.ERROR) and evidence.get("assertion"):
                reason = evidence["assertion"]
        if outcome.severity < t.outcome.severity:
            t.outcome, t.reason = outcome, reason

    def clauses(self) -> dict[str, ClauseResult]:
        cat = catalogue()
        out: dict[str, ClauseResult] = {}
        for clauses, t in (self.by_test[k] for k in sorted(self.by_test)):
            for cid in clauses:
                c = cat[cid]
                out.setdefault(cid, ClauseResult(cid, c.level, c.area, c.rule)).add(t)
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


def capability_rows(discovery: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The capability table: name, whether the deployment has it, what the probe saw, and
    whether its profile requires it."""
    if not discovery:
        return []
    from pytest_rlrollout.contract.capabilities import CAPABILITIES

    profile = discovery["profile"]
    has, seen = discovery["capabilities"], discovery["seen"]
    return [
        {"name": n, "has": has[n], "seen": seen.get(n, c.probe), "about": c.about, "required": c.required(profile)}
        for n, c in CAPABILITIES.items()
        if n in has
    ]


def document(
    results: dict[str, ClauseResult], provenance: dict[str, Any], discovery: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "provenance": provenance,
        "contract": CONTRACT_DOC,
        "profile": {"name": discovery["profile"], "decided": discovery["decided"]} if discovery else None,
        "capabilities": capability_rows(discovery),
        "summary": rollup(results),
        "clauses": {k: asdict(v) for k, v in results.items()},
    }


def _cell(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return (text[: limit - 1] + "…" if len(text) > limit else text).replace("|", "\\|")


def markdown(doc: dict[str, Any]) -> str:
    order = [str(o) for o in reversed(SEVERITY)]
    lines = ["# RL-rollout deployment conformance report", ""]
    lines += [f"- **{k}**: {v}" for k, v in doc["provenance"].items()]
    if doc.get("profile"):
        lines += [f"- **profile**: {doc['profile']['name']} ({doc['profile']['decided']})"]
    lines += [f"- **contract**: {doc['contract']}"]
    lines += ["", "## Summary", "", "| | " + " | ".join(order) + " |", "|---" * (len(order) + 1) + "|"]
    for group in ("levels", "areas"):
        for name, counts in doc["summary"][group].items():
            lines.append(f"| {name} | " + " | ".join(str(counts.get(v, 0)) for v in order) + " |")
    if doc.get("capabilities"):
        lines += ["", "## Capabilities", "", "| capability | offered | required | seen |", "|---|---|---|---|"]
        for c in doc["capabilities"]:
            lines.append(f"| {c['name']} | {'yes' if c['has'] else 'no'} | {'yes' if c['required'] else ''} | "
                         f"{_cell(c['seen'])} |")  # fmt: skip
    lines += ["", "## Clauses", "", "| clause | level | outcome | rule | evidence |", "|---|---|---|---|---|"]
    for cid, r in doc["clauses"].items():
        lines.append(f"| {cid} | {r['level']} | {r['outcome']} | {_cell(r['rule'])} | {_cell(r['evidence'])} |")
    failed = [(cid, t) for cid, r in doc["clauses"].items() for t in r["tests"] if t["outcome"] in ("fail", "error")]
    if failed:
        lines += ["", "## Failures", ""]
        for cid, t in failed:
            lines += [f"### {cid}: `{t['test']}`", "", "```", t["reason"].strip(), *t["exchanges"], "```", ""]
    return "\n".join(lines) + "\n"


def paths(path: str | Path) -> tuple[Path, Path, Path]:
    """The report's three files: `path` (JSON), and .md and .html beside it."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in SUFFIXES else path
    return stem.with_suffix(".json"), stem.with_suffix(".md"), stem.with_suffix(".html")


def write(path: str | Path, doc: dict[str, Any]) -> tuple[Path, Path, Path]:
    """The JSON report at `path`, with the Markdown and HTML reports beside it."""
    from pytest_rlrollout.suite.html import html

    out = paths(path)
    out[0].parent.mkdir(parents=True, exist_ok=True)
    out[0].write_text(json.dumps(doc, indent=2) + "\n")
    out[1].write_text(markdown(doc))
    out[2].write_text(html(doc))
    return out
