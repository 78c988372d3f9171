"""Clause outcomes end up in the report: the lattice, roll-ups, evidence, JSON, Markdown and
HTML, xdist; a pass that observed nothing is inconclusive."""

import json
import re
from pathlib import Path

import pytest

from pytest_rlrollout.contract import Outcome, catalogue
from pytest_rlrollout.suite.report.fields import ReportError
from pytest_rlrollout.suite.report.header import Contract, Provenance
from pytest_rlrollout.suite.report.html import html
from pytest_rlrollout.suite.report.markdown import markdown
from pytest_rlrollout.suite.report.model import ClauseResult, Report, TestResult, Timeline, Upload

TESTS = """
import pytest
from pytest_rlrollout.suite.outcomes import inconclusive, not_applicable, unsupported

clause = pytest.mark.rl_clause

@clause("INF-SSE-1")
def test_pass(rl_observe): rl_observe(3, "events ended by a blank line")

@clause("INF-RAW-1")
def test_vacuous(rl_observe): rl_observe(0, "raw outputs")

@clause("INF-USAGE-1")
def test_fail(): assert 1 == 2, "usage.completion_tokens is 6, 5 tokens were returned"

@clause("R3-SHAPE-1")
def test_na(): not_applicable("a dense model has no routing")

@clause("HL-HINT-1")
def test_unsupported(): unsupported("no hint endpoint")

@clause("SWAP-ASYNC-3")
def test_inconclusive(): inconclusive("the swap finished before any probe landed")

@pytest.fixture
def broken(): raise RuntimeError("the suite broke")

@clause("SESS-1")
def test_error(broken): pass

@clause("CACHE-HIT-1")
def test_plain_skip(): pytest.skip("for no stated reason")

@clause("VER-STREAM-1")
def test_one(rl_observe): rl_observe(1, "chunk")

@clause("INF-LOGPROBS-1")
def test_crash(): {}["choices"]  # the test's own bug: an error, never a finding about the deployment

@clause("VER-STREAM-1")
def test_two(): assert False, "chunk 7 has no @identity"

def test_untagged(): pass
"""

EXPECTED = {
    "INF-SSE-1": "pass",
    "INF-RAW-1": "inconclusive",
    "INF-LOGPROBS-1": "error",
    "INF-USAGE-1": "fail",
    "R3-SHAPE-1": "not-applicable",
    "HL-HINT-1": "unsupported",
    "SWAP-ASYNC-3": "inconclusive",
    "SESS-1": "error",
    "CACHE-HIT-1": "inconclusive",
    "VER-STREAM-1": "fail",
}


def test_report_outcomes(pytester):
    pytester.makepyfile(test_clauses=TESTS)
    result = pytester.runpytest_inprocess("--rl-report=out/report.json")
    doc = json.loads((pytester.path / "out" / "report.json").read_text())
    assert {k: v["outcome"] for k, v in doc["clauses"].items()} == EXPECTED
    usage = doc["clauses"]["INF-USAGE-1"]
    assert usage["evidence"].startswith("usage.completion_tokens is 6, 5 tokens were returned")
    assert usage["rule"].startswith("usage.prompt_tokens, completion_tokens and total_tokens")
    assert doc["clauses"]["INF-SSE-1"]["evidence"] == "observed: 3 events ended by a blank line"
    assert doc["clauses"]["INF-RAW-1"]["evidence"] == "the test observed nothing to judge"
    assert doc["clauses"]["R3-SHAPE-1"]["evidence"] == "a dense model has no routing"
    assert doc["summary"]["levels"]["MUST"]["fail"] == 2
    assert doc["provenance"]["deployment"] == "local" and doc["provenance"]["suite_version"]
    assert Report.from_json(doc).to_json() == doc  # a report read back is the model that wrote it
    md = (pytester.path / "out" / "report.md").read_text()
    assert "| VER-STREAM-1 | MUST | fail |" in md and "chunk 7 has no @identity" in md
    assert (pytester.path / "out" / "report.html").read_text().lower().startswith("<!doctype html>")
    result.stdout.fnmatch_lines(
        ["*rl-rollout clauses*", "MUST*pass 1*", "report: out/report.json, out/report.md, out/report.html"]
    )


def test_reports_from_xdist_workers_keep_their_clauses(pytester, request):
    """xdist ships each worker's report to the controller as JSON (the serialization hooks);
    the clauses travel with it in user_properties."""
    from pytest_rlrollout.suite.reporting import Collector

    pytester.makepyfile(test_clauses=TESTS)
    reports = pytester.inline_run("-p", "no:rlrollout-reporting").getreports("pytest_runtest_logreport")
    hook, config = request.config.hook, request.config
    collector = Collector()
    for report in reports:
        data = hook.pytest_report_to_serializable(config=config, report=report)
        collector.record(hook.pytest_report_from_serializable(config=config, data=json.loads(json.dumps(data))))
    assert {k: v.outcome for k, v in collector.clauses().items()} == EXPECTED


def test_no_report_without_clause_tests(pytester):
    pytester.makepyfile(test_plain="def test_x(): pass")
    result = pytester.runpytest_inprocess("--rl-report=out/report.json")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "out").exists()
    result.stdout.no_fnmatch_line("*rl-rollout clauses*")


@pytest.mark.parametrize(
    ("given", "stem"),
    [
        ("r.json", "r"),
        ("r", "r"),
        ("out/vllm-0.32-cpu.json", "out/vllm-0.32-cpu"),
        ("vllm-0.32-cpu", "vllm-0.32-cpu"),
        ("a.b.md", "a.b"),
    ],
)
def test_report_files_add_their_suffixes_to_a_dotted_name(given, stem):
    from pytest_rlrollout.suite.report.files import paths

    assert paths(given) == (Path(f"{stem}.json"), Path(f"{stem}.md"), Path(f"{stem}.html"))


IDENTITIES = tuple(f"rlt-0a1b2c3d-4e5f60-{i:02d}-step" for i in range(83))


def _report() -> Report:
    """A live run's report built as the collector builds it: one failure, one pass with a
    timeline and an upload, and the 83 identities the run uploaded and removed."""
    failed = TestResult(
        "t.py::test_usage",
        Outcome.FAIL,
        reason="usage.completion_tokens is 6, 5 were returned",
        exchanges=["POST /v1/completions -> 200\n  answer: <b>6</b>"],
    )
    swapped = TestResult(
        "t.py::test_swap",
        observed="40 chunks; 1 change",
        timeline=Timeline("a swap", "a", "b", chunks=[(0.0, "a"), (0.5, "b")]),
        uploads=[Upload("rlt-x", "incremental", 3 << 20, 0, 0.01)],
        measures={"max_abs_delta": 0.0},
    )
    clauses = {}
    for cid, test in (("INF-USAGE-1", failed), ("SWAP-ASYNC-2", swapped)):
        c = catalogue()[cid]
        clauses[cid] = ClauseResult(cid, c.level, c.area, c.rule)
        clauses[cid].add(test)
    provenance = Provenance(
        deployment="accounts/me/deployments/rl",
        mode="live",
        finished="2026-11-26T07:00:00+00:00",
        served_at_start=("base",),
        uploaded_and_removed=IDENTITIES,
    )
    return Report(provenance, Contract(catalogue().version), clauses)


def test_a_report_reads_back_as_the_same_model():
    report = _report()
    assert Report.from_json(json.loads(json.dumps(report.to_json()))) == report
    doc = report.to_json()
    assert doc["clauses"]["INF-USAGE-1"]["tests"][0]["outcome"] == "fail"
    assert doc["summary"]["levels"]["MUST"] == {"fail": 1, "pass": 1}
    assert doc["provenance"]["uploaded_and_removed"] == list(IDENTITIES)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda d: d.pop("clauses"), "no 'clauses'"),
        (lambda d: d["clauses"]["INF-USAGE-1"].update(outcome="failed"), "INF-USAGE-1: 'failed' is not an outcome"),
        (lambda d: d["clauses"]["INF-USAGE-1"]["tests"][0].update(outcome=None), "t.py::test_usage: None is not an"),
        (lambda d: d["provenance"].update(operator="me"), "provenance: unknown operator"),
        (lambda d: d["clauses"]["SWAP-ASYNC-2"]["tests"][0]["timeline"].update(chunks=[[0.0]]), "timeline 'a swap'"),
        (lambda d: d.update(clauses=[]), "clauses: expected a JSON object"),
    ],
)
def test_a_document_that_is_no_report_says_what_is_wrong(change, said):
    doc = _report().to_json()
    change(doc)
    with pytest.raises(ReportError, match=re.escape(said)):
        Report.from_json(doc)


def test_the_writers_read_the_model_top_down():
    """Both writers from the model itself: the HTML page opens with the verdict and the failures,
    folds the run's 83 uploaded identities, and escapes what the deployment said."""
    report = _report()
    page = html(report)
    order = [
        page.index(s)
        for s in (
            'class="headline"',
            "<h2>Failures</h2>",
            "<h2>Summary</h2>",
            "<h2>Provenance</h2>",
            "<h2>Clauses</h2>",
        )
    ]
    assert order == sorted(order)
    assert "2 clauses: " in page and page.index('href="#INF-USAGE-1"') < page.index("<h2>Summary</h2>")
    folded = re.search(
        r"<dt>uploaded_and_removed</dt><dd><details><summary>83 identities</summary><ul>(.*?)</ul>", page, re.S
    )
    assert folded and folded.group(1).count("<li>") == 83
    assert "<dt>served_at_start</dt><dd>base" in page  # a short list stays inline
    assert "&lt;b&gt;6&lt;/b&gt;" in page and "<b>6</b>" not in page
    assert '<span class="figures">(max |Δ| 0)</span>' in page and '<table class="uploads">' in page

    md = markdown(report)
    assert "- **uploaded_and_removed**: <details><summary>83 identities</summary>" in md
    assert sum(line.startswith("  - rlt-") for line in md.splitlines()) == 83
    assert "- **served_at_start**: base" in md
    assert "| INF-USAGE-1 | MUST | fail |" in md and "| SWAP-ASYNC-2 | MUST | pass |" in md
    assert "### INF-USAGE-1: `t.py::test_usage`" in md and "answer: <b>6</b>" in md


def _soaked() -> Report:
    from dataclasses import replace

    from pytest_rlrollout.suite.report.soak import SoakSummary, SoakSwap

    swaps = (
        SoakSwap(1, "rlt-1", "incremental", "all", 20.0, 20.8, 12, 0.21, 0.36, 0.37, 3.4),
        SoakSwap(2, "rlt-2<b>", "full", "none", 40.0, None, error="not served within 3 s"),
    )
    series = {
        "tokens_per_s": ((0.0, 600.0), (5.0, 640.0)),
        "ttft_p50": ((0.0, 0.1), (5.0, 0.12)),
        "ttft_p99": ((0.0, 0.5), (5.0, 0.6)),
        "gap_p50": ((0.0, 0.02), (5.0, 0.02)),
        "gap_p99": ((0.0, 0.2), (5.0, 0.3)),
    }
    soak = SoakSummary((("turns", 14069), ("tokens/s", 701.3), ("errors: 425", 3)), swaps, series)
    return replace(_report(), soak=soak)


def test_a_soaks_section_reads_back_and_both_writers_show_it(tmp_path):
    from pytest_rlrollout.suite.report.files import write

    report = _soaked()
    assert Report.from_json(json.loads(json.dumps(report.to_json()))) == report
    json_path, md_path, html_path = write(tmp_path / "r.json", report)
    doc = json.loads(json_path.read_text())
    assert doc["soak"]["pictures"] == ["r.soak-throughput.png", "r.soak-latency.png", "r.soak-stalls.png"]
    assert all((tmp_path / f).read_bytes().startswith(b"\x89PNG") for f in doc["soak"]["pictures"])
    md = md_path.read_text()
    assert "## Soak" in md and "| turns | 14069 |" in md and "| errors: 425 | 3 |" in md
    assert "| 1 | rlt-1 | incremental | all | 20 | 20.8 | 12 | 210 | 360 | 370 | 3.4 |" in md
    assert "| 2 | rlt-2<b> | full | none | 40 | not served within 3 s |" in md
    assert "![soak: tokens per second over the soak" in md
    page = html_path.read_text()
    assert '<h2 id="soak">Soak</h2>' in page and page.count("data:image/png;base64,") == 3
    assert "rlt-2&lt;b&gt;" in page and "rlt-2<b>" not in page
    # a report without a soak has no section
    assert "Soak" not in markdown(_report()) and 'id="soak"' not in html(_report())
