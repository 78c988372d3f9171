"""The engine conformance matrix: clause × engine, from the suite's own reports (`--rl-report`),
as Gateway API publishes implementations × features from each implementation's report.

A column is one report: the engine, its version where it said, the server flags its answers
showed on or off (the capabilities whose binding needs a flag), the date, and how it was run (a
real deployment, or the bundled reference deployment speaking that engine's dialect, which is
never a real engine). A cell is the clause's outcome there, linked to that report's evidence.
Reports judged by different catalogues (`contract.version`) are refused: their verdicts do not
compare.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_rlrollout.contract import SEVERITY, catalogue
from pytest_rlrollout.contract.capabilities import CAPABILITIES

# One column per report; outcomes read as the reports wrote them.
OUTCOMES = [str(o) for o in reversed(SEVERITY)]
SHORT = {
    "pass": "pass",
    "fail": "FAIL",
    "error": "ERROR",
    "inconclusive": "inconcl.",
    "unsupported": "unsupp.",
    "not-applicable": "n/a",
}


TITLE = 200  # characters of a cell's evidence shown on hover


class MatrixError(ValueError):
    """Reports that cannot make one matrix (what, and which file)."""


@dataclass(frozen=True)
class Column:
    name: str  # the report's file stem
    engine: str
    version: str
    flags: tuple[str, ...]
    date: str
    how: str
    outcomes: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)
    report: str | None = None  # the report a reader opens (its HTML, else its Markdown), from the page

    def link(self, clause_id: str) -> str | None:
        """Where a cell's evidence is: the clause in the HTML report, or the Markdown report."""
        if self.report is None:
            return None
        return f"{self.report}#{clause_id}" if self.report.endswith(".html") else self.report

    def totals(self) -> Counter[str]:
        return Counter(self.outcomes.values())


def column(path: Path, doc: dict[str, Any], page: Path | None = None) -> Column:
    """One report as a column (its evidence linked from a page in the directory `page`); MatrixError
    naming the file when it is not a suite report."""
    try:
        col = _column(path, doc)
    except (KeyError, TypeError, AttributeError) as e:
        raise MatrixError(f"{path}: not a report of the suite (--rl-report): {type(e).__name__} {e}") from None
    for beside in (path.with_suffix(".html"), path.with_suffix(".md")):
        if beside.is_file():
            return replace(col, report=Path(os.path.relpath(beside, page or Path.cwd())).as_posix())
    return col


def _column(path: Path, doc: dict[str, Any]) -> Column:
    engine, provenance, clauses = doc["engine"], doc["provenance"], doc["clauses"]
    name = str(engine["name"])
    version = str(engine.get("version") or "—")
    if provenance.get("mode") == "local":  # the reference's own version, and the engine's it imitates
        how = f"the reference deployment's {name} dialect (not a real {name} engine)"
        version = f"pytest-rlrollout {provenance.get('suite_version', '?')}" + (
            f" ({name} {engine['version']} dialect)" if engine.get("version") else ""
        )
    elif provenance.get("mode") == "replay":
        how = f"a replay of a recording ({engine.get('decided', '')})"
    else:
        how = f"a real deployment ({engine.get('decided', '')})"
    on: dict[str, bool] = {}  # a flag several capabilities need is on when any of them was offered
    for cap in doc.get("capabilities") or []:
        flag = CAPABILITIES[cap["name"]].flag(name) if cap.get("name") in CAPABILITIES else None
        if flag is not None:
            on[flag] = on.get(flag, False) or bool(cap.get("has"))
    return Column(
        name=path.stem,
        engine=name,
        version=version,
        flags=tuple(f"{flag}: {'on' if v else 'off'}" for flag, v in on.items()),
        date=str(provenance.get("finished") or "—")[:10],
        how=how,
        outcomes={str(cid): str(c["outcome"]) for cid, c in clauses.items()},
        evidence={str(cid): str(c.get("evidence") or "") for cid, c in clauses.items()},
    )


def load(paths: list[Path], page: Path | None = None) -> list[Column]:
    """The reports' columns, in the order given, their evidence linked from a page in the
    directory `page` (default: here); MatrixError when a report cannot be read or the reports
    were judged by different contract versions (or another than this catalogue's)."""
    docs = []
    for path in paths:
        try:
            docs.append((path, json.loads(path.read_text())))
        except (OSError, ValueError) as e:
            raise MatrixError(f"{path}: cannot be read as a JSON report ({e})") from None
    ours = catalogue().version
    for path, doc in docs:
        if not isinstance(doc, dict):
            raise MatrixError(f"{path}: not a report of the suite (--rl-report): not a JSON object")
        got = doc["contract"].get("version") if isinstance(doc.get("contract"), dict) else None
        if got != ours:
            raise MatrixError(
                f"{path}: judged by contract version {got or '(none: an older report)'}, not "
                f"{ours} (this catalogue's); run the suite again to compare"
            )
    return [column(path, doc, page) for path, doc in docs]


INTRO = (
    "One column per report of the suite (`--rl-report`), one row per clause. A column run against the "
    "reference deployment's dialect of an engine is not a run of that engine. Cells link to the evidence."
)


def markdown(columns: list[Column]) -> str:
    """The matrix as a Markdown page: a header per area, a cell per clause and column linking to
    the column's report, totals per column."""
    head = ["clause", *(f"{c.engine} ({c.name})" for c in columns)]
    lines = ["# RL-rollout engine conformance matrix", "", f"Contract version {catalogue().version}. {INTRO}", ""]
    lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for label, values in (
        ("version", [c.version for c in columns]),
        ("flags", ["<br>".join(c.flags) or "—" for c in columns]),
        ("date", [c.date for c in columns]),
        ("run", [c.how for c in columns]),
    ):
        lines.append(f"| *{label}* | " + " | ".join(v.replace("|", "\\|") for v in values) + " |")
    cat = catalogue()
    for area, about in cat.areas.items():
        lines.append(f"| **{area}** — {about['title']} |" + " |" * len(columns))
        for clause in cat.area(area):
            cells = [_md_cell(c, clause.id) for c in columns]
            lines.append(f"| {clause.id} ({clause.level}) | " + " | ".join(cells) + " |")
    for outcome in OUTCOMES:
        lines.append(f"| *{outcome}* | " + " | ".join(str(c.totals()[outcome]) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def _md_cell(c: Column, clause_id: str) -> str:
    outcome = c.outcomes.get(clause_id)
    if outcome is None:
        return "—"
    link, word = c.link(clause_id), SHORT.get(outcome, outcome)
    if link is None:
        return word
    # the evidence as the link's title (shown on hover), one line, escaped for a title in a table cell
    said = " ".join(c.evidence.get(clause_id, "").split())[:TITLE]
    said = said.replace("\\", "\\\\").replace('"', '\\"').replace("|", "\\|")
    return f'[{word}]({link} "{said}")' if said else f"[{word}]({link})"


HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>RL-rollout engine conformance matrix</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; }
table { border-collapse: collapse; } th, td { border: 1px solid #ccc; padding: 2px 6px; vertical-align: top; }
th.area { text-align: left; background: #eee; } td.meta { font-size: 12px; color: #444; }
.pass { background: #dff5df; } .fail, .error { background: #f8d4d4; } .inconclusive { background: #fdf1c7; }
.unsupported { background: #e6e6f7; } .not-applicable { color: #888; }
a { color: inherit; }
</style></head><body>
<h1>RL-rollout engine conformance matrix</h1>
<p>Contract version {{ version }}. {{ intro }}</p>
<table>
<tr><th>clause</th>{% for c in columns %}<th>{{ c.engine }}<br><small>{{ c.name }}</small></th>{% endfor %}</tr>
<tr><td>version</td>{% for c in columns %}<td class="meta">{{ c.version }}</td>{% endfor %}</tr>
<tr><td>flags</td>{% for c in columns %}<td class="meta">{% for f in c.flags %}{{ f }}<br>{% else %}—{% endfor %}</td>{% endfor %}</tr>
<tr><td>date</td>{% for c in columns %}<td class="meta">{{ c.date }}</td>{% endfor %}</tr>
<tr><td>run</td>{% for c in columns %}<td class="meta">{{ c.how }}</td>{% endfor %}</tr>
{% for area, title, clauses in areas %}
<tr><th class="area" colspan="{{ columns|length + 1 }}">{{ area }} — {{ title }}</th></tr>
{% for clause in clauses %}<tr><td title="{{ clause.rule }}">{{ clause.id }} <small>{{ clause.level }}</small></td>
{% for c in columns %}{% set o = c.outcomes.get(clause.id) %}{% set href = c.link(clause.id) %}{% if o %}<td class="{{ o }}" title="{{ c.evidence.get(clause.id, '') }}">{% if href %}<a href="{{ href }}">{{ short.get(o, o) }}</a>{% else %}{{ short.get(o, o) }}{% endif %}</td>{% else %}<td>—</td>{% endif %}{% endfor %}
</tr>{% endfor %}{% endfor %}
{% for o in outcomes %}<tr><th>{{ o }}</th>{% for c in columns %}<td>{{ c.totals()[o] }}</td>{% endfor %}</tr>{% endfor %}
</table></body></html>
"""


def html(columns: list[Column]) -> str:
    """The matrix as one self-contained page (no script, no outside resource), autoescaped."""
    from jinja2 import Environment

    cat = catalogue()
    areas = [(area, about["title"], cat.area(area)) for area, about in cat.areas.items()]
    template = Environment(autoescape=True).from_string(HTML)
    return template.render(
        columns=columns, areas=areas, outcomes=OUTCOMES, short=SHORT, version=cat.version, intro=INTRO
    )
