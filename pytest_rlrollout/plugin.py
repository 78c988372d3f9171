"""The pytest plugin: options, the `rl_clause` marker, and the snapshot fixtures.

`pytest --rl-snapshot=DIR` with no test paths runs the installed SNAP conformance tests on
DIR (the exporter gate); `rl_validate_snapshot` lets users call the validator from their own
tests. Without `--rl-snapshot` the SNAP tests check the bundled reference snapshots.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

OUTCOME_PREFIXES = ("not-applicable", "inconclusive")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rlrollout", "RL-rollout deployment contract")
    group.addoption("--rl-snapshot", metavar="DIR", help="validate this snapshot directory (the exporter gate)")
    group.addoption("--rl-base", metavar="DIR", help="the base model snapshot the deployment serves")
    group.addoption("--rl-parent", metavar="DIR", help="the parent snapshot: --rl-snapshot is an ARC2 diff of it")
    group.addoption("--rl-signal", metavar="FILE", help="the hot-load request body (JSON) announcing the snapshot")
    group.addoption("--rl-base-model", metavar="NAME", action="append", default=[],
                    help="a name adapter_config.json may use for the base model")  # fmt: skip
    group.addoption("--rl-level", choices=["must", "should"], default="should",
                    help="'must': failures of SHOULD clauses do not fail the run")  # fmt: skip
    group.addoption("--rl-deployment", metavar="NAME", default=None,
                    help="'local' (default: start the reference deployment) or accounts/<a>/deployments/<d>")  # fmt: skip
    group.addoption("--rl-base-url", metavar="URL", default=None,
                    help="the deployment's API base (default https://api.fireworks.ai)")  # fmt: skip
    group.addoption("--rl-inference-url", metavar="URL", default=None, help="default: base URL + /inference")
    group.addoption(
        "--rl-model", metavar="NAME", default=None, help="the model the deployment serves (fireworks-model)"
    )
    group.addoption("--rl-api-key", metavar="KEY", default=None, help="default: $FIREWORKS_API_KEY")
    group.addoption(
        "--rl-local-fault",
        metavar="CLAUSE-ID",
        action="append",
        default=[],
        help="start the local reference deployment with this fault switch on (mutation testing)",
    )
    group.addoption(
        "--rl-report", metavar="PATH", default=None, help="write the per-clause report as JSON (and .md beside it)"
    )
    group.addoption("--rl-allow-hot-load", action="store_true", default=False,
                    help="allow state changes (hot-loads, ledger resets) on a non-local deployment")  # fmt: skip
    for name, help_ in (("rl_deployment", "default deployment"), ("rl_base_url", "default API base URL"),
                        ("rl_model", "default model name")):  # fmt: skip
        parser.addini(name, help_, default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rl_clause(*ids): the contract clauses a test checks (IDs from SPEC.md)")
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Reporting(config), "rlrollout-reporting")
    if config.getoption("rl_snapshot") and config.args_source != pytest.Config.ArgsSource.ARGS:
        from pytest_rlrollout.catalogue import data_dir

        config.args[:] = [str(data_dir("conformance") / "test_snap.py")]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from pytest_rlrollout.catalogue import catalogue

    cat = catalogue()
    for item in items:
        for mark in item.iter_markers("rl_clause"):
            unknown = [c for c in mark.args if c not in cat]
            if unknown or not mark.args:
                raise pytest.UsageError(f"{item.nodeid}: rl_clause names unknown clause(s) {unknown or '(none)'}")
            # carried on every report of the test, so xdist workers' reports keep their clauses
            item.user_properties.extend(("rl_clause", c) for c in mark.args)


def _provenance(config: pytest.Config) -> dict[str, Any]:
    import datetime

    from pytest_rlrollout import __version__

    name = _option(config, "rl_deployment") or "local"
    return {
        "deployment": name,
        "mode": "local" if name == "local" else "live",
        "suite_version": __version__,
        "level": config.getoption("rl_level"),
        "snapshot": config.getoption("rl_snapshot"),
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


class _Reporting:
    """Per-session report state; registered on the controller only (xdist workers just run tests)."""

    def __init__(self, config: pytest.Config):
        from pytest_rlrollout.report import Collector

        self.config, self.collector = config, Collector()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.collector.record(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        path = self.config.getoption("rl_report")
        if path and self.collector.by_test:
            from pytest_rlrollout.report import document, write

            write(path, document(self.collector.clauses(), _provenance(self.config)))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.collector.by_test:
            return
        from pytest_rlrollout.report import SEVERITY, rollup

        counts = rollup(self.collector.clauses())
        terminalreporter.section("rl-rollout clauses")
        for group in ("levels", "areas"):
            for name, c in counts[group].items():
                terminalreporter.write_line(f"{name:8} " + "  ".join(f"{v} {c[v]}" for v in SEVERITY[::-1] if c.get(v)))
        if self.config.getoption("rl_report"):
            terminalreporter.write_line(f"report: {self.config.getoption('rl_report')} (+ .md)")


def pytest_report_header(config: pytest.Config) -> list[str]:
    snapshot = config.getoption("rl_snapshot")
    if snapshot:
        return [f"rlrollout: snapshot {snapshot} (base: {config.getoption('rl_base') or 'none'})"]
    return []


# --------------------------------------------------------------------------- fixtures for users


@pytest.fixture
def rl_validate_snapshot() -> Callable[..., Any]:
    """`rl_validate_snapshot(path, base=..., parent=..., signal=...)` → a validator Report."""
    from pytest_rlrollout.validator import validate

    return validate


def assert_valid(report: Any, level: str = "SHOULD") -> None:
    """Fail a test with every finding of `report` at `level`, one per line."""
    failures = report.failures(level.upper())
    if failures:
        pytest.fail("\n".join([f"{report.snapshot}: {len(failures)} finding(s)", *map(str, failures)]), pytrace=False)


# --------------------------------------------------------------------------- the SNAP conformance subject


@dataclass
class SnapshotUnderTest:
    """A validated snapshot; `expect(clause)` turns the clause's outcome into a test outcome."""

    name: str
    report: Any
    level: str

    def expect(self, clause: str) -> None:
        from pytest_rlrollout.catalogue import catalogue

        outcome = self.report.outcomes.get(clause)
        if outcome is None:
            pytest.fail(f"the validator has no check for {clause}", pytrace=False)
        if outcome.status in OUTCOME_PREFIXES:
            pytest.skip(f"{outcome.status}: {outcome.reason}")
        findings = self.report.of(clause)
        if outcome.status == "fail":
            c = catalogue()[clause]
            if c.level == "SHOULD" and self.level == "must":
                pytest.skip(f"not judged: {clause} is a SHOULD clause and --rl-level=must")
            lines = [
                f"{clause} [{c.level}] {c.rule}",
                f"snapshot: {self.report.snapshot}",
                *(f"  {f}" for f in findings),
            ]
            pytest.fail("\n".join(lines), pytrace=False)
        assert not findings, findings


# The bundled reference snapshots and the snapshot kind each one is.
REFERENCE_SUBJECTS = {"full": "full", "incremental": "incremental", "lora": "lora", "quantized": "full"}


def _subjects(metafunc: pytest.Metafunc) -> list[str]:
    """A given snapshot is judged on every clause (its report lists the not-applicable ones);
    the reference snapshots only on the clauses that apply to their kind."""
    if metafunc.config.getoption("rl_snapshot"):
        return ["given"]
    from pytest_rlrollout.validator import CHECKS

    marker = metafunc.definition.get_closest_marker("rl_clause")
    kinds = CHECKS[marker.args[0]].kinds if marker and marker.args and marker.args[0] in CHECKS else None
    return [s for s, kind in REFERENCE_SUBJECTS.items() if kinds is None or kind in kinds]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "rl_snapshot_under_test" in metafunc.fixturenames:
        metafunc.parametrize("rl_snapshot_under_test", _subjects(metafunc), indirect=True)


@pytest.fixture(scope="session")
def rl_reference_cases(tmp_path_factory: pytest.TempPathFactory):
    """Valid reference snapshots of every kind (full, incremental, lora, quantized)."""
    from pytest_rlrollout.broken import ReferenceCases

    return ReferenceCases(tmp_path_factory.mktemp("rl-reference"))


@pytest.fixture(scope="session")
def _rl_snapshot_reports() -> dict[str, SnapshotUnderTest]:
    return {}


@pytest.fixture
def rl_snapshot_under_test(request: pytest.FixtureRequest, _rl_snapshot_reports) -> SnapshotUnderTest:
    """The snapshot the SNAP conformance tests judge, validated once per session."""
    key = request.param
    reports = _rl_snapshot_reports
    if key not in reports:
        if key == "given":
            report = _validate_given(request.config)
        else:
            report = request.getfixturevalue("rl_reference_cases")[key].validate()
        reports[key] = SnapshotUnderTest(key, report, request.config.getoption("rl_level"))
    return reports[key]


def _validate_given(config: pytest.Config) -> Any:
    from pytest_rlrollout.validator import validate

    path = Path(config.getoption("rl_snapshot"))
    if not path.is_dir():
        raise pytest.UsageError(f"--rl-snapshot {path}: not a directory")
    signal_file = config.getoption("rl_signal")
    signal = json.loads(Path(signal_file).read_text()) if signal_file else None
    return validate(
        path,
        base=config.getoption("rl_base"),
        parent=config.getoption("rl_parent"),
        signal=signal,
        base_model=tuple(config.getoption("rl_base_model")),
    )


# --------------------------------------------------------------------------- the deployment under test

DEFAULT_BASE_URL = "https://api.fireworks.ai"


class HotLoadNotAllowed(Exception):
    """A state change was attempted on a live deployment without --rl-allow-hot-load."""


class RLDeployment:
    """The deployment under test: a DeploymentClient, plus where test snapshots go and whether
    the suite may change the deployment's state."""

    def __init__(
        self, client: Any, *, allow_hot_load: bool, bucket: Path | None = None, base_snapshot: Path | None = None
    ):
        self.client, self.allow_hot_load = client, allow_hot_load
        self.bucket, self.base_snapshot = bucket, base_snapshot

    @property
    def target(self) -> Any:
        return self.client.target

    @property
    def mode(self) -> str:
        return self.target.mode

    def hot_load(self, body: Any, **kw: Any) -> Any:
        self._check_allowed("hot-load")
        return self.client.hot_load(body, **kw)

    def reset_ledger(self) -> Any:
        self._check_allowed("ledger reset")
        return self.client.reset_ledger()

    def _check_allowed(self, what: str) -> None:
        if not self.allow_hot_load:
            raise HotLoadNotAllowed(
                f"refusing a {what} on {self.target.deployment}: pass --rl-allow-hot-load to allow state changes"
            )

    @property
    def base_config(self) -> dict[str, Any] | None:
        """config.json of the served base model, when a local copy is known (--rl-base)."""
        import json as _json

        if self.base_snapshot is None or not (self.base_snapshot / "config.json").is_file():
            return None
        return _json.loads((self.base_snapshot / "config.json").read_text())

    def __getattr__(self, name: str) -> Any:  # status, wait, ledger, complete, capabilities, ...
        return getattr(self.client, name)


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    return (
        value
        if value is not None
        else config.getini(name)
        if name in ("rl_deployment", "rl_base_url", "rl_model")
        else None
    )


@pytest.fixture(scope="session")
def rl_deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The deployment under test (`--rl-deployment`); the reference deployment by default."""
    import os

    from pytest_rlrollout.client import DeploymentClient, Target

    config = request.config
    name = _option(config, "rl_deployment") or "local"
    if name == "local":
        from pytest_rlrollout import refmodel
        from pytest_rlrollout.deployment import reference_deployment

        bucket = tmp_path_factory.mktemp("rl-bucket")
        with reference_deployment(bucket, faults=frozenset(config.getoption("rl_local_fault"))) as dep:
            target = Target(dep.name, dep.base_url, dep.model, dep.api_key, mode="local")
            with DeploymentClient(target) as client:
                yield RLDeployment(
                    client, allow_hot_load=True, bucket=bucket, base_snapshot=bucket / refmodel.BASE_IDENTITY
                )
        return
    model = _option(config, "rl_model")
    if not model:
        raise pytest.UsageError(f"--rl-deployment {name}: also pass --rl-model (the model it serves)")
    key = config.getoption("rl_api_key") or os.environ.get("FIREWORKS_API_KEY")
    if not key:
        raise pytest.UsageError(f"--rl-deployment {name}: pass --rl-api-key or set FIREWORKS_API_KEY")
    try:
        target = Target(name, _option(config, "rl_base_url") or DEFAULT_BASE_URL, model, key,
                        inference_url=config.getoption("rl_inference_url") or "", mode="live")  # fmt: skip
    except ValueError as e:
        raise pytest.UsageError(f"--rl-deployment: {e}") from None
    base = config.getoption("rl_base")
    with DeploymentClient(target) as client:
        yield RLDeployment(
            client, allow_hot_load=config.getoption("rl_allow_hot_load"), base_snapshot=Path(base) if base else None
        )
