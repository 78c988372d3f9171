"""`rlrollout diagnose` without a deployment: the thresholds' rule, the usage errors (said before
any session starts), the JSON document against its schema, and the report's diagnosis section
(`tests/runs/test_diagnose_command.py` runs the command against reference deployments)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import pytest

from pytest_rlrollout.cli import main
from pytest_rlrollout.runs.diagnose import CAUSES, EXPECTED_FORMAT, Diagnosis, Expected, Finding, numerics_band
from pytest_rlrollout.runs.weight_sync import ReplicaSync, SyncResult
from pytest_rlrollout.suite.file_schemas import problems
from pytest_rlrollout.suite.report.diagnosis import DiagnosisSummary
from pytest_rlrollout.suite.report.files import write
from pytest_rlrollout.suite.report.header import Contract, Provenance
from pytest_rlrollout.suite.report.html import html
from pytest_rlrollout.suite.report.markdown import markdown
from pytest_rlrollout.suite.report.model import Report


@pytest.mark.parametrize(
    ("run", "declared", "band"),
    [
        (1e-3, {"dtype": "bfloat16"}, 0.25),  # a float32 run, a checkpoint that declares bf16: bf16's
        (1e-3, {"torch_dtype": "float16"}, 0.1),
        (0.5, {"dtype": "bfloat16"}, 0.5),  # the run's own, when it is the larger
        (1e-3, {"dtype": "float32"}, 1e-3),
        (1e-3, None, 1e-3),  # nothing declared, nothing known: the run's alone
        (1e-3, {"dtype": "float8_e4m3fn"}, 1e-3),  # a precision without figures: the run's alone
    ],
)
def test_the_numerics_band_is_the_larger_of_the_runs_and_the_declared_precisions(run, declared, band):
    """What a replica serving the trainer's weights may differ by: a deployment may compute in the
    precision its checkpoint declares whatever the run was told."""
    assert numerics_band(run, declared) == band


def _diagnosis() -> Diagnosis:
    """A diagnosis as `Diagnose.run` makes one: a stale replica under the label of the replica in
    sync, a prompt cache whose greedy tokens parted (an infinite gap), batching not measured."""
    rows = (
        ReplicaSync("replica-0", "step-1", 1e-6, 2e-7, 3, 0.25),
        ReplicaSync("replica-1", "step-1", 0.9, 0.3, 2, 0.25),
    )
    findings = (
        Finding(
            "weights",
            0.9,
            0.25,
            True,
            "replica-1 (labelled 'step-1' like the replicas in sync) differs from the trainer by 0.9",
            {"replica-0: max |Δ|": 1e-6, "replica-1: max |Δ|": 0.9},
            ("replica-1",),
        ),
        Finding(
            "prompt cache",
            math.inf,
            1e-3,
            True,
            "worst: replica-0 <cached by earlier traffic>",
            {"replica-0: cached by earlier traffic": math.inf},
            ("replica-0",),
        ),
        Finding("batching", None, 1e-3, False, "every load stream had ended before the request judged was answered"),
        Finding("decode path", 0.0, 1e-3, False, "16 sampled tokens: decode logprob against echo"),
        Finding("numerics", 1e-6, 0.25, False, "the in-sync replicas' gap to the trainer", {"mean_abs_dlogprob": 2e-7}),
    )
    sync = SyncResult(rows, None, "step-1", "float32", 0.25, 2, 2, 0.1)
    expected = Expected((11, 12, 13), (-1.0, -2.0), "trainer.json", "step-1")
    return Diagnosis(findings, sync, expected, 1e-3, 0.25, 21, 1.5)


def test_the_json_document_satisfies_its_schema_and_the_schema_refuses_what_it_is_not():
    """`Diagnosis.as_dict` (what --json writes) carries every cause, each replica and what was
    blamed on which; the schema names what a document that is no diagnosis gets wrong."""
    doc = json.loads(json.dumps(_diagnosis().as_dict()))  # as a file holds it: no infinity
    assert problems("diagnosis", doc) == {}
    assert [f["cause"] for f in doc["findings"]] == list(CAUSES)
    assert doc["blamed"] == ["weights", "prompt cache"]
    assert [r["blamed"] for r in doc["replicas"]] == [False, True]
    assert doc["findings"][1]["gap"] == "inf" and doc["findings"][2]["gap"] is None
    for change, field in [
        (lambda d: d["blamed"].append("numerics"), ("blamed",)),  # numerics is what remains: never blamed
        (lambda d: d["findings"][0].update(cause="the moon"), ("findings",)),
        (lambda d: d["replicas"][0].update(max_abs_dlogprob=-1), ("replicas",)),
        (lambda d: d.pop("self_tolerance"), ()),
    ]:
        bad = json.loads(json.dumps(doc))
        change(bad)
        assert list(problems("diagnosis", bad)) == [field], bad


def _report(**more) -> Report:
    provenance = Provenance(deployment="accounts/me/deployments/rl", mode="live", finished="2026-11-28T07:00:00+00:00")
    summary = DiagnosisSummary.from_json(json.loads(json.dumps(_diagnosis().as_dict())))
    return Report(provenance, Contract("1+000000000000"), {}, diagnosis=summary, **more)


def test_the_report_of_a_diagnosis_reads_back_and_both_writers_show_it_with_its_picture(tmp_path):
    """The report's diagnosis section: every cause against its threshold, each replica, the verdict
    and the picture (a file beside the report, embedded in the HTML); a report of a diagnosis alone
    shows no clause roll-up, and what the deployment said is escaped."""
    report = _report()
    assert Report.from_json(json.loads(json.dumps(report.to_json()))) == report
    assert report.title == "RL-rollout diagnosis: accounts/me/deployments/rl"
    json_path, md_path, html_path = write(tmp_path / "r.json", report)
    doc = json.loads(json_path.read_text())
    assert doc["diagnosis"]["pictures"] == ["r.diagnosis-gaps.png"] and doc["diagnosis"]["no_pictures"] is None
    assert problems("diagnosis", doc["diagnosis"]) == {}
    assert (tmp_path / "r.diagnosis-gaps.png").read_bytes().startswith(b"\x89PNG")
    page = html_path.read_text()
    assert '<h2 id="diagnosis">Diagnosis</h2>' in page and page.count("data:image/png;base64,") == 1
    assert "The gap comes from: weights, prompt cache." in page
    assert re.search(r"<td>prompt cache</td><td class=\"n\">inf</td><td class=\"n\">0.001</td><td>CAUSE</td>", page)
    assert '<td>batching</td><td class="n">-</td><td class="n">0.001</td><td>not measured</td>' in page
    assert "&lt;cached by earlier traffic&gt;" in page and "<cached" not in page
    assert "<h2>Clauses</h2>" not in page and "<h2>Failures</h2>" not in page
    md = md_path.read_text()
    assert md.startswith("# RL-rollout deployment diagnosis") and "## Summary" not in md
    assert "| replica-1 | step-1 | 0.9 | 0.3 | 2 | other weights |" in md
    assert "| numerics | 1e-06 | 0.25 | remainder |" in md
    assert "![diagnosis: each cause's largest |Δlogprob| against its threshold" in md


def test_without_matplotlib_the_section_says_why_it_has_no_picture(tmp_path, monkeypatch):
    """matplotlib is optional: the section stays, its picture's absence said."""
    import pytest_rlrollout.suite.report.pictures as pictures

    monkeypatch.setattr(pictures, "unavailable", lambda: "matplotlib is not installed")
    json_path, md_path, html_path = write(tmp_path / "r.json", _report())
    assert json.loads(json_path.read_text())["diagnosis"]["no_pictures"] == "matplotlib is not installed"
    assert "No pictures: matplotlib is not installed" in html_path.read_text()
    assert "data:image/png" not in html_path.read_text() and not list(tmp_path.glob("*.png"))
    assert "No pictures: matplotlib is not installed" in md_path.read_text()


def test_a_conformance_report_with_a_diagnosis_keeps_its_clauses():
    """The section joins a report of clauses; the page and its title stay the conformance run's."""
    from pytest_rlrollout.contract import catalogue
    from pytest_rlrollout.suite.report.model import ClauseResult, TestResult

    c = catalogue()["INF-SSE-1"]
    clause = ClauseResult(c.id, c.level, c.area, c.rule)
    clause.add(TestResult("t.py::test_sse"))
    report = replace(_report(), clauses={c.id: clause})
    page = html(report)
    assert report.title.startswith("RL-rollout conformance: ")
    assert page.index("<h2>Summary</h2>") < page.index('<h2 id="diagnosis">') < page.index("<h2>Clauses</h2>")
    assert "## Diagnosis" in markdown(report) and "## Clauses" in markdown(report)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "give --snapshot DIR (scored here) or --expected FILE"),
        (["--snapshot", "s", "--expected", "e.json"], "not both"),
        (["--expected", "missing.json"], "--expected missing.json: cannot be read as JSON"),
        (["--expected", "not-json.json"], "--expected not-json.json: cannot be read as JSON"),
        (["--expected", "other.json"], '--expected other.json: not an expected-logprobs file (want "format"'),
        (["--expected", "short.json"], "--expected short.json: 0 logprobs for 2 tokens"),
        (["--snapshot", "missing"], "--snapshot missing: not a directory"),
        (["--snapshot", "empty"], "--snapshot empty: no config.json"),
        (["--snapshot", "s", "-n", "2"], "runs in one process: drop -n"),
        (["--json"], "argument --json: expected one argument"),
    ],
)
def test_usage_errors_exit_2_naming_what_is_wrong(args, said, tmp_path, monkeypatch, capsys):
    """Said on one line before any session starts (no deployment is reached)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "not-json.json").write_text("{tokens")
    (tmp_path / "other.json").write_text('{"format": "something-else/1"}')
    (tmp_path / "short.json").write_text(json.dumps({"format": EXPECTED_FORMAT, "tokens": [1, 2], "logprobs": []}))
    (tmp_path / "empty").mkdir()
    assert main(["diagnose", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlrollout diagnose: error: ") and said in err, err
    assert err.count("\n") == 1, err


def test_a_deployment_that_cannot_be_reached_exits_2(base_snapshot, tmp_path, monkeypatch, capsys):
    """Nothing answers where the options point: the preflight says what, and no diagnosis is made."""
    monkeypatch.chdir(tmp_path)
    args = ["--rl-base-url=http://127.0.0.1:1", "--rl-model=m", "--rl-engine=vllm", "--json", "d.json"]
    assert main(["diagnose", "--snapshot", str(base_snapshot), *args]) == 2
    err = capsys.readouterr().err
    assert "preflight: nothing answers at http://127.0.0.1:1" in err and "rlrollout diagnose: error: " in err
    assert not (tmp_path / "d.json").exists()
