"""The pytest plugin (entry point `rlrollout`): options, markers and the run's report.

Options are read once into `RLOptions` (suite/options.py); the fixtures live in the modules
listed in `pytest_plugins`: the deployment under test, swaps and snapshots, sessions, and the
exporter gate. This module and those stay cheap to import: heavy imports wait for a fixture.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_rlrollout.suite.options import CONFORMANCE, OPTIONS, add_options, options, read_options
from pytest_rlrollout.suite.outcomes import SHOULD_FAILURE

pytest_plugins = [
    "pytest_rlrollout.suite.deployment",
    "pytest_rlrollout.suite.swaps",
    "pytest_rlrollout.suite.session",
    "pytest_rlrollout.suite.gate",
]

MARKERS = (
    "rl_clause(*ids): the contract clauses a test judges (IDs from `rlrollout clauses`)",
    "rl_swaps: the test changes the deployment's state (hot-loads, ledger resets)",
    "rl_requires(*capabilities): optional features the test needs",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[OPTIONS] = read_options(config)  # a usage error ends the run here, before collection
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    if not hasattr(config, "workerinput"):
        from pytest_rlrollout.suite.reporting import Reporting

        config.pluginmanager.register(Reporting(config), "rlrollout-reporting")
    if options(config).snapshot is not None and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [str(CONFORMANCE / "test_snap.py")]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from pytest_rlrollout.contract import catalogue

    cat = catalogue()
    for item in items:
        for mark in item.iter_markers("rl_clause"):
            unknown = [c for c in mark.args if c not in cat]
            if unknown or not mark.args:
                raise pytest.UsageError(f"{item.nodeid}: rl_clause names unknown clause(s) {unknown or '(none)'}")
            # carried on every report of the test, so xdist workers' reports keep their clauses
            item.user_properties.extend(("rl_clause", c) for c in mark.args)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """--rl-level=must: a failure of SHOULD clauses only is reported (the clause's outcome stays
    `fail` in the report) but does not fail the run: pytest shows it as xfailed."""
    report = yield
    if report.when != "call" or not report.failed or options(item.config).level != "must":
        return report
    from pytest_rlrollout.contract import catalogue

    clauses = [v for k, v in item.user_properties if k == "rl_clause"]
    if clauses and all(catalogue()[c].level == "SHOULD" for c in clauses):
        report.outcome = "skipped"
        report.wasxfail = f"{SHOULD_FAILURE} {', '.join(clauses)} (a SHOULD clause; --rl-level=must)"
    return report


def pytest_report_header(config: pytest.Config) -> list[str]:
    o = options(config)
    if o.snapshot is not None:
        return [f"rlrollout: snapshot {o.snapshot} (base: {o.base_snapshot or 'none'})"]
    return [f"rlrollout: {o.mode} deployment {o.deployment or 'reference'}"] if o.mode != "local" else []
