"""The HTML report: one self-contained page that a person reads instead of the JSON, rendered
from `templates/report.html.j2` with autoescaping (every text in it may come from the deployment
under test). The NUM pictures are embedded as data: URIs, each under the clause it is about; a
soak's and a diagnosis's in their own sections."""

from __future__ import annotations

import base64
from functools import cache

from jinja2 import Environment, PackageLoader, StrictUndefined

from pytest_rlrollout.contract import Outcome
from pytest_rlrollout.numerics.pictures import TITLES
from pytest_rlrollout.suite.report.model import Report
from pytest_rlrollout.suite.report.pictures import (
    DIAGNOSIS_TITLES,
    SOAK_TITLES,
    Drawn,
    draw,
    draw_diagnosis,
    draw_soak,
)
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
    soak_replica_cells,
    soak_swap_cells,
    upload_cells,
)
from pytest_rlrollout.suite.report.timeline import ink, picture

OUTCOME_COLOURS = {
    Outcome.PASS: "#2e7d32",
    Outcome.NOT_APPLICABLE: "#b0bec5",
    Outcome.UNSUPPORTED: "#78909c",
    Outcome.INCONCLUSIVE: "#f9a825",
    Outcome.FAIL: "#c62828",
    Outcome.ERROR: "#6a1b9a",
}
QUIET = (Outcome.PASS, Outcome.NOT_APPLICABLE)  # the clauses the page's filter hides: nothing to act on


@cache
def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("pytest_rlrollout.suite.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,  # a misspelt name fails the report's tests, not a reader's eyes
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(
        ink=ink, one_line=one_line, measures_note=measures_note, upload_cells=upload_cells, timeline_picture=picture
    )
    return env


def html(
    report: Report,
    drawn: Drawn | None = None,
    soak_drawn: dict[str, bytes] | None = None,
    diagnosis_drawn: dict[str, bytes] | None = None,
) -> str:
    """The report as one HTML page that needs nothing but itself. `drawn` are the NUM tests'
    pictures as `pictures.draw` draws them, `soak_drawn` the soak's as `draw_soak` does,
    `diagnosis_drawn` the diagnosis's as `draw_diagnosis` does; None draws them here."""
    why = report.pictures.no_pictures if report.pictures is not None else None
    if drawn is None:
        drawn, why = draw(report)
    soak_why = report.soak.no_pictures if report.soak is not None else None
    if soak_drawn is None and report.soak is not None:
        soak_drawn, soak_why = draw_soak(report.soak)
    soak_pictures = [
        (f"soak: {SOAK_TITLES.get(name, name)}", "data:image/png;base64," + base64.b64encode(png).decode())
        for name, png in (soak_drawn or {}).items()
    ]
    diagnosis = report.diagnosis
    diagnosis_why = diagnosis.no_pictures if diagnosis is not None else None
    if diagnosis_drawn is None and diagnosis is not None:
        diagnosis_drawn, diagnosis_why = draw_diagnosis(diagnosis)
    diagnosis_pictures = [
        (f"diagnosis: {DIAGNOSIS_TITLES.get(name, name)}", "data:image/png;base64," + base64.b64encode(png).decode())
        for name, png in (diagnosis_drawn or {}).items()
    ]
    numerics = report.numerics_tests()
    pictures: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for t in numerics:
        pictures[(t.clause.clause, t.test.test)] = [
            (f"{t.clause.clause}: {TITLES.get(name, name)}", "data:image/png;base64," + base64.b64encode(png).decode())
            for name, png in drawn.get(t.key, {}).items()
        ]
    areas: dict[str, list] = {}
    for c in report.clauses.values():
        areas.setdefault(c.area, []).append(c)
    counts = report.counts()
    template = _environment().get_template("report.html.j2")
    return template.render(
        report=report,
        outcomes=OUTCOMES,
        colours=list(OUTCOME_COLOURS.items()),
        counts=[(o, counts[o]) for o in OUTCOMES if counts.get(o)],
        failures=[c for c in report.clauses.values() if c.failed],
        areas=list(areas.items()),
        numerics=numerics,
        numerics_grid=numerics_grid(numerics),
        numerics_intro=NUMERICS_INTRO,
        no_pictures=why,
        pictures=pictures,
        soak=report.soak,
        soak_intro=SOAK_INTRO,
        soak_heads=SOAK_SWAP_HEADS,
        soak_rows=[soak_swap_cells(s) for s in report.soak.swaps] if report.soak is not None else [],
        soak_replica_heads=SOAK_REPLICA_HEADS,
        soak_replica_rows=[soak_replica_cells(r) for r in report.soak.replicas] if report.soak is not None else [],
        soak_pictures=soak_pictures,
        soak_no_pictures=soak_why,
        diagnosis=diagnosis,
        diagnosis_intro=DIAGNOSIS_INTRO,
        diagnosis_thresholds=diagnosis_thresholds(diagnosis) if diagnosis is not None else "",
        diagnosis_verdict=diagnosis_verdict(diagnosis) if diagnosis is not None else "",
        diagnosis_heads=DIAGNOSIS_HEADS,
        diagnosis_rows=[diagnosis_cells(f) for f in diagnosis.findings] if diagnosis is not None else [],
        diagnosis_replica_heads=DIAGNOSIS_REPLICA_HEADS,
        diagnosis_replica_rows=[diagnosis_replica_cells(r) for r in diagnosis.replicas] if diagnosis else [],
        diagnosis_pictures=diagnosis_pictures,
        diagnosis_no_pictures=diagnosis_why,
        upload_heads=UPLOAD_HEADS,
        fold=FOLD,
        quiet=QUIET,
    )
