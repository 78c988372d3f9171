"""The report's files, written in one place: `PATH.json`, `PATH.md` and `PATH.html`, and the NUM,
soak and diagnosis pictures beside them as PNG files (which the JSON and Markdown name and the HTML
embeds)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from pytest_rlrollout.suite.report.diagnosis import DiagnosisSummary
from pytest_rlrollout.suite.report.html import html
from pytest_rlrollout.suite.report.markdown import markdown
from pytest_rlrollout.suite.report.model import PictureFile, Pictures, Report
from pytest_rlrollout.suite.report.pictures import draw, draw_diagnosis, draw_soak
from pytest_rlrollout.suite.report.soak import SoakSummary

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
        soak_drawn, soak = _section_pictures(where, f"{stem}.soak-", report.soak, draw_soak)
        report = replace(report, soak=soak)
    diagnosis_drawn: dict[str, bytes] = {}
    if report.diagnosis is not None:
        diagnosis_drawn, diagnosis = _section_pictures(where, f"{stem}.diagnosis-", report.diagnosis, draw_diagnosis)
        report = replace(report, diagnosis=diagnosis)
    out[0].write_text(json_text(report))
    out[1].write_text(markdown(report))
    out[2].write_text(html(report, drawn, soak_drawn, diagnosis_drawn))
    return out


S = TypeVar("S", SoakSummary, DiagnosisSummary)


def _section_pictures(
    where: Path, prefix: str, section: S, drawer: Callable[[S], tuple[dict[str, bytes], str | None]]
) -> tuple[dict[str, bytes], S]:
    """A report section's pictures (the soak's, the diagnosis's) drawn and written as
    `<prefix><name>.png`; what was drawn, and the section naming its files (or why there are none)."""
    drawn, why = drawer(section)
    for name, png in drawn.items():
        (where / f"{prefix}{name}.png").write_bytes(png)
    files = tuple(f"{prefix}{name}.png" for name in drawn)
    return drawn, replace(section, pictures=files, no_pictures=why)
