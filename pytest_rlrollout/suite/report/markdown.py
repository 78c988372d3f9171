"""The Markdown report: provenance, the roll-up, capabilities, one row per clause, the NUM figures
and their pictures (files beside the report), a soak's figures and pictures, a diagnosis and its
picture, uploads, and every failure with its exchanges. A report of a diagnosis alone
(`rlrollout diagnose`) shows no clauses."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from pytest_rlrollout.numerics.pictures import TITLES
from pytest_rlrollout.suite.report.model import Report
from pytest_rlrollout.suite.report.pictures import DIAGNOSIS_TITLES, SOAK_TITLES
from pytest_rlrollout.suite.report.text import (
    DIAGNOSIS_HEADS,
    DIAGNOSIS_INTRO,
    DIAGNOSIS_REPLICA_HEADS,
    FOLD,
    NUMERICS_INTRO,
    OUTCOMES,
    SOAK_INTRO,
    SOAK_REPLICA_HEADS,
    SOAK_SWAP_HEADS,
    UPLOAD_HEADS,
    diagnosis_cells,
    diagnosis_replica_cells,
    diagnosis_thresholds,
    diagnosis_verdict,
    measures_note,
    numerics_grid,
    one_line,
    plan_figure,
    soak_replica_cells,
    soak_swap_cells,
    upload_cells,
)


def cell(text: str, limit: int = 240) -> str:
    """`text` as one table cell: one line, cut at `limit`, its pipes escaped."""
    return one_line(text, limit).replace("|", "\\|")


def markdown(report: Report) -> str:
    alone = report.diagnosis is not None and not report.clauses  # `rlrollout diagnose`: no clause judged
    lines = [f"# RL-rollout deployment {'diagnosis' if alone else 'conformance report'}", ""]
    for name, value in report.provenance.items():
        if isinstance(value, str):
            lines.append(f"- **{name}**: {value}")
        elif len(value) <= FOLD:
            lines.append(f"- **{name}**: {', '.join(value) or 'none'}")
        else:  # GitHub and most viewers fold <details>; the rest show the list under its name
            lines += [
                f"- **{name}**: <details><summary>{len(value)} identities</summary>",
                "",
                *(f"  - {v}" for v in value),
                "",
                "  </details>",
            ]
    if report.engine is not None:
        lines.append(f"- **engine**: {report.engine.name} ({report.engine.decided})")
    lines += [f"- **contract**: {report.contract.document}, version {report.contract.version}"]
    if not alone:
        lines += _summary(report)
    lines += _capabilities(report) + _diagnosis(report)
    if not alone:
        lines += _clauses(report)
    lines += _numerics(report) + _soak(report)
    lines += _uploads(report) + _plan(report)
    lines += _failures(report)
    return "\n".join(lines) + "\n"


def _summary(report: Report) -> list[str]:
    lines = ["", "## Summary", "", "| | " + " | ".join(OUTCOMES) + " |", "|---" * (len(OUTCOMES) + 1) + "|"]
    for _, group in report.summary.groups():
        for name, counts in group.items():
            lines.append(f"| {name} | " + " | ".join(str(counts.get(o, 0)) for o in OUTCOMES) + " |")
    return lines


def _capabilities(report: Report) -> list[str]:
    if not report.capabilities:
        return []
    lines = ["", "## Capabilities", "", "| capability | offered | required | seen |", "|---|---|---|---|"]
    for c in report.capabilities:
        lines.append(f"| {c.name} | {'yes' if c.has else 'no'} | {'yes' if c.required else ''} | {cell(c.seen)} |")
    return lines


def _clauses(report: Report) -> list[str]:
    lines = ["", "## Clauses", "", "| clause | level | outcome | rule | evidence |", "|---|---|---|---|---|"]
    for cid, c in report.clauses.items():
        note = measures_note(c.deciding.measures) if c.deciding is not None else ""
        evidence = f"{c.evidence} ({note})" if note else c.evidence
        lines.append(f"| {cid} | {c.level} | {c.outcome} | {cell(c.rule)} | {cell(evidence)} |")
    return lines


def _numerics(report: Report) -> list[str]:
    tests = report.numerics_tests()
    if not tests:
        return []
    lines = ["", "## Numerics", "", NUMERICS_INTRO, ""]
    lines += ["| figure | " + " | ".join(t.clause.clause for t in tests) + " |", "|---" * (len(tests) + 1) + "|"]
    lines += [f"| {cell(label)} | " + " | ".join(map(cell, values)) + " |" for label, values in numerics_grid(tests)]
    pictures = report.pictures
    if pictures is not None and pictures.files:
        lines.append("")
        lines += [f"![{p.clause}: {TITLES.get(p.picture, p.picture)}]({quote(p.file)})" for p in pictures.files]
    if pictures is not None and pictures.no_pictures:
        lines += ["", f"No pictures: {pictures.no_pictures}"]
    return lines


def _soak(report: Report) -> list[str]:
    soak = report.soak
    if soak is None:
        return []
    lines = ["", "## Soak", "", SOAK_INTRO, "", "| figure | value |", "|---|---|"]
    lines += [f"| {cell(name)} | {cell(str(value))} |" for name, value in soak.rows]
    for heads, rows in (
        (SOAK_REPLICA_HEADS, map(soak_replica_cells, soak.replicas)),
        (SOAK_SWAP_HEADS, map(soak_swap_cells, soak.swaps)),
    ):
        if cells := list(rows):
            lines += _table(heads, cells)
    if soak.pictures:
        lines.append("")
        for file in soak.pictures:
            name = file.rpartition(".soak-")[2].removesuffix(".png")
            lines.append(f"![soak: {SOAK_TITLES.get(name, name)}]({quote(file)})")
    if soak.no_pictures:
        lines += ["", f"No pictures: {soak.no_pictures}"]
    return lines


def _table(heads: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table after a blank line: its heads, then a line per row."""
    return ["", "| " + " | ".join(map(cell, heads)) + " |", "|---" * len(heads) + "|"] + [
        "| " + " | ".join(map(cell, row)) + " |" for row in rows
    ]


def _diagnosis(report: Report) -> list[str]:
    d = report.diagnosis
    if d is None:
        return []
    lines = ["", "## Diagnosis", "", DIAGNOSIS_INTRO, "", diagnosis_thresholds(d), "", f"**{diagnosis_verdict(d)}**"]
    for heads, rows in (
        (DIAGNOSIS_HEADS, map(diagnosis_cells, d.findings)),
        (DIAGNOSIS_REPLICA_HEADS, map(diagnosis_replica_cells, d.replicas)),
    ):
        lines += _table(heads, list(rows))
    if d.pictures:
        lines.append("")
        for file in d.pictures:
            name = file.rpartition(".diagnosis-")[2].removesuffix(".png")
            lines.append(f"![diagnosis: {DIAGNOSIS_TITLES.get(name, name)}]({quote(file)})")
    if d.no_pictures:
        lines += ["", f"No pictures: {d.no_pictures}"]
    return lines


def _uploads(report: Report) -> list[str]:
    rows = [(c, t, u) for c in report.clauses.values() for t in c.tests for u in t.uploads]
    if not rows:
        return []
    lines = [
        "",
        "## Uploads",
        "",
        "What the tests that swap snapshots uploaded to the bucket, copied or linked inside "
        "it, and wrote on this machine to build them.",
        "",
        "| clause | test | " + " | ".join(UPLOAD_HEADS) + " |",
        "|---" * (2 + len(UPLOAD_HEADS)) + "|",
    ]
    seen = set()
    for c, t, u in rows:
        test = "" if (c.clause, t.test) in seen else f"`{cell(t.test.rpartition('::')[2])}`"
        seen.add((c.clause, t.test))
        lines.append(f"| {c.clause} | {test} | " + " | ".join(cell(x) for x in upload_cells(u)) + " |")
    return lines


def _plan(report: Report) -> list[str]:
    """Each planned test's loads: the plan's figures beside what it did, and the totals."""
    tests = {t.test: t for c in report.clauses.values() for t in c.tests if t.planned is not None}
    if not tests:
        return []
    heads = ("swaps", "built", "uploaded", "copied", "linked", "written")
    lines = [
        "",
        "## Plan and done",
        "",
        "What the run's plan said each test that changes the deployment would load, "
        "and what it did (planned / done); a row in bold did otherwise.",
        "",
        "| test | " + " | ".join(heads) + " |",
        "|---" * (1 + len(heads)) + "|",
    ]
    sums = {k: [0, 0] for k in heads}
    for name, t in sorted(tests.items()):
        planned, done = t.planned or {}, t.done or {}  # (every test here has a plan)
        cells = []
        for k in heads:
            p, d = planned.get(k, 0), done.get(k, 0)
            sums[k][0], sums[k][1] = sums[k][0] + p, sums[k][1] + d
            cells.append(f"{plan_figure(k, p)} / {plan_figure(k, d)}")
        label = f"`{cell(name.rpartition('::')[2])}`"
        lines.append(f"| {f'**{label}**' if t.off_plan else label} | " + " | ".join(cells) + " |")
    lines.append(
        "| total | " + " | ".join(f"{plan_figure(k, p)} / {plan_figure(k, d)}" for k, (p, d) in sums.items()) + " |"
    )
    return lines


def _failures(report: Report) -> list[str]:
    failed = report.failures()
    if not failed:
        return []
    lines = ["", "## Failures", ""]
    for c, t in failed:
        lines += [f"### {c.clause}: `{t.test}`", "", "```", t.reason.strip(), *t.exchanges, "```", ""]
    return lines
