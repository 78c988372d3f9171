"""The soak as a pytest run has it (`conformance/test_soak.py`'s one soak per run): its progress
written to the terminal past pytest's capture, every exchange its own (no test's deadline bounds
it: the soak bounds itself), its books beside the report."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from pytest_rlrollout.soak.run import Result, Settings, Soak
from pytest_rlrollout.suite.swaps import Swapper

if TYPE_CHECKING:
    from pytest_rlrollout.runs.snapshots import SnapshotFactory
    from pytest_rlrollout.suite.deployment import RLDeployment


def terminal_lines(config: pytest.Config, prefix: str) -> Callable[[str], None]:
    """Write a line to the terminal while a test runs, past pytest's capture (no terminal, as on
    an xdist worker: nothing is written)."""
    plugins = config.pluginmanager
    terminal, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")

    def say(line: str) -> None:
        if terminal is not None:
            with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
                terminal.write_line(f"{prefix}{line}")

    return say


def soaked(
    config: pytest.Config,
    rl_deployment: RLDeployment,
    factory: SnapshotFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Result:
    """The run's soak, with the settings it was given: its result, and soak.json beside the
    report (or in a temporary directory)."""
    factory.for_test("soak")
    settings = Settings(**(rl_deployment.options.soak or {}))
    report = rl_deployment.options.report
    workdir = report.parent / "soak" if report is not None else tmp_path_factory.mktemp("rl-soak")
    say = terminal_lines(config, "soak ")
    with rl_deployment.observable_swaps(), rl_deployment.client.scoped(None):
        result = Soak(rl_deployment, Swapper(rl_deployment, factory), settings, workdir, say).run()
    (workdir / "soak.json").write_text(json.dumps(result.to_json(), indent=1) + "\n")
    return result
