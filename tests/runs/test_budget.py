"""Profiles and budgets: what a run may change, and how much. A test they leave out is
inconclusive saying why, never a pass; MUST clauses get the budget first."""

import json

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.suite.options import CONFORMANCE

MODULES = [str(CONFORMANCE / "test_hot_load.py"), str(CONFORMANCE / "test_swap.py")]


def run(pytester, *options):
    result = pytester.runpytest_inprocess(*MODULES, "-p", "no:randomly", "--rl-report=r.json", *options)
    tests = {
        t["test"]: (cid, t)
        for cid, c in json.loads((pytester.path / "r.json").read_text())["clauses"].items()
        for t in c["tests"]
    }
    return result, tests


def test_a_swap_budget_is_spent_on_must_clauses_first_and_never_exceeded(pytester):
    result, tests = run(pytester, "-o", "rl_max_swaps=4")
    assert result.ret == 0, "\n".join(result.outlines[-20:])
    swaps = sum((t.get("done") or {}).get("swaps", 0) for _, t in tests.values())
    assert swaps <= 4, swaps
    left = {name: (cid, t) for name, (cid, t) in tests.items() if "left out by the run's budget" in t["reason"]}
    assert left, "a budget of 4 swaps ran every swap test"
    assert all(t["outcome"] == "inconclusive" for _, t in left.values())
    assert any("rl_max_swaps = 4" in t["reason"] for _, t in left.values())
    ran_should = [
        n for n, (cid, t) in tests.items() if catalogue()[cid].level != "MUST" and (t.get("done") or {}).get("swaps")
    ]
    left_must = [n for n, (cid, _) in left.items() if catalogue()[cid].level == "MUST"]
    assert not (ran_should and left_must), (
        f"SHOULD tests {ran_should} swapped while MUST tests {left_must} were left out"
    )


def test_an_upload_budget_of_nothing_leaves_out_every_test_that_would_upload(pytester):
    result, tests = run(pytester, "-o", "rl_max_upload_bytes=0", "-k", "adapter or full_snapshot_signal")
    assert result.ret == 0, "\n".join(result.outlines[-20:])
    lora = next(t for name, (_, t) in tests.items() if "loads_the_adapter" in name)
    assert "rl_max_upload_bytes = 0" in lora["reason"] and lora["outcome"] == "inconclusive", lora
    copy = next(t for name, (_, t) in tests.items() if "full_snapshot_signal" in name)
    assert copy["outcome"] == "pass", copy  # a copy inside the bucket uploads nothing


def test_the_read_only_profile_changes_nothing_and_says_so(pytester):
    result, tests = run(pytester, "-o", "rl_profile=read-only", "-k", "full_snapshot_signal or replica_reaches")
    assert result.ret == 0, "\n".join(result.outlines[-20:])
    assert tests and all(
        t["outcome"] == "inconclusive" and "profile read-only" in t["reason"] for _, t in tests.values()
    )
    assert all(not (t.get("done") or {}).get("swaps") for _, t in tests.values())


def test_the_core_profile_runs_only_tests_of_must_clauses(pytester):
    result, tests = run(pytester, "-o", "rl_profile=core")
    assert result.ret == 0, "\n".join(result.outlines[-20:])
    for name, (cid, t) in tests.items():
        if "profile core" in t["reason"]:
            assert catalogue()[cid].level != "MUST", name
        elif (t.get("done") or {}).get("swaps"):
            assert catalogue()[cid].level == "MUST", name
    assert any("profile core" in t["reason"] for _, t in tests.values())


def test_a_profile_that_changes_state_needs_allow_hot_load_on_a_live_deployment(pytester):
    result = pytester.runpytest_inprocess(
        *MODULES, "--rl-deployment=accounts/a/deployments/d", "--rl-model=m", "--rl-api-key=k", "-o", "rl_profile=core"
    )
    assert result.ret == 4
    assert "rl_profile = core changes what the deployment serves: also pass --rl-allow-hot-load" in "\n".join(
        result.errlines
    )
