"""`rl_plan` (`rlrollout plan`) against the reference deployment: it sends no state-changing
request (the server's own log says so), and the run that follows loads exactly what it planned,
test by test and in total."""

import json

import pytest

from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.reference.settings import OBSERVABLE_PACE
from pytest_rlrollout.snapshot import tiny_moe
from pytest_rlrollout.suite.options import CONFORMANCE

FIGURES = ("swaps", "uploaded", "copied", "linked", "written")


def state_changes(dep) -> list[tuple[str, str]]:
    """What the server was asked that is neither a read nor inference."""
    return [(m, p) for m, p, _ in dep.deployment.requests if m != "GET" and "/inference/" not in p and "/v1/" not in p]


@pytest.mark.parametrize(("engine", "replicas"), [("fireworks", 2), ("vllm", 1)])
def test_the_run_loads_what_its_plan_said(pytester, tmp_path, engine, replicas):
    bucket = tmp_path / "bucket"
    with reference_deployment(bucket, engine=engine, replicas=replicas, **OBSERVABLE_PACE) as dep:
        args = [
            str(CONFORMANCE),
            "-p",
            "no:randomly",
            f"--rl-base-url={dep.base_url}",
            f"--rl-model={dep.model}",
            f"--rl-bucket-url={bucket}",
            f"--rl-base-snapshot={bucket / tiny_moe.BASE_IDENTITY}",
            *(
                [f"--rl-deployment={dep.name}", f"--rl-api-key={dep.api_key}"]
                if engine == "fireworks"
                else ["--rl-engine=vllm"]
            ),
        ]
        planned = pytester.runpytest_inprocess(*args, "-o", "rl_plan=plan.json")
        assert planned.ret == 0, "\n".join(planned.outlines[-30:])
        assert state_changes(dep) == [], "the plan changed the deployment's state"
        assert dep.deployment.ledger == [] if engine == "fireworks" else True
        plan = json.loads((pytester.path / "plan.json").read_text())
        run = pytester.runpytest_inprocess(*args, "--rl-allow-hot-load", "--rl-report=r.json")
        assert run.ret == 0, "\n".join(run.outlines[-30:])
    report = json.loads((pytester.path / "r.json").read_text())
    done = {t["test"]: t for c in report["clauses"].values() for t in c["tests"] if t.get("done") is not None}
    assert plan["totals"]["swaps"] > 10, plan["totals"]
    for t in plan["tests"]:
        if not t["loads"] and t["test"] not in done:  # planned to load nothing, and left out before its call
            continue
        assert t["test"] in done, f"{t['test']} was planned and did not load: {t}"
        d = done[t["test"]]
        assert d["planned"] == d["done"], f"{t['test']}: planned in the run {d['planned']}, done {d['done']}"
        assert {k: t[k] for k in FIGURES} == {k: d["done"][k] for k in FIGURES}, (t["test"], t, d["done"])
    totals = {
        k: sum(t["done"][k] for t in done.values() if t["test"] in {p["test"] for p in plan["tests"]}) for k in FIGURES
    }
    assert totals == {k: plan["totals"][k] for k in FIGURES}


def test_every_conformance_test_that_changes_state_declares_its_loads(pytester):
    """A state-changing test without `rl_loads` could not be planned or fit to a budget (a run
    with a budget leaves it out, saying so): the suite's own tests all declare theirs."""
    items, _ = pytester.inline_genitems(str(CONFORMANCE), "-p", "no:randomly")
    changing = [i for i in items if i.get_closest_marker("rl_swaps") is not None]
    assert len(changing) > 40
    undeclared = [i.nodeid for i in changing if i.get_closest_marker("rl_loads") is None]
    assert undeclared == []


def test_a_plan_on_a_base_the_bucket_holds_copies_and_links_instead_of_uploading(pytester, tmp_path):
    """The plan of a full run on the vLLM dialect: every swap writes at most the shards it
    changes and uploads nothing (the bucket is on this machine and holds the base)."""
    bucket = tmp_path / "bucket"
    with reference_deployment(bucket, engine="vllm") as dep:
        result = pytester.runpytest_inprocess(
            str(CONFORMANCE),
            "-p",
            "no:randomly",
            f"--rl-base-url={dep.base_url}",
            f"--rl-model={dep.model}",
            "--rl-engine=vllm",
            f"--rl-bucket-url={bucket}",
            f"--rl-base-snapshot={bucket / tiny_moe.BASE_IDENTITY}",
            "-o",
            "rl_plan=plan.json",
            "-o",
            "rl_swap_seconds=60",
        )
        assert result.ret == 0, "\n".join(result.outlines[-30:])
    plan = json.loads((pytester.path / "plan.json").read_text())
    assert plan["totals"]["full_uploads"] == 0 and plan["engine"] == "vllm"
    assert plan["estimated_seconds"] == plan["totals"]["swaps"] * 60
    text = "\n".join(result.outlines)
    assert f"estimated wall time of the swaps: {plan['totals']['swaps']} × 60 s" in text
    shard = max((bucket / tiny_moe.BASE_IDENTITY).glob("*.safetensors"), key=lambda f: f.stat().st_size).stat().st_size
    for t in plan["tests"]:
        for load in t["loads"]:
            if load["kind"] == "full":
                assert load["written"] <= 2 * shard, (t["test"], load)


def test_rlrollout_plan_prints_the_plan_and_changes_nothing(tmp_path, capsys, monkeypatch):
    """`rlrollout plan` with the conformance command's arguments: the plan as text and JSON, the
    server's log holding no state-changing request; a pytest option it cannot take is refused."""
    from pytest_rlrollout.cli import main

    monkeypatch.chdir(tmp_path)
    bucket = tmp_path / "bucket"
    with reference_deployment(bucket) as dep:
        args = [
            "plan",
            f"--rl-deployment={dep.name}",
            f"--rl-base-url={dep.base_url}",
            f"--rl-model={dep.model}",
            f"--rl-api-key={dep.api_key}",
            f"--rl-bucket-url={bucket}",
            "-k",
            "hot_load",
            f"--rl-base-snapshot={bucket / tiny_moe.BASE_IDENTITY}",
            "-o",
            "rl_swap_seconds=30",
        ]
        assert main([*args, "--output", str(tmp_path / "p.json")]) == 0
        text = capsys.readouterr().out
        assert main([*args, "--format", "json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert state_changes(dep) == [] and dep.deployment.ledger == []
    assert doc["tests"] and doc == json.loads((tmp_path / "p.json").read_text())
    assert f"estimated wall time of the swaps: {doc['totals']['swaps']} × 30 s" in text
    assert all(f"  {t['test']}: " in text for t in doc["tests"])
    assert main(["plan", "-n", "2"]) == 2
    assert "plans in one process" in capsys.readouterr().err
