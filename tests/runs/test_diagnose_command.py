"""`rlrollout diagnose` against reference deployments the tests start themselves, named as live
deployments with the suite's options: each fault the diagnosis must tell apart is named as its
cause (exit 1), the bf16 rounding of a deployment's logits is left to numerics and a healthy
deployment to nothing (exit 0); by default it diagnoses the bundled reference deployment, and its
JSON and the report's section say what the terminal does."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_rlrollout.cli import main
from pytest_rlrollout.reference.settings import OBSERVABLE_PACE
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.drivers import Driver, driver_for
from pytest_rlrollout.remote.fingerprint import canary, continuation
from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.runs.diagnose import CAUSES, Expected
from pytest_rlrollout.shipped import shipped
from pytest_rlrollout.snapshot import build, tiny_moe
from pytest_rlrollout.suite.diagnosing import MODULE, NAME
from pytest_rlrollout.suite.file_schemas import problems
from pytest_rlrollout.suite.options import CONFORMANCE

KEY = "rl-reference-key"
SESSION = "x-multi-turn-session-id"


@contextlib.contextmanager
def driven(dep: Any) -> Iterator[Driver]:
    """A driver of the running reference deployment, as a trainer's tooling would hold one."""
    target = Target(dep.name, dep.base_url, dep.model, Secret(KEY), engine="fireworks")
    with DeploymentClient(target, timeout=60) as client:
        yield driver_for("fireworks", client)


def swap(dep: Any, bucket: Path, identity: str = "step-1") -> Path:
    """A perturbed snapshot of the base loaded with reset_prompt_cache 'all', every replica serving it."""
    base = bucket / tiny_moe.BASE_IDENTITY
    build.derive(base, bucket / identity, build.perturbed(base, seed=1, scale=0.1))
    with driven(dep) as d:
        answer = d.load({"identity": identity, "reset_prompt_cache": "all"})
        assert answer.status_code == 200, answer.text
        assert d.wait(identity, timeout=60, poll=0.05).ok
    return bucket / identity


def live(dep: Any) -> list[str]:
    """The suite's options naming `dep` as a live deployment."""
    return [
        f"--rl-deployment={dep.name}",
        f"--rl-base-url={dep.base_url}",
        f"--rl-model={dep.model}",
        f"--rl-api-key={KEY}",
    ]


@pytest.fixture
def diagnose(tmp_path, capsys, monkeypatch):
    """diagnose(*args) -> (exit status, the --json document or None, stdout, stderr): the command
    run in this process, in a directory of its own."""
    monkeypatch.chdir(tmp_path)

    def run(*args: Any) -> tuple[int, dict[str, Any] | None, str, str]:
        path = tmp_path / "diagnosis.json"
        path.unlink(missing_ok=True)
        code = main(["diagnose", *map(str, args), "--json", str(path)])
        said = capsys.readouterr()
        return code, json.loads(path.read_text()) if path.is_file() else None, said.out, said.err

    return run


def finding(doc: dict[str, Any], cause: str) -> dict[str, Any]:
    return next(f for f in doc["findings"] if f["cause"] == cause)


def test_a_replica_that_kept_its_weights_is_named_whatever_its_label(bucket, start, diagnose):
    """Two replicas, a load that changes the last one's label but not its weights: the weights are
    blamed on that replica alone, whose label is the one the replica in sync serves."""
    dep = start(replicas=2, faults=["FID-SWAP-1:one"], api_key=KEY)
    step = swap(dep, bucket)
    code, doc, out, err = diagnose("--snapshot", step, *live(dep))
    assert code == 1, out + err
    assert doc is not None and doc["blamed"] == ["weights"], out
    weights = finding(doc, "weights")
    assert weights["replicas"] == ["replica-1"], weights
    labels = {r["replica"]: r["label"] for r in doc["replicas"]}
    assert labels == {"replica-0": "step-1", "replica-1": "step-1"}
    assert [r["replica"] for r in doc["replicas"] if r["blamed"]] == ["replica-1"]
    assert "replica-1 (labelled 'step-1' like the replicas in sync)" in weights["detail"]
    assert "the gap comes from: weights" in out


def test_a_prompt_cache_serving_kv_from_before_the_swap_is_named(bucket, start, diagnose):
    """Earlier traffic continues the canary through the shared cache; a swap with reset 'all' keeps
    that KV (FID-CACHE-1): the prompt cache is blamed, and the weights, scored fresh, are not."""
    dep = start(replicas=1, faults=["FID-CACHE-1"], api_key=KEY)
    tokens = canary(sequences=1, tokens=128)[0]  # the canary `rlrollout diagnose` scores
    with driven(dep) as d:
        for n in range(4):  # a rollout's prefixes, cached as the canary under the weights before the swap
            continuation(d, tokens, {SESSION: f"earlier-{n}"})
    step = swap(dep, bucket)
    code, doc, out, err = diagnose("--snapshot", step, *live(dep))
    assert code == 1, out + err
    assert doc is not None and doc["blamed"] == ["prompt cache"], out
    cache = finding(doc, "prompt cache")
    assert cache["figures"]["replica-0: cached by earlier traffic"] == "inf", cache  # the greedy tokens parted
    assert not finding(doc, "weights")["blamed"]


def test_batch_dependent_numerics_are_named(start, base_snapshot, diagnose):
    """Logits that depend on the batch (FID-BATCH-1), the deployment slowed so that the load streams
    decode while the request judged is answered: batching is blamed, the overlap measured."""
    dep = start(replicas=1, faults=["FID-BATCH-1"], api_key=KEY)
    dep.deployment.set_pace(**OBSERVABLE_PACE)  # the live reference decodes too fast for a load to overlap
    code, doc, out, err = diagnose("--snapshot", base_snapshot, *live(dep))
    assert code == 1, out + err
    assert doc is not None and doc["blamed"] == ["batching"], out
    batching = finding(doc, "batching")
    assert batching["measured"] and batching["figures"]["concurrent_streams"] >= 1, batching


def test_a_decode_path_that_drifts_from_prefill_is_named(start, base_snapshot, diagnose):
    """Decode logprobs reported in bf16 while prefill is float32 (FID-DECODE-1): the decode path is blamed."""
    dep = start(replicas=1, faults=["FID-DECODE-1"], api_key=KEY)
    code, doc, out, err = diagnose("--snapshot", base_snapshot, *live(dep))
    assert code == 1, out + err
    assert doc is not None and doc["blamed"] == ["decode path"], out
    assert finding(doc, "decode path")["gap"] > doc["self_tolerance"]


def test_bf16_rounded_logits_are_numerics_only(start, base_snapshot, diagnose):
    """Logits rounded to bf16, prefill and decode alike (NUM-LOGPROB-1): a gap to the float32
    scorer past the run's float32 tolerance, within what the bf16 the snapshot declares produces:
    numerics, and nothing blamed."""
    dep = start(replicas=1, faults=["NUM-LOGPROB-1"], api_key=KEY)
    code, doc, out, err = diagnose("--snapshot", base_snapshot, *live(dep))
    assert code == 0, out + err
    assert doc is not None and doc["blamed"] == [], out
    numerics = finding(doc, "numerics")
    assert doc["self_tolerance"] < numerics["gap"] <= doc["numerics_band"], numerics
    assert doc["numerics_band"] == 0.25  # bfloat16's, as the base's config.json declares
    assert "no cause past its threshold but numerics" in out


def test_no_fault_no_cause_and_the_trainers_own_numbers_from_a_file(start, base_snapshot, tmp_path, diagnose):
    """A healthy deployment, once against the snapshot scored here and once against the trainer's
    numbers written to a file (`Expected.write`): nothing past its threshold, exit 0; with a file
    and no base known the band is the run's own tolerance."""
    dep = start(replicas=2, api_key=KEY)
    code, doc, out, err = diagnose("--snapshot", base_snapshot, *live(dep))
    assert code == 0, out + err
    assert doc is not None and doc["blamed"] == [], out
    assert all(f["gap"] is None or f["gap"] <= f["threshold"] for f in doc["findings"]), doc["findings"]
    tokens = canary(sequences=1, tokens=64)[0]
    scored = Expected.from_snapshot(base_snapshot, tokens)
    file = Expected(scored.tokens, scored.logprobs, "the trainer", label=tiny_moe.BASE_IDENTITY).write(
        tmp_path / "e.json"
    )
    code, doc, out, err = diagnose("--expected", file, *live(dep))
    assert code == 0, out + err
    assert doc is not None and doc["blamed"] == [] and doc["numerics_band"] == 1e-3, out
    assert doc["expected"] == {"source": str(file), "tokens": 64, "label": tiny_moe.BASE_IDENTITY}


def test_by_default_it_diagnoses_the_bundled_reference_deployment(base_snapshot, diagnose, tmp_path):
    """No deployment named: the bundled reference deployment, healthy, exit 0. The --json document
    satisfies its schema and carries every cause; the report has a diagnosis section with its
    picture, in HTML (embedded) and Markdown (beside it)."""
    code, doc, out, err = diagnose("--snapshot", base_snapshot, "--rl-report=report.json")
    assert code == 0, out + err
    assert doc is not None and problems("diagnosis", doc) == {}
    assert [f["cause"] for f in doc["findings"]] == list(CAUSES)
    assert len(doc["replicas"]) == 2  # the bundled deployment's
    assert "weights: the canary scored fresh on every replica" in err  # each measurement said as it begins
    assert f"report: {Path('report.json')}, " in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["clauses"] == {} and report["diagnosis"]["pictures"] == ["report.diagnosis-gaps.png"]
    assert problems("diagnosis", report["diagnosis"]) == {}
    assert (tmp_path / "report.diagnosis-gaps.png").read_bytes().startswith(b"\x89PNG")
    page = (tmp_path / "report.html").read_text()
    assert '<h2 id="diagnosis">Diagnosis</h2>' in page and 'src="data:image/png;base64,' in page
    assert "<h2>Clauses</h2>" not in page  # a diagnosis alone judges no clause
    assert "](report.diagnosis-gaps.png)" in (tmp_path / "report.md").read_text()


def test_no_conformance_run_collects_the_diagnose_module(pytester):
    """The module `rlrollout diagnose` runs ships in conformance/ but is no conformance test: a
    conformance run never collects it; run by pytest alone it says which command runs it."""
    items, _ = pytester.inline_genitems(str(CONFORMANCE), "-p", "no:randomly")
    assert items and not [i.nodeid for i in items if MODULE in i.nodeid]
    alone = pytester.runpytest_inprocess(str(CONFORMANCE / MODULE))
    alone.assert_outcomes(failed=1)
    alone.stdout.fnmatch_lines(["*is run by `rlrollout diagnose --snapshot DIR`*"])
    assert f'COMMAND = "{NAME}"' in (CONFORMANCE / MODULE).read_text()  # the plugin it looks for


def test_a_recorded_diagnosis_replays_as_it_was_made(base_snapshot, diagnose):
    """Recorded with --rl-record, a diagnosis replays offline to the same document, the overlap of
    the batching measurement as it was decided live; a recording that holds none says so."""
    code, recorded, out, err = diagnose(
        "--snapshot", base_snapshot, "--rl-record=rec", "-o", "rl_local_faults=FID-DECODE-1"
    )
    assert code == 1 and recorded is not None and recorded["blamed"] == ["decode path"], out + err
    code, replayed, out, err = diagnose("--snapshot", base_snapshot, "--rl-replay=rec")
    assert code == 1 and replayed is not None, out + err
    assert {**replayed, "seconds": 0} == {**recorded, "seconds": 0}
    code, _, out, err = diagnose("--snapshot", base_snapshot, f"--rl-replay={shipped('cassettes') / 'reference'}")
    assert code == 2 and "no cassette for this test" in err, out + err
