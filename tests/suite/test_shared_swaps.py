"""The core profile's shared swaps (`suite.shared`): the tests that can be judged on one swap are
judged on one, the first of each share making it with every part the others need observed
around it; the verdicts are the full profile's, a fault included, at fewer swaps; the plan
counts each shared swap once; a replay of a core run replays the shared swaps."""

import json

import pytest

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.reference.faults import clause_of
from pytest_rlrollout.suite.options import CONFORMANCE

from ..support import conformance_module
from . import test_mutation_matrix as matrix
from .test_mutation_matrix import NEVER_SERVED, ROWS, Setup, fault_args, run_suite_report
from .test_replay import replay

one_replica, routed_experts = matrix.one_replica, matrix.routed_experts  # the fixtures the rows ask for

RESETS = ("all", "new_session", "none")
# the modules whose tests share swaps (the broken-snapshot variants of test_hot_load left out)
SHARING_MODULES = ("test_cache.py", "test_fidelity.py", "test_hot_load.py", "test_swap.py", "test_version.py")
MODULES = [str(CONFORMANCE / m) for m in ("test_cache.py", "test_swap.py")]
# a shared swap's parts, each judged by its own cell: 'new_session' keeping a prefix for a new
# session (NS-NEW fails) while the owner's reuse (NS-SAME) and the stream across it pass; a reset
# that ends the streams in flight (SWAP-KV-1 fails) on swaps the cache cells pass on
FAULTS = "CACHE-MATRIX-NS-NEW SWAP-KV-1"


def run(pytester, profile: str, *args: str) -> tuple[dict, dict, dict]:
    """The two modules against the reference deployment with the faults on: (clause outcomes,
    each test's outcome, each test's report entry)."""
    result = pytester.runpytest_inprocess(
        *MODULES,
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "-o",
        f"rl_profile={profile}",
        "-o",
        f"rl_local_faults={FAULTS}",
        f"--rl-report={profile}.json",
        *args,
    )
    assert result.ret in (0, 1), "\n".join(result.outlines[-30:])
    doc = json.loads((pytester.path / f"{profile}.json").read_text())
    tests = {t["test"]: t for c in doc["clauses"].values() for t in c["tests"]}
    return {k: c["outcome"] for k, c in doc["clauses"].items()}, {k: t["outcome"] for k, t in tests.items()}, tests


def swaps(tests: dict) -> int:
    return sum((t.get("done") or {}).get("swaps", 0) for t in tests.values())


def test_the_core_profile_judges_a_share_on_one_swap_with_the_full_profiles_verdicts(pytester):
    """Faults in two parts of one share: every test core runs gets the verdict full gives it (core
    leaves out what judges no MUST clause), with one swap per reset_prompt_cache value (and the
    default) where full makes one a test."""
    full, full_tests, full_seen = run(pytester, "full")
    core, core_tests, core_seen = run(pytester, "core")
    left_out = {k for k, t in core_seen.items() if "left out by the profile core" in t["reason"]}
    assert [k.rpartition("::")[2] for k in left_out] == ["test_async_drain_timeout_gets_425"]  # a SHOULD
    assert {k: v for k, v in core_tests.items() if k not in left_out} == {
        k: v for k, v in full_tests.items() if k not in left_out
    }
    assert core == full | {"SWAP-ASYNC-4": "inconclusive"}
    assert full["CACHE-MATRIX-NS-NEW"] == full["SWAP-KV-1"] == "fail" and full["CACHE-MATRIX-NS-SAME"] == "pass"
    shared = sorted(
        k.rpartition("::")[2] for k, t in core_seen.items() if "swap shared with" in t["observed"] + t["reason"]
    )
    assert shared == sorted(
        [
            *(f"test_reset_matrix[CACHE-MATRIX-{c}-NEW]" for c in ("ALL", "NS", "NONE")),
            "test_no_session_is_a_new_session",
            "test_async_stream_survives_the_swap",
            "test_async_policy_version_changes_once",
            "test_async_requests_during_the_swap_are_queued",
            "test_new_requests_carry_the_new_identity",
            *(f"test_cache_reset_never_disturbs_an_in_flight_stream[{p}]" for p in RESETS),
        ]
    )
    # full: a swap for each of the 16 tests that make one; core: one for the default (its stream
    # across the swap and its probes judged by SWAP-ASYNC-1, -2, -3 and SWAP-NEW-1 too), 'all',
    # 'new_session' and 'none' each (the SHOULD test left out)
    assert (swaps(full_seen), swaps(core_seen)) == (16, 4)


def test_a_core_run_replays_its_shared_swaps(pytester, tmp_path):
    """Recorded under the core profile, replayed offline: the same verdicts, no swap made again."""
    cassettes = tmp_path / "cassettes"
    recorded, _, _ = run(pytester, "core", f"--rl-record={cassettes}")
    got, _, _ = replay(pytester, cassettes, *MODULES, "-p", "no:randomly")  # core, as recorded
    assert got == recorded


def shared_clauses() -> set[str]:
    """The clauses judged by the conformance tests that name a share (their `rl_shares` mark),
    read from the modules themselves: a parametrized test's per-case clauses included."""
    found: set[str] = set()
    for path in sorted(CONFORMANCE.glob("test_*.py")):
        module = conformance_module(path, f"_shared_scan_{path.stem}")
        for fn in vars(module).values():
            marks = getattr(fn, "pytestmark", [])
            if not any(m.name == "rl_shares" for m in marks):
                continue
            found |= {c for m in marks if m.name == "rl_clause" for c in m.args}
            cases = [p for m in marks if m.name == "parametrize" for p in m.args[1]]
            found |= {c for p in cases for m in getattr(p, "marks", ()) if m.name == "rl_clause" for c in m.args}
    return found


SHARED = shared_clauses()
CORE_ROWS = [
    row for row in ROWS if clause_of(row.values[0]) in SHARED and catalogue()[clause_of(row.values[0])].level == "MUST"
]


@pytest.mark.parametrize(("fault", "engine"), CORE_ROWS)
def test_every_fault_of_a_shared_clause_is_caught_under_the_core_profile(pytester, request, fault, engine):
    """The mutation matrix's rows of the MUST clauses judged on shared swaps, under the core
    profile, every test of the modules that share swaps run: its clause fails. A part of a shared
    swap never hides a fault from the test that judges it (SWAP-NEW-1's first requests after
    the swap are its own, not the probes' a pause held). Other tests of the same swap may fail
    with it: which ones the full profile's matrix tells."""
    setup = Setup.of(fault, engine)
    for fixture in ("routed_experts", "one_replica"):
        if getattr(setup, fixture):
            request.getfixturevalue(fixture)
    clause = clause_of(fault)
    args = [
        *(str(CONFORMANCE / m) for m in SHARING_MODULES),
        f"--rl-engine={engine}",
        "-o",
        "rl_profile=core",
        "-k",
        "not violating",
        *fault_args(fault),
    ]
    args += ["-o", "rl_transition=SYNC"] if setup.sync else []
    args += ["-o", f"rl_swap_timeout={NEVER_SERVED[clause]}"] if clause in NEVER_SERVED else []
    got, _ = run_suite_report(pytester, *args)
    assert got.get(clause) == "fail", got
