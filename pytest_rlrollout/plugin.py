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
SHOULD_FAILURE = "rl-should-failure:"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rlrollout", "RL-rollout deployment contract")
    group.addoption("--rl-snapshot", metavar="DIR", help="validate this snapshot directory (the exporter gate)")
    group.addoption("--rl-base-snapshot", "--rl-base", dest="rl_base", metavar="DIR",
                    help="a local copy of the base model the deployment serves (its directory name = its identity)")  # fmt: skip
    group.addoption("--rl-parent", metavar="DIR", help="the parent snapshot: --rl-snapshot is an ARC2 diff of it")
    group.addoption("--rl-signal", metavar="FILE", help="the hot-load request body (JSON) announcing the snapshot")
    group.addoption("--rl-after-ledger-reset", action="store_true", default=False,
                    help="the deployment's ledger was just reset (the snapshot must then be full: SNAP-INC-7)")  # fmt: skip
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
    group.addoption("--rl-bucket-url", metavar="URL", default=None,
                    help="where the suite may upload test snapshots (the deployment's bucket; fsspec URL or directory)")  # fmt: skip
    group.addoption("--rl-swap-timeout", type=float, metavar="SECONDS", default=None,
                    help="how long a swap may take before the test gives up (default: 5 local, 900 live)")  # fmt: skip
    group.addoption("--rl-record", metavar="DIR", default=None,
                    help="record every exchange with the deployment into cassettes in DIR (one per test)")  # fmt: skip
    group.addoption("--rl-record-mode", choices=["rewrite", "once", "none"], default="rewrite",
                    help="rewrite: record every test anew; once: record only tests without a cassette; "
                         "none: replay the --rl-record directory")  # fmt: skip
    group.addoption("--rl-replay", metavar="DIR", default=None,
                    help="replay the cassettes in DIR instead of talking to a deployment (offline)")  # fmt: skip
    group.addoption("--rl-long-stream-tokens", type=int, metavar="N", default=None,
                    help="length of the streams swaps must land in (default: 64 local, 256 live)")  # fmt: skip
    group.addoption("--rl-transition", choices=["ASYNC", "SYNC", "async", "sync"], default=None,
                    help="the deployment's transition type (local: start the reference deployment with it)")  # fmt: skip
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
    if config.getoption("rl_record") and config.getoption("rl_record_mode") == "none":
        config.option.rl_replay, config.option.rl_record = config.option.rl_record, None
    if config.getoption("rl_record") and config.getoption("rl_replay"):
        raise pytest.UsageError("--rl-record and --rl-replay exclude each other")
    config.addinivalue_line("markers", "rl_clause(*ids): the contract clauses a test checks (IDs from SPEC.md)")
    config.addinivalue_line("markers", "rl_swaps: the test changes the deployment's state (hot-loads, ledger resets)")
    config.addinivalue_line("markers", "rl_requires(*capabilities): optional features the test needs")
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """--rl-level=must: a failure of SHOULD clauses only is reported (the clause's outcome stays
    `fail` in the report) but does not fail the run: pytest shows it as xfailed."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or item.config.getoption("rl_level") != "must":
        return
    from pytest_rlrollout.catalogue import catalogue

    clauses = [v for k, v in item.user_properties if k == "rl_clause"]
    if clauses and all(catalogue()[c].level == "SHOULD" for c in clauses):
        report.outcome = "skipped"
        report.wasxfail = f"{SHOULD_FAILURE} {', '.join(clauses)} (a SHOULD clause; --rl-level=must)"


def _provenance(config: pytest.Config) -> dict[str, Any]:
    import datetime

    from pytest_rlrollout import __version__
    from pytest_rlrollout.subject import cassette_dir, option

    name = option(config, "rl_deployment") or "local"
    replay = config.getoption("rl_replay")
    cassettes = cassette_dir(replay) if replay else config.getoption("rl_record")
    out = {
        "deployment": name if not replay else _replayed_deployment(cassettes),
        "mode": "replay" if replay else "local" if name == "local" else "live",
        "cassettes": _cassette_digest(cassettes),
        "recorded": config.getoption("rl_record"),
        "base_url": option(config, "rl_base_url") if name != "local" else None,
        "suite_version": __version__,
        "level": config.getoption("rl_level"),
        "transition": config.getoption("rl_transition"),
        "snapshot": config.getoption("rl_snapshot"),
        "base_digest": _base_digest(config, local=name == "local"),
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if name != "local" and not replay:
        out.update(_live_state(config))
    return {k: v for k, v in out.items() if v is not None}


def _replayed_deployment(directory: Path) -> str:
    session = directory / "_session.json"
    return json.loads(session.read_text())["meta"].get("deployment", "?") if session.is_file() else "?"


def _cassette_digest(directory: str | Path | None) -> str | None:
    if not directory or not Path(directory).is_dir():
        return None
    from pytest_rlrollout.cassette import digest

    return digest(Path(directory))


def _base_digest(config: pytest.Config, *, local: bool) -> str | None:
    """sha256 over the base's config, index and spec (what a swap is built from)."""
    import hashlib

    from pytest_rlrollout.snapshot import CONFIG, INDEX, SPEC

    base = config.getoption("rl_base")
    if not base:
        if local:
            from pytest_rlrollout import refmodel

            return f"reference model {refmodel.BASE_IDENTITY}"
        return None
    h = hashlib.sha256()
    for name in (CONFIG, INDEX, SPEC):
        path = Path(base) / name
        h.update(path.read_bytes() if path.is_file() else b"")
    return "sha256:" + h.hexdigest()


def _live_state(config: pytest.Config) -> dict[str, Any]:
    """What was served at the start and at the end, and how to restore the start."""
    from pytest_rlrollout.subject import run_dir

    folder = run_dir(config) / "rl-state"
    if not (folder / "start.json").is_file():
        return {}
    start = json.loads((folder / "start.json").read_text())["replicas"]
    ends = sorted(folder.glob("end-*.json"), key=lambda p: json.loads(p.read_text())["at"])
    end = json.loads(ends[-1].read_text())["replicas"] if ends else start
    removed = sorted({i for p in folder.glob("removed-*.json") for i in json.loads(p.read_text())})
    before = sorted({str(r.get("current_snapshot_identity")) for r in start})
    after = sorted({str(r.get("current_snapshot_identity")) for r in end})
    out: dict[str, Any] = {"served_at_start": before, "served_at_end": after, "uploaded_and_removed": removed}
    if before != after:
        out["restore"] = (
            f"the run left {after} serving; to serve {before} again, upload it under a new identity "
            f"(identities cannot be reused) and signal it as a full snapshot, "
            f'e.g. POST /hot_load/v1/models/hot_load {{"identity": "<new identity>"}}'
        )
    return out


class _Reporting:
    """Per-session report state; registered on the controller only (xdist workers just run tests)."""

    def __init__(self, config: pytest.Config):
        import time

        from pytest_rlrollout.report import Collector

        self.config, self.collector, self.started = config, Collector(), time.monotonic()

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
        import time

        terminalreporter.write_line(f"wall time {time.monotonic() - self.started:.1f} s")
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
        ledger_reset=config.getoption("rl_after_ledger_reset"),
    )


# --------------------------------------------------------------------------- the deployment under test

from pytest_rlrollout.subject import (  # noqa: E402  (fixtures are registered by being here)
    HotLoadNotAllowed,
    RLDeployment,
    _rl_deployment_lock,
    rl_deployment,
    rl_session,
    rl_snapshot_factory,
    rl_swap,
)

__all__ = [
    "HotLoadNotAllowed",
    "RLDeployment",
    "_rl_deployment_lock",
    "assert_valid",
    "rl_deployment",
    "rl_session",
    "rl_snapshot_factory",
    "rl_swap",
    "rl_validate_snapshot",
]
