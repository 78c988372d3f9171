"""The exporter gate in pytest: `pytest --rl-snapshot=DIR` runs the SNAP conformance tests on
DIR, one test per clause; `rl_validate_snapshot` and `assert_valid` call the validator from
users' own tests. Without `--rl-snapshot` the SNAP tests judge the bundled reference snapshots."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlrollout.contract import Outcome, catalogue
from pytest_rlrollout.suite.options import options
from pytest_rlrollout.suite.outcomes import skip_as

if TYPE_CHECKING:
    from pytest_rlrollout.snapshot.cases import ReferenceCases
    from pytest_rlrollout.snapshot.validate import Report


@pytest.fixture
def rl_validate_snapshot() -> Callable[..., Report]:
    """`rl_validate_snapshot(path, base=..., parent=..., signal=...)` → a validator `Report`."""
    from pytest_rlrollout.snapshot.validate import validate

    return validate


def assert_valid(report: Report, level: str = "SHOULD") -> None:
    """Fail a test with every finding of `report` at `level`, one per line."""
    failures = report.failures(level.upper())  # type: ignore[arg-type]
    if failures:
        pytest.fail("\n".join([f"{report.snapshot}: {len(failures)} finding(s)", *map(str, failures)]), pytrace=False)


@dataclass
class SnapshotUnderTest:
    """A validated snapshot; `expect(clause)` turns the clause's verdict into the test's outcome."""

    name: str
    report: Report

    def expect(self, clause: str, observe: Callable[[int, str], int]) -> None:
        """Pass, fail or skip as the validator's verdict on `clause` says; a pass is observed."""
        verdict = self.report.verdicts.get(clause)
        if verdict is None:
            pytest.fail(f"the validator has no check for {clause}", pytrace=False)
        if verdict.outcome != Outcome.PASS and verdict.outcome != Outcome.FAIL:
            skip_as(verdict.outcome, verdict.reason)
        findings = self.report.of(clause)
        if verdict.outcome == Outcome.FAIL:
            c = catalogue()[clause]
            lines = [
                f"{clause} [{c.level}] {c.rule}",
                f"snapshot: {self.report.snapshot}",
                *(f"  {f}" for f in findings),
            ]
            pytest.fail("\n".join(lines), pytrace=False)
        assert not findings, findings
        observe(1, f"{self.name} snapshot checked for {clause} by the validator ({self.report.snapshot})")


# The bundled reference snapshots and the snapshot kind each one is.
REFERENCE_SUBJECTS = {"full": "full", "incremental": "incremental", "lora": "lora", "quantized": "full"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A given snapshot is judged on every clause (its report says which do not apply); the
    reference snapshots only on the clauses that apply to their kind."""
    if "rl_snapshot_under_test" not in metafunc.fixturenames:
        return
    if options(metafunc.config).snapshot is not None:
        subjects = ["given"]
    else:
        from pytest_rlrollout.snapshot.validate import CHECKS

        marker = metafunc.definition.get_closest_marker("rl_clause")
        clause = marker.args[0] if marker and marker.args else None
        kinds = CHECKS[clause].kinds if clause in CHECKS else None
        subjects = [s for s, kind in REFERENCE_SUBJECTS.items() if kinds is None or kind in kinds]
    metafunc.parametrize("rl_snapshot_under_test", subjects, indirect=True)


@pytest.fixture(scope="session")
def rl_reference_cases(tmp_path_factory: pytest.TempPathFactory) -> ReferenceCases:
    """Valid reference snapshots of every kind (full, incremental, lora, quantized)."""
    from pytest_rlrollout.snapshot.cases import ReferenceCases

    return ReferenceCases(tmp_path_factory.mktemp("rl-reference"))


@pytest.fixture(scope="session")
def _rl_snapshot_reports() -> dict[str, SnapshotUnderTest]:
    return {}


@pytest.fixture
def rl_snapshot_under_test(
    request: pytest.FixtureRequest, _rl_snapshot_reports: dict[str, SnapshotUnderTest]
) -> SnapshotUnderTest:
    """The snapshot the SNAP conformance tests judge, validated once per session."""
    key = request.param
    if key not in _rl_snapshot_reports:
        if key == "given":
            report = _validate_given(request.config)
        else:
            report = request.getfixturevalue("rl_reference_cases")[key].validate()
        _rl_snapshot_reports[key] = SnapshotUnderTest(key, report)
    return _rl_snapshot_reports[key]


def _validate_given(config: pytest.Config) -> Any:
    from pytest_rlrollout.snapshot.validate import validate

    o = options(config)
    assert o.snapshot is not None
    return validate(
        o.snapshot,
        base=o.base_snapshot,
        parent=o.parent,
        signal=o.signal,
        base_model=o.base_models,
        ledger_reset=o.after_ledger_reset,
        hf_config=o.hf_config,
    )
