"""The mutation matrix: every fault switch of the reference deployment, and every broken snapshot
variant, makes the conformance tests of its clause fail; with no fault, every clause passes.

Each row runs the installed suite in a subprocess and reads its clause report. Rows land in
`build/mutation-matrix/`; the session's end assembles them into `build/mutation-matrix.json`
and `.md` (fault → failing clauses), see conftest.py.
"""

import json
import sys
from pathlib import Path

import pytest

from pytest_rlrollout import broken
from pytest_rlrollout.catalogue import catalogue, data_dir
from pytest_rlrollout.deployment.faults import FAULTS

ROWS = Path(__file__).resolve().parent.parent / "build" / "mutation-matrix"
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


def run_suite(pytester, *args) -> dict[str, str]:
    result = pytester.runpytest_subprocess(*args, "-p", "no:randomly", "--rl-report=r.json")
    report = pytester.path / "r.json"
    assert report.is_file(), "\n".join(result.outlines[-30:])
    return {k: v["outcome"] for k, v in json.loads(report.read_text())["clauses"].items()}


def write_row(name: str, kind: str, got: dict[str, str], clause: str) -> None:
    ROWS.mkdir(parents=True, exist_ok=True)
    failing = sorted(k for k, v in got.items() if v == "fail")
    row = {"switch": name, "kind": kind, "clause": clause, "caught": got.get(clause) == "fail", "failing": failing,
           "inconclusive": sorted(k for k, v in got.items() if v == "inconclusive")}  # fmt: skip
    (ROWS / f"{name}.json").write_text(json.dumps(row))


@pytest.mark.parametrize("transition", ["ASYNC", "SYNC"])
def test_no_fault_every_clause_passes(pytester, transition):
    modules = [str(p) for p in sorted(data_dir("conformance").glob("test_*.py"))]
    got = run_suite(pytester, *modules, "-n", "2", f"--rl-transition={transition}")
    assert {k: v for k, v in got.items() if v not in JUDGED} == {}
    assert {c.id for c in catalogue() if c.area != "NUM"} <= set(got)


def test_unknown_fault_names_are_refused(tmp_path):
    from pytest_rlrollout.deployment import Settings

    with pytest.raises(ValueError, match="unknown fault"):
        Settings(bucket=tmp_path, faults=frozenset({"HL-NOPE-1"}))


def test_every_switch_and_variant_is_in_the_matrix():
    assert set(FAULTS) == {c.id for c in catalogue() if c.id in FAULTS}  # switches name real clauses
    assert set(broken.BREAKERS) == {c.id for c in catalogue().area("SNAP")}
    assert {c.id for c in catalogue() if c.area not in ("NUM", "SNAP")} <= set(FAULTS), "a clause without a switch"


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_switch_fails_its_clause(pytester, fault):
    area = fault.split("-")[0]
    args = [str(data_dir("conformance") / AREA_MODULE[area]), f"--rl-local-fault={fault}"]
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


@pytest.fixture(scope="module")
def variants(reference, tmp_path_factory):
    return reference, tmp_path_factory.mktemp("variants")


@pytest.mark.parametrize("clause", sorted(broken.BREAKERS))
def test_broken_variant_fails_its_clause(pytester, variants, clause):
    reference, root = variants
    case = broken.broken_case(clause, reference, root / clause)
    args = [f"--rl-snapshot={case.snapshot}"]
    if case.base:
        args.append(f"--rl-base={case.base}")
    if case.parent:
        args.append(f"--rl-parent={case.parent}")
    if case.signal is not None:
        signal = root / f"{clause}.signal.json"
        signal.write_text(json.dumps(case.signal))
        args.append(f"--rl-signal={signal}")
    if case.ledger_reset:
        args.append("--rl-after-ledger-reset")
    args += [f"--rl-base-model={m}" for m in case.base_model]
    got = run_suite(pytester, *args)
    write_row(f"variant-{clause}", "broken snapshot", got, clause)
    assert got.get(clause) == "fail", got
    assert {k for k, v in got.items() if v == "fail"} == {clause}, got


def assemble(rows: Path = ROWS) -> dict | None:
    """build/mutation-matrix.json and .md from the rows of this run (called at session end)."""
    files = sorted(rows.glob("*.json")) if rows.is_dir() else []
    if not files:
        return None
    table = [json.loads(p.read_text()) for p in files]
    doc = {"rows": table, "caught": sum(r["caught"] for r in table), "total": len(table)}
    out = rows.parent / "mutation-matrix.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# Mutation matrix: {doc['caught']}/{doc['total']} caught", "",
             "| switch | kind | caught | failing clauses | inconclusive |", "|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['switch']} | {r['kind']} | {'yes' if r['caught'] else 'NO'} | {', '.join(r['failing'])} | "
              f"{', '.join(r['inconclusive'])} |" for r in table]  # fmt: skip
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return doc


if __name__ == "__main__":
    sys.exit(0 if assemble() else 1)
