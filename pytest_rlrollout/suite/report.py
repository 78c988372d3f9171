"""Clause outcomes: from test reports to a per-clause verdict, rolled up by area and level.

Data flows one way: catalogue → test reports (outcome + evidence) → one outcome per clause →
JSON / Markdown / HTML / terminal. When several tests judge one clause, the most telling outcome
wins (`SEVERITY`), and its test's evidence is the row's.
"""

from __future__ import annotations

import contextlib
import glob
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from pytest_rlrollout.contract import SEVERITY, Outcome, catalogue, roll_up
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
        self.outcome = roll_up([x.outcome for x in self.tests])
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
    whether its engine requires it."""
    if not discovery:
        return []
    from pytest_rlrollout.contract.capabilities import CAPABILITIES

    engine = discovery["engine"]
    has, seen = discovery["capabilities"], discovery["seen"]
    return [
        {"name": n, "has": has[n], "seen": seen.get(n, c.probe), "about": c.about, "required": c.required(engine)}
        for n, c in CAPABILITIES.items()
        if n in has
    ]


def document(
    results: dict[str, ClauseResult], provenance: dict[str, Any], discovery: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "provenance": provenance,
        "contract": {"version": catalogue().version, "document": CONTRACT_DOC},
        "engine": {"name": discovery["engine"], "decided": discovery["decided"], "version": discovery.get("version")}
        if discovery
        else None,
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
    if doc.get("engine"):
        lines += [f"- **engine**: {doc['engine']['name']} ({doc['engine']['decided']})"]
    lines += [f"- **contract**: {doc['contract']['document']}, version {doc['contract']['version']}"]
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
        note = figures_note(deciding(r).get("figures"))
        evidence = f"{r['evidence']} ({note})" if note else r["evidence"]
        lines.append(f"| {cid} | {r['level']} | {r['outcome']} | {_cell(r['rule'])} | {_cell(evidence)} |")
    lines += _numerics_markdown(doc) + _uploads_markdown(doc)
    failed = [(cid, t) for cid, r in doc["clauses"].items() for t in r["tests"] if t["outcome"] in ("fail", "error")]
    if failed:
        lines += ["", "## Failures", ""]
        for cid, t in failed:
            lines += [f"### {cid}: `{t['test']}`", "", "```", t["reason"].strip(), *t["exchanges"], "```", ""]
    return "\n".join(lines) + "\n"


def deciding(clause: dict[str, Any]) -> dict[str, Any]:
    """The test whose outcome is the clause's (its evidence is the clause's)."""
    return next((t for t in clause["tests"] if t["outcome"] == clause["outcome"]), {})


# --------------------------------------------------------------------------- figures and uploads

# FID's small dicts of figures, as the report names them (other keys are shown as spelt)
FIGURE_LABELS = {"max_abs_delta": "max |Δ|", "min_abs_delta": "min |Δ|", "tolerance": "tolerance",
                 "changed_weights_delta": "changed weights moved", "swap_moved": "the swap moved",
                 "concurrent_streams": "concurrent streams"}  # fmt: skip


def _number(value: Any, spec: str = ".3g") -> str:
    """A figure as text; what is not a number of the kind `spec` formats (a report edited by
    hand) as it is."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            return format(value, spec)
    return str(value)


def is_numerics(figures: dict[str, Any] | None) -> bool:
    """Whether a test's figures are the NUM figures (numerics.figures.Figures), not a few numbers."""
    return isinstance(figures, dict) and "tokens" in figures


def figures_note(figures: dict[str, Any] | None) -> str:
    """A test's few figures on one line (FID's max |Δ| and tolerance); empty for none and for the
    NUM figures, which have a section of their own."""
    if not isinstance(figures, dict) or is_numerics(figures):
        return ""
    shown = [(k, v) for k, v in figures.items() if isinstance(v, int | float | str | type(None))]
    return ", ".join(f"{FIGURE_LABELS.get(k, k.replace('_', ' '))} {_number(v)}" for k, v in shown)


def numerics_tests(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(key, clause, test) of every test that reports the NUM figures; the key (the clause, with
    a number when a clause has several such tests) names its pictures."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for cid, c in doc["clauses"].items():
        mine = [t for t in c["tests"] if is_numerics(t.get("figures"))]
        out += [(cid.lower() + (f"-{i + 1}" if i else ""), cid, t) for i, t in enumerate(mine)]
    return out


def numerics_rows(figures: dict[str, Any]) -> list[tuple[str, str]]:
    """The NUM figures of one test as (figure, value) rows: the R3 paper's mismatch figures."""
    f = figures.get
    rows = [("tokens compared", _number(f("tokens"), "d")), ("mean |Δlogprob|", _number(f("mean_abs"))),
            ("max |Δlogprob|", _number(f("max_abs"))), ("k3 KL(served‖local)", _number(f("k3_kl"))),
            ("ratio outside [0.5, 2]", _number(f("ratio_outside"), ".3%"))]  # fmt: skip
    if f("route_agreement") is not None:
        rows += [("routing agreement", f"{_number(f('route_agreement'), '.3%')} of (layer, token) over "
                                       f"{_number(f('route_tokens'), 'd')} tokens"),
                 ("tokens with any layer disagreeing", _number(f("any_disagreement"), ".3%")),
                 ("agreement per MoE layer", " ".join(_number(a, ".1%") for a in f("layer_agreement") or [])),
                 ]  # fmt: skip
        if f("alignment"):
            rows.append(("routing alignment", str(f("alignment"))))
    return rows


def numerics_grid(tests: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[str, list[str]]]:
    """The NUM figures of several tests side by side: (figure, its value in each test) rows."""
    columns = [dict(numerics_rows(t["figures"])) for _, _, t in tests]
    labels = dict.fromkeys(label for c in columns for label in c)
    return [(label, [c.get(label, "") for c in columns]) for label in labels]


def numerics_pictures(doc: dict[str, Any]) -> tuple[dict[str, dict[str, bytes]], str | None]:
    """The pictures of every NUM test, key -> picture name -> PNG, and why there are none when
    they cannot be drawn (matplotlib missing)."""
    from pytest_rlrollout.numerics.figures import Figures
    from pytest_rlrollout.numerics.pictures import pictures, unavailable

    tests = numerics_tests(doc)
    if not tests:
        return {}, None
    why = unavailable()
    if why is not None:
        return {}, why
    out: dict[str, dict[str, bytes]] = {}
    drawn: set[str] = set()  # the per-token deltas whose pictures are drawn already
    for key, _, t in tests:
        try:
            figures = Figures.from_dict(t["figures"])
            seen = json.dumps([figures.deltas, figures.positions])
            if seen in drawn:  # NUM tests may share their rollouts: the same Δlogprob pictures once
                figures.deltas, figures.positions = [], []
            drawn.add(seen)
            out[key] = pictures(figures)
        except (TypeError, ValueError, KeyError) as e:
            # figures that do not draw (a report edited by hand) cost their pictures, not the report
            out[key], why = {}, f"{key}: the figures do not draw ({type(e).__name__}: {e})"
    return out, why


NUMERICS_INTRO = ("The deployment's logprobs and routing for tokens it sampled, against a local forward pass of the "
                  "same weights (Δlogprob = local − served).")  # fmt: skip


def picture_file(stem: str, key: str, name: str) -> str:
    """The file a NUM picture is written to, beside the report: `<stem>.numerics-<key>-<name>.png`."""
    return f"{stem}.numerics-{key}-{name}.png"


def _numerics_markdown(doc: dict[str, Any]) -> list[str]:
    tests = numerics_tests(doc)
    if not tests:
        return []
    lines = ["", "## Numerics", "", NUMERICS_INTRO, ""]
    lines += ["| figure | " + " | ".join(cid for _, cid, _ in tests) + " |", "|---" * (len(tests) + 1) + "|"]
    lines += [f"| {_cell(label)} | " + " | ".join(map(_cell, values)) + " |" for label, values in numerics_grid(tests)]
    numerics = doc.get("numerics") or {}
    if numerics.get("pictures"):
        from pytest_rlrollout.numerics.pictures import TITLES

        lines.append("")
        lines += [f"![{p['clause']}: {TITLES.get(p['picture'], p['picture'])}]({quote(p['file'])})"
                  for p in numerics["pictures"]]  # fmt: skip
    if numerics.get("no_pictures"):
        lines += ["", f"No pictures: {numerics['no_pictures']}"]
    return lines


def size(n: Any) -> str:
    """Bytes in binary units (1.5 MiB)."""
    if not isinstance(n, int | float) or isinstance(n, bool):
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def upload_cells(u: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """What building one snapshot cost: identity, kind, bytes uploaded, bytes copied inside the
    bucket, and the upload as a fraction of a full snapshot."""
    return (str(u.get("identity", "")), str(u.get("kind", "")), size(u.get("uploaded", 0)),
            size(u.get("copied", 0)), _number(u.get("of_full", 0), ".2%"))  # fmt: skip


def _uploads_markdown(doc: dict[str, Any]) -> list[str]:
    rows = [(cid, t, u) for cid, c in doc["clauses"].items() for t in c["tests"] for u in t.get("uploads") or []]
    if not rows:
        return []
    lines = ["", "## Uploads", "", "What the tests that swap snapshots uploaded to the bucket, and copied inside it.",
             "", "| clause | test | snapshot | kind | uploaded | copied | of a full snapshot |",
             "|---" * 7 + "|"]  # fmt: skip
    seen = set()
    for cid, t, u in rows:
        test = "" if (cid, t["test"]) in seen else f"`{_cell(t['test'].rpartition('::')[2])}`"
        seen.add((cid, t["test"]))
        lines.append(f"| {cid} | {test} | " + " | ".join(_cell(x) for x in upload_cells(u)) + " |")
    return lines


def paths(path: str | Path) -> tuple[Path, Path, Path]:
    """The report's three files: `path` (JSON), and .md and .html beside it."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in SUFFIXES else path
    # the suffixes are added, not swapped: a name with dots of its own ("vllm-0.32-cpu") keeps them
    return tuple(stem.with_name(stem.name + suffix) for suffix in SUFFIXES)  # type: ignore[return-value]


def write(path: str | Path, doc: dict[str, Any]) -> tuple[Path, Path, Path]:
    """The JSON report at `path`, with the Markdown and HTML reports beside it, and the NUM
    pictures beside them as PNG files (`picture_file`), which the JSON and Markdown name and the
    HTML embeds."""
    from pytest_rlrollout.suite.html import html

    out = paths(path)
    out[0].parent.mkdir(parents=True, exist_ok=True)
    stem, where = out[0].stem, out[0].parent
    for stale in where.glob(f"{glob.escape(stem)}.numerics-*.png"):  # an earlier run's, under this name
        stale.unlink()
    drawn, why = numerics_pictures(doc)
    if numerics_tests(doc):
        clause = {key: cid for key, cid, _ in numerics_tests(doc)}
        listed = []
        for key, pictures in drawn.items():
            for name, png in pictures.items():
                file = picture_file(stem, key, name)
                (where / file).write_bytes(png)
                listed.append({"clause": clause[key], "key": key, "picture": name, "file": file})
        doc = {**doc, "numerics": {"pictures": listed, "no_pictures": why}}
    out[0].write_text(json.dumps(doc, indent=2) + "\n")
    out[1].write_text(markdown(doc))
    out[2].write_text(html(doc, drawn))
    return out
