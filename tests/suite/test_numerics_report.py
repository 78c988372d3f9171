"""The report's Numerics section: the NUM figures side by side in Markdown and HTML, their
pictures written beside the report (named in the JSON) and embedded in the HTML under the clause
each is about; swap tests' uploads and FID's max |Δ| beside the evidence."""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_rlrollout.numerics.figures import logprob_figures, routing_figures
from pytest_rlrollout.suite.report import files
from pytest_rlrollout.suite.report.model import Report

# matplotlib imported at collection, before any in-process pytester run (the mutation matrix's):
# a run puts sys.meta_path back as it found it, dropping the import hook six adds, so matplotlib
# (which needs six.moves, through dateutil) first imported inside one cannot be imported after it.
with contextlib.suppress(ImportError):
    import matplotlib.backends.backend_agg
    import matplotlib.figure  # noqa: F401

PNG = b"\x89PNG\r\n\x1a\n"
PICTURES = {
    "r.numerics-num-logprob-1-delta-histogram.png",
    "r.numerics-num-logprob-1-delta-by-position.png",
    "r.numerics-num-route-1-routing-by-layer.png",
}


def _test(node: str, outcome: str = "pass", **kw: Any) -> dict[str, Any]:
    return {
        "test": node,
        "outcome": outcome,
        "reason": "",
        "observed": "",
        "exchanges": [],
        "timeline": None,
        "uploads": [],
        "figures": None,
        "duration": 0.3,
    } | kw


def _clause(cid: str, outcome: str, evidence: str, test: dict[str, Any]) -> dict[str, Any]:
    return {
        "clause": cid,
        "level": "SHOULD",
        "area": cid.split("-")[0],
        "rule": f"the rule of {cid}",
        "outcome": outcome,
        "evidence": evidence,
        "duration": 0.3,
        "tests": [test],
    }


def _doc() -> dict[str, Any]:
    rng = np.random.default_rng(1)
    served = rng.normal(-2.0, 1.0, 200)
    logprobs = logprob_figures(served, served + rng.normal(0.0, 2e-3, 200), np.arange(200) % 25)
    experts = rng.integers(0, 8, (200, 3, 2))
    local = experts.copy()
    local[:10, 2] = 9  # the last MoE layer disagrees on 10 of 200 tokens
    routed = routing_figures(logprob_figures(served, served, np.arange(200) % 25), experts, local)
    upload = {
        "identity": "fid-swap-1a2b",
        "kind": "incremental",
        "uploaded": 3 * 1024 * 1024,
        "copied": 0,
        "of_full": 0.0123,
    }
    clauses = [
        _clause(
            "NUM-LOGPROB-1",
            "pass",
            "observed: 200 sampled tokens scored locally",
            _test("t/test_numerics.py::test_logprobs", figures=logprobs.as_dict()),
        ),
        _clause(
            "NUM-ROUTE-1",
            "pass",
            "observed: 200 sampled tokens routed as the local router routes them",
            _test("t/test_numerics.py::test_routing", figures={**routed.as_dict(), "alignment": "own position"}),
        ),
        _clause(
            "FID-SWAP-2",
            "fail",
            "the same weights score differently after a swap",
            _test(
                "t/test_fidelity.py::test_swap_back",
                "fail",
                uploads=[upload],
                figures={"max_abs_delta": 3.1e-05, "tolerance": 1e-06},
            ),
        ),
    ]
    return {
        "provenance": {"deployment": "accounts/a/deployments/d"},
        "contract": {"version": "1+000000000000", "document": "docs/contract.md"},
        "engine": None,
        "capabilities": [],
        "summary": {"levels": {"SHOULD": {"pass": 2, "fail": 1}}, "areas": {"NUM": {"pass": 2}, "FID": {"fail": 1}}},
        "clauses": {c["clause"]: c for c in clauses},
    }


def write(path: Path, doc: dict[str, Any]) -> tuple[Path, Path, Path]:
    """The report files of a report document, read into the model as a report on disk is."""
    return files.write(path, Report.from_json(doc))


def _embedded(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_numerics_section_and_pictures(tmp_path: Path) -> None:
    report = Report.from_json(_doc())
    kept = copy.deepcopy(report)
    json_path, md_path, html_path = files.write(tmp_path / "r.json", report)
    assert report == kept  # the caller's report is left as it was
    assert Report.from_json(json.loads(json_path.read_text())).pictures is not None  # the written one names them

    listed = json.loads(json_path.read_text())["numerics"]
    assert listed["no_pictures"] is None
    written = {p.name for p in tmp_path.glob("r.numerics-*.png")}
    assert written == PICTURES
    assert all((tmp_path / name).read_bytes().startswith(PNG) for name in written)
    assert {p["file"] for p in listed["pictures"]} == PICTURES
    assert {p["clause"] for p in listed["pictures"]} == {"NUM-LOGPROB-1", "NUM-ROUTE-1"}

    md = md_path.read_text()
    section = md[md.index("## Numerics") :]
    assert "| figure | NUM-LOGPROB-1 | NUM-ROUTE-1 |" in section
    assert "| tokens compared | 200 | 200 |" in section
    assert "| routing agreement |  | 98.333% of (layer, token) over 200 tokens |" in section
    assert "| tokens with any layer disagreeing |  | 5.000% |" in section
    assert "| agreement per MoE layer |  | 100.0% 100.0% 95.0% |" in section
    assert "| routing alignment |  | own position |" in section
    for label in ("mean \\|Δlogprob\\|", "max \\|Δlogprob\\|", "k3 KL(served‖local)", "ratio outside [0.5, 2]"):
        assert f"| {label} |" in section, label
    assert all(f"]({name})" in section for name in PICTURES)

    page = html_path.read_text()
    assert (
        '<h2 id="numerics">Numerics</h2>' in page
        and 'href="#numerics"' in page
        and "k3 KL(served‖local)" in page
        and "98.333%" in page
    )
    pngs = _embedded(page)
    assert len(pngs) == len(PICTURES) and all(p.startswith(PNG) for p in pngs)
    assert "http" not in "".join(re.findall(r'src="([^"]*)"', page))  # nothing fetched


def test_uploads_and_fid_figures_beside_the_evidence(tmp_path: Path) -> None:
    _, md_path, html_path = write(tmp_path / "r.json", _doc())
    md = md_path.read_text()
    row = next(line for line in md.splitlines() if line.startswith("| FID-SWAP-2 |"))
    assert row.endswith("the same weights score differently after a swap (max \\|Δ\\| 3.1e-05, tolerance 1e-06) |")
    assert "| FID-SWAP-2 | `test_swap_back` | fid-swap-1a2b | incremental | 3.0 MiB | 0 B | 0 B | 0 B | 1.23% |" in md
    page = html_path.read_text()
    assert '<span class="figures">(max |Δ| 3.1e-05, tolerance 1e-06)</span>' in page
    assert '<table class="uploads">' in page and "fid-swap-1a2b" in page and "3.0 MiB" in page and "1.23%" in page


def test_without_matplotlib_the_figures_stay_and_the_reason_shows(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    json_path, md_path, html_path = write(tmp_path / "r.json", _doc())
    assert not list(tmp_path.glob("*.png"))
    why = json.loads(json_path.read_text())["numerics"]["no_pictures"]
    assert "matplotlib" in why
    assert "| tokens compared | 200 | 200 |" in md_path.read_text() and "No pictures: matplotlib" in md_path.read_text()
    page = html_path.read_text()
    assert "data:image/png" not in page and "No pictures: matplotlib" in page


def test_a_report_without_num_figures_has_no_section_and_drops_old_pictures(tmp_path: Path) -> None:
    write(tmp_path / "r.json", _doc())
    doc = _doc()
    for cid in ("NUM-LOGPROB-1", "NUM-ROUTE-1"):
        del doc["clauses"][cid]
    json_path, md_path, html_path = write(tmp_path / "r.json", doc)
    assert not list(tmp_path.glob("r.numerics-*.png"))  # an earlier run's pictures are not this report's
    assert "numerics" not in json.loads(json_path.read_text())
    assert "## Numerics" not in md_path.read_text() and "Numerics" not in html_path.read_text()


def test_each_picture_is_under_the_clause_it_is_about(tmp_path: Path) -> None:
    """NUM-ROUTE-1's test keeps its tokens' Δlogprob too: its clause shows the routing picture,
    NUM-LOGPROB-1's the Δlogprob ones, whatever the tests' deltas."""
    _, _, html_path = write(tmp_path / "r.json", _doc())
    page = html_path.read_text()
    shown = {}
    for cid in ("NUM-LOGPROB-1", "NUM-ROUTE-1"):
        article = page[page.index(f'id="{cid}"') :]
        article = article[: article.index("</article>")]
        shown[cid] = re.findall(r'<img alt="[^"]*: ([^"]*)"', article)
    assert shown == {
        "NUM-LOGPROB-1": [
            "Δlogprob (local − served) per sampled token",
            "Δlogprob along the completion (token position)",
        ],
        "NUM-ROUTE-1": ["routing agreement per MoE layer"],
    }
    assert "data:image/png" not in page[: page.index('id="clauses"')]  # no picture away from its clause


@pytest.mark.parametrize("figures", [{"tokens": "many", "mean_abs": None}, {"tokens": 3, "deltas": "oops"}])
def test_figures_that_do_not_draw_cost_their_pictures_not_the_report(figures, tmp_path: Path) -> None:
    doc = _doc()
    doc["clauses"]["NUM-LOGPROB-1"]["tests"][0]["figures"] = figures
    _, md_path, _ = write(tmp_path / "r.json", doc)
    assert {p.name for p in tmp_path.glob("r.numerics-num-route-1-*.png")}  # the other test's still drawn
    assert "| tokens compared |" in md_path.read_text()


@pytest.mark.parametrize(("tokens", "scale"), [(60, "linear"), (4000, "log")])
def test_histogram_counts_read_as_whole_counts(tokens: int, scale: str, monkeypatch) -> None:
    """A few tokens get a plain axis of whole counts; many get a log axis (the tails beside a tall
    bulk) labelled 1, 10, 100, never 10⁰ and 2×10⁰."""
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from pytest_rlrollout.numerics import pictures

    axes = []

    def keep(draw: Any) -> bytes:
        fig = Figure()
        FigureCanvasAgg(fig)
        axes.append(fig.add_subplot())
        draw(axes[-1])
        fig.canvas.draw()
        return b""

    monkeypatch.setattr(pictures, "png_of", keep)
    rng = np.random.default_rng(2)
    served = rng.normal(-2.0, 1.0, tokens)
    pictures.delta_histogram(logprob_figures(served, served + rng.normal(0.0, 2e-3, tokens)))
    (ax,) = axes
    assert ax.get_yscale() == scale
    lo, hi = ax.get_ylim()
    ticks = ax.yaxis.get_major_ticks() + ax.yaxis.get_minor_ticks()
    labels = [t.label1.get_text() for t in ticks if lo <= t.get_loc() <= hi and t.label1.get_text()]
    assert labels and all(re.fullmatch(r"[0-9]+", label) for label in labels), labels
