"""`rlrollout matrix`: clause × engine from the suite's reports, refusing reports of another
contract version."""

from __future__ import annotations

import json
import os
import re
from importlib.metadata import version

import pytest

from pytest_rlrollout.cli import main
from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.engines import vllm
from pytest_rlrollout.suite.matrix import MatrixError, html, load, markdown
from pytest_rlrollout.suite.options import CONFORMANCE


def report(engine: str = "vllm", mode: str = "live", outcomes: dict[str, str] | None = None, **over) -> dict:
    outcomes = outcomes or {"INF-SSE-1": "pass", "HL-AUTH-1": "fail", "R3-COMP-1": "unsupported"}
    doc = {
        "provenance": {"mode": mode, "finished": "2026-11-24T10:00:00+00:00"},
        "contract": {"version": catalogue().version, "document": "docs/contract.md"},
        "engine": {"name": engine, "decided": "auto: GET /version answers vLLM 0.32.0", "version": "0.32.0"},
        "capabilities": [
            {"name": "policy_version", "has": True},
            {"name": "routing_matrix", "has": False},
            {"name": "hot_load_api", "has": True},
            {"name": "pause", "has": True},
        ],
        "clauses": {cid: {"outcome": o, "evidence": f"observed: {cid}"} for cid, o in outcomes.items()},
    }
    return doc | over


def write(tmp_path, name: str, doc: dict, beside: str | None = ".html"):
    """A report, and (`beside`) the HTML or Markdown report a reader opens."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    if beside is not None:
        path.with_suffix(beside).write_text("the report")
    return path


def test_a_column_says_engine_version_flags_date_and_how_it_was_run(tmp_path):
    [col] = load([write(tmp_path, "vllm-0.32-cpu", report())])
    assert (col.engine, col.version, col.date) == ("vllm", "0.32.0", "2026-11-24")
    assert col.how.startswith("a real deployment (auto: GET /version answers vLLM 0.32.0")
    # the flags of the capabilities whose binding needs one, once each (dev mode serves two here)
    assert col.flags == (
        f"{vllm.ENGINE.flags['policy_version']}: on",
        "--enable-return-routed-experts (vLLM's GPU model runner): off",
        "VLLM_SERVER_DEV_MODE=1: on",
    )
    [ref] = load([write(tmp_path, "sglang-reference", report("fireworks", mode="local"))])
    assert ref.how == "the reference deployment's fireworks dialect (not a real fireworks engine)"


def test_markdown_heads_each_area_links_each_cell_and_totals_each_column(tmp_path):
    b = report("openai", outcomes={"INF-SSE-1": "fail"})
    cols = load(
        [write(tmp_path, "a", report()), write(tmp_path, "b", b, beside=".md"), write(tmp_path, "c", b, None)],
        page=tmp_path,
    )
    rows = markdown(cols).splitlines()
    assert rows[0] == "# RL-rollout engine conformance matrix"
    assert rows[2].startswith(f"Contract version {catalogue().version}. ")
    assert "| clause | vllm (a) | openai (b) | openai (c) |" in rows
    assert [r for r in rows if r.startswith("| **")] == [
        f"| **{a}** — {v['title']} | | | |" for a, v in catalogue().areas.items()
    ]
    # the clause in the HTML report; the Markdown report has no anchor per clause; no report: no link
    # (the evidence as each link's title)
    assert (
        '| INF-SSE-1 (MUST) | [pass](a.html#INF-SSE-1 "observed: INF-SSE-1") | [FAIL](b.md "observed: INF-SSE-1") '
        "| FAIL |"
    ) in rows
    assert '| HL-AUTH-1 (MUST) | [FAIL](a.html#HL-AUTH-1 "observed: HL-AUTH-1") | — | — |' in rows
    assert "| *fail* | 1 | 1 | 1 |" in rows and "| *pass* | 1 | 0 | 0 |" in rows
    assert "| *unsupported* | 1 | 0 | 0 |" in rows
    assert len([r for r in rows if re.match(r"\| [A-Z0-9]+-[A-Za-z0-9-]+ \((MUST|SHOULD|MAY)\)", r)]) == len(
        catalogue()
    )


def test_a_cells_evidence_is_its_links_title_on_one_escaped_line(tmp_path):
    doc = report(outcomes={"INF-SSE-1": "fail"})
    doc["clauses"]["INF-SSE-1"]["evidence"] = 'chunk 7 said "x" | then\n' + "y" * 400 + "\\"
    [col] = load([write(tmp_path, "e", doc)], page=tmp_path)
    row = next(r for r in markdown([col]).splitlines() if r.startswith("| INF-SSE-1 "))
    assert row == f'| INF-SSE-1 (MUST) | [FAIL](e.html#INF-SSE-1 "chunk 7 said \\"x\\" \\| then {"y" * 176}") |'


def test_html_is_one_self_contained_escaped_page(tmp_path):
    hostile = report(outcomes={"INF-SSE-1": "pass"})
    hostile["clauses"]["INF-SSE-1"]["evidence"] = '"><script>alert(1)</script>'
    hostile["engine"]["version"] = "<img src=x onerror=alert(2)>"
    page = html(load([write(tmp_path, "h", hostile)], page=tmp_path))
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;" in page and "&lt;img src=x" in page
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)  # nothing fetched from outside
    assert 'href="h.html#INF-SSE-1"' in page and 'class="pass"' in page


def test_reports_of_another_contract_version_are_refused(tmp_path, capsys):
    ours = write(tmp_path, "ours", report())
    old = write(tmp_path, "old", report(contract={"version": "1+000000000000", "document": "docs/contract.md"}))
    with pytest.raises(MatrixError, match=r"old\.json: judged by contract version 1\+000000000000, not "):
        load([ours, old])
    assert main(["matrix", str(ours), str(old)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "old.json" in err[0] and "contract version" in err[0]


VERSIONED = {"contract": {"version": catalogue().version}}
NOT_REPORTS = {
    "a list": "[1, 2]",
    "not JSON": "not json",
    "no contract version": "{}",
    "no clauses": json.dumps({**VERSIONED, "engine": {"name": "vllm"}, "provenance": {}}),
    "no engine": json.dumps({**VERSIONED, "engine": None, "provenance": {}, "clauses": {}}),
    "clauses of junk": json.dumps({**VERSIONED, "engine": {"name": "x"}, "provenance": {}, "clauses": [1]}),
    "provenance of junk": json.dumps({**VERSIONED, "engine": {"name": "x"}, "provenance": [], "clauses": {}}),
    "capabilities of junk": json.dumps(
        {**VERSIONED, "engine": {"name": "x"}, "provenance": {}, "clauses": {}, "capabilities": [1]}
    ),
}


@pytest.mark.parametrize("case", sorted(NOT_REPORTS))
def test_what_is_not_a_report_is_one_usage_error(tmp_path, capsys, case):
    path = tmp_path / "x.json"
    path.write_text(NOT_REPORTS[case])
    assert main(["matrix", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "x.json" in err[0], err


def test_a_report_of_the_suite_makes_a_column(pytester, tmp_path, capsys):
    """The suite's own report (the vLLM dialect of the reference deployment), rendered both ways."""
    pytester.runpytest_inprocess(
        str(CONFORMANCE / "test_inference.py"),
        "-p",
        "no:randomly",
        "--rl-engine=vllm",
        "--rl-report=vllm-reference.json",
    )
    pages = tmp_path / "pages"
    pages.mkdir()
    assert main(["matrix", str(pytester.path / "vllm-reference.json"), "--out", str(pages / "engines")]) == 0
    text = (pages / "engines.md").read_text()
    assert f"| *version* | pytest-rlrollout {version('pytest-rlrollout')} (vllm 0.32.0 dialect) |" in text
    assert "the reference deployment's vllm dialect (not a real vllm engine)" in text
    # linked from where the page is, to the HTML report the run wrote beside its JSON
    linked = os.path.relpath(pytester.path / "vllm-reference.html", pages)
    assert f"| INF-SSE-1 (MUST) | [pass]({linked}#INF-SSE-1 " in text
    assert (pages / "engines.html").read_text().startswith("<!doctype html>")
