"""The mutation matrix, for the conformance modules built so far: with one fault switch on, the
suite fails exactly that clause (and passes every other); with none, every clause passes."""

import json

import pytest

from pytest_rlrollout.catalogue import data_dir
from pytest_rlrollout.deployment.faults import FAULTS

MODULES = ["test_inference.py", "test_r3.py", "test_cache.py", "test_session.py"]  # grows with every module
READ_ONLY = ("CACHE-RPT-1", "CACHE-HIT-1", "CACHE-ISO-1", "CACHE-EQ-1", "SESS-1", "SESS-2", "SESS-3")
FAULTS_COVERED = sorted(f for f in FAULTS if f.startswith(("INF-", "R3-")) and f != "R3-CHANGE-1") + list(READ_ONLY)


def outcomes(pytester, *args):
    paths = [str(data_dir("conformance") / m) for m in MODULES]
    pytester.runpytest_subprocess(*paths, "--rl-report=r.json", *args)
    return {k: v["outcome"] for k, v in json.loads((pytester.path / "r.json").read_text())["clauses"].items()}


def test_no_fault_all_green(pytester):
    assert set(outcomes(pytester).values()) == {"pass"}


@pytest.mark.parametrize("fault", FAULTS_COVERED)
def test_each_fault_fails_exactly_its_clause(pytester, fault):
    got = outcomes(pytester, f"--rl-local-fault={fault}")
    assert got[fault] == "fail"
    # no other clause fails; a clause whose precondition the fault removed may be inconclusive
    assert {k for k, v in got.items() if v == "fail"} == {fault}, got
    assert {v for k, v in got.items() if k != fault} <= {"pass", "inconclusive"}, got
