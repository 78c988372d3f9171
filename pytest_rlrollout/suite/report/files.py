"""The report's files, written in one place: `PATH.json`, `PATH.md` and `PATH.html`, and the NUM,
soak and diagnosis pictures beside them as PNG files (which the JSON and Markdown name and the HTML
embeds)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from pytest_rlrollout.suite.report.html import html
from pytest_rlrollout.suite.report.markdown import markdown
from pytest_rlrollout.suite.report.model import PictureFile, Pictures, Report
from pytest_rlrollout.suite.report.pictures import draw, draw_diagnosis, draw_soak

SUFFIXES = (".json", ".md", ".html")


def paths(path: str | Path) -> tuple[Path, Path, Path]:
    """The report's three files: `path` (JSON), and .md and .html beside it."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in SUFFIXES else path
    # the suffixes are added, not swapped: a name with dots of its own ("vllm-0.32-cpu") keeps them
    return tuple(stem.with_name(stem.name + suffix) for suffix in SUFFIXES)  # type: ignore[return-value]


def picture_file(stem: str, key: str, name: str) -> str:
    """The file a NUM picture is written to, beside the report: `<stem>.numerics-<key>-<name>.png`."""
    return f"{stem}.numerics-{key}-{name}.png"


def json_text(report: Report) -> str:
    """The JSON writer: the model as it reads back (`Report.from_json`)."""
    return json.dumps(report.to_json(), indent=2) + "\n"


def write(path: str | Path, report: Report) -> tuple[Path, Path, Path]:
    """The three reports at `paths(path)` and the NUM pictures beside them; an earlier run's
    pictures under this name go first (they are not this report's). `report` is left as it was."""
    out = paths(path)
    where, stem = out[0].parent, out[0].stem
    where.mkdir(parents=True, exist_ok=True)
    prefixes = (f"{stem}.numerics-", f"{stem}.soak-", f"{stem}.diagnosis-")
    for stale in where.iterdir():
        if stale.name.startswith(prefixes) and stale.name.endswith(".png"):
            stale.unlink()
    drawn, why = draw(report)
    tests = report.numerics_tests()
    listed: list[PictureFile] = []
    for t in tests:
        for name, png in drawn.get(t.key, {}).items():
            listed.append(PictureFile(t.clause.clause, t.key, name, picture_file(stem, t.key, name)))
            (where / listed[-1].file).write_bytes(png)
    report = replace(report, pictures=Pictures(tuple(listed), why) if tests else None)
    soak_drawn: dict[str, bytes] = {}
    if report.soak is not None:
        soak_drawn, soak_why = draw_soak(report.soak)
        for name, png in soak_drawn.items():
            (where / f"{stem}.soak-{name}.png").write_bytes(png)
        files = tuple(f"{stem}.soak-{name}.png" for name in soak_drawn)
        report = replace(report, soak=replace(report.soak, pictures=files, no_pictures=soak_why))
    diagnosis_drawn: dict[str, bytes] = {}
    if report.diagnosis is not None:
        diagnosis_drawn, diagnosis_why = draw_diagnosis(report.diagnosis)
        for name, png in diagnosis_drawn.items():
            (where / f"{stem}.diagnosis-{name}.png").write_bytes(png)
        files = tuple(f"{stem}.diagnosis-{name}.png" for name in diagnosis_drawn)
        report = replace(report, diagnosis=replace(report.diagnosis, pictures=files, no_pictures=diagnosis_why))
    out[0].write_text(json_text(report))
    out[1].write_text(markdown(report))
    out[2].write_text(html(report, drawn, soak_drawn, diagnosis_drawn))
    return out
