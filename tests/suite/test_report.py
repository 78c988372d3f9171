"""Clause outcomes end up in the report: the lattice, roll-ups, evidence, JSON, Markdown and
HTML, xdist; a pass that observed nothing is inconclusive."""

import json
from pathlib import Path

import pytest

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
    "INF-SSE-1": "pass", "INF-RAW-1": "inconclusive", "INF-LOGPROBS-1": "error", "INF-USAGE-1": "fail", "R3-SHAPE-1": "not-applicable", "HL-HINT-1": "unsupported",
    "SWAP-ASYNC-3": "inconclusive", "SESS-1": "error", "CACHE-HIT-1": "inconclusive", "VER-STREAM-1": "fail",
}  # fmt: skip


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


@pytest.mark.parametrize(("given", "stem"), [("r.json", "r"), ("r", "r"), ("out/vllm-0.32-cpu.json", "out/vllm-0.32-cpu"),
                                             ("vllm-0.32-cpu", "vllm-0.32-cpu"), ("a.b.md", "a.b")])  # fmt: skip
def test_report_files_add_their_suffixes_to_a_dotted_name(given, stem):
    from pytest_rlrollout.suite.report.files import paths

    assert paths(given) == (Path(f"{stem}.json"), Path(f"{stem}.md"), Path(f"{stem}.html"))
