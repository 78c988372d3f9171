"""The mutation matrix: every fault switch of the reference deployment makes the conformance tests
of its clause fail (and no clause the contract does not tie to it); with no fault, every clause
passes, in both transition modes.

Each row runs the installed suite in this process (pytester, no interpreter start-up) with
`--rl-local-fault` and reads its clause report. The broken snapshot variants' rows come from
tests/snapshot/test_validator.py, which proves the validator reports exactly that clause. Rows
land in `build/mutation-matrix/`; the session's end assembles `build/mutation-matrix.{json,md}`.
"""

import json

import pytest

# Imported here, before any in-process run: pytester forgets what a run imported, and numpy and
# the server stack must not be imported afresh for every row.
import pytest_rlrollout.reference.app
import pytest_rlrollout.suite.snapshots  # noqa: F401
from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.reference.faults import FAULTS
from pytest_rlrollout.snapshot import broken
from pytest_rlrollout.suite.options import CONFORMANCE

from ..support import write_row

AREA_MODULE = {"HL": "test_hot_load.py", "SNAP": "test_hot_load.py", "SWAP": "test_swap.py", "CACHE": "test_cache.py",
               "SESS": "test_session.py", "VER": "test_version.py", "R3": "test_r3.py", "INF": "test_inference.py"}  # fmt: skip
SNAP_MUST = {c.id for c in catalogue().area("SNAP") if c.level == "MUST"}
# Faults whose violation also breaks other clauses by the contract's own logic.
COLLATERAL = {
    # 'new_session' keeping entries for everyone keeps them for requests without a session too
    "CACHE-MATRIX-NS-NEW": {"CACHE-NOSESSION-1"},
    # cutting every in-flight stream at a swap cuts it under every reset_prompt_cache value too
    "SWAP-ASYNC-1": {"SWAP-KV-1"},
    # serving unvalidated snapshots serves the violating variant of every SNAP rule, config
    # mismatches and incremental snapshots after a ledger reset included, and refuses none at POST
    "HL-POST-5": SNAP_MUST | {"HL-CONFIG-1", "HL-LEDGER-1", "HL-POST-5a"},
    # validation after the 200 serves nothing broken, but refuses nothing at POST time either
    "HL-POST-5a": SNAP_MUST | {"SNAP-ID-1"},
}
JUDGED = {"pass", "not-applicable"}


@pytest.fixture(autouse=True)
def _shared_reference_cases(reference, monkeypatch):
    """Every row's run judges the same reference snapshots: build them once per worker."""
    from pytest_rlrollout.snapshot import cases

    monkeypatch.setattr(cases, "ReferenceCases", lambda root: reference)


def run_suite(pytester: pytest.Pytester, *args: str) -> dict[str, str]:
    """The installed suite, in this process; clause → outcome from its report."""
    result = pytester.runpytest_inprocess(*args, "-p", "no:randomly", "-p", "no:cacheprovider", "--rl-report=r.json")
    report = pytester.path / "r.json"
    assert report.is_file(), "\n".join(result.outlines[-30:])
    return {k: v["outcome"] for k, v in json.loads(report.read_text())["clauses"].items()}


@pytest.mark.parametrize("transition", ["ASYNC", "SYNC"])
def test_no_fault_every_clause_passes(pytester, transition):
    got = run_suite(pytester, str(CONFORMANCE), f"--rl-transition={transition}")
    assert {k: v for k, v in got.items() if v not in JUDGED} == {}
    assert {c.id for c in catalogue() if c.area != "NUM"} <= set(got)


def test_every_switch_and_variant_is_in_the_matrix():
    assert set(FAULTS) <= {c.id for c in catalogue()}  # switches name real clauses
    assert set(broken.BREAKERS) == {c.id for c in catalogue().area("SNAP")}
    assert {c.id for c in catalogue() if c.area not in ("NUM", "SNAP")} <= set(FAULTS), "a clause without a switch"


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_switch_fails_its_clause(pytester, fault):
    area = fault.split("-")[0]
    args = [str(CONFORMANCE / AREA_MODULE[area]), f"--rl-local-fault={fault}"]
    if fault.startswith("SWAP-SYNC"):
        args.append("--rl-transition=SYNC")
    if area == "SNAP":  # the deployment stops enforcing one SNAP rule at hot-load time
        args += ["-k", f"{fault} or nested"]
    got = run_suite(pytester, *args)
    write_row(fault, "fault switch", got, fault)
    assert got.get(fault) == "fail", got
    others = {k for k, v in got.items() if v == "fail"} - {fault}
    # a SNAP rule not enforced at hot-load time serves that rule's violating variant (HL-POST-5)
    allowed = COLLATERAL.get(fault, {"HL-POST-5"} if area == "SNAP" else set())
    assert others <= allowed, f"{fault} also fails {sorted(others)}"
