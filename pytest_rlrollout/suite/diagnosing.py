"""`rlrollout diagnose` inside its pytest session: the command's plugin (`Diagnosing`), which the
shipped module `conformance/diagnose.py` hands the deployment under test (the `rl_deployment`
fixture: the bundled reference deployment, a live one or a recording, reached as a conformance run
reaches it). It makes the trainer's numbers (a snapshot scored here, or the trainer's own file),
sets the thresholds from the run's numerics (`runs.diagnose.numerics_band`), runs
`runs.diagnose.Diagnose`, and carries the diagnosis to the run's report (its diagnosis section)
and back to the command, which prints it and decides the exit status.

The plugin is an object in the command's process (`pytest.main(..., plugins=[...])`): the session
runs there, in one process (no xdist workers, which would not have it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

    from pytest_rlrollout.runs.diagnose import Diagnosis, Expected
    from pytest_rlrollout.suite.deployment import RLDeployment

NAME = "rlrollout-diagnose"  # the plugin's name in the session: the shipped module finds it by it
MODULE = "diagnose.py"  # the shipped module, in conformance/: not test_*.py, so no conformance run collects it


class Diagnosing:
    """The command's inputs, the trainer's numbers (`snapshot`: a directory scored here by a local
    forward pass; or `expected`: the trainer's own), and once the session's one test ran, its
    diagnosis (`diagnosis`) or why there is none (`error`). `tell` hears each measurement begin."""

    def __init__(
        self,
        *,
        snapshot: Path | None = None,
        expected: Expected | None = None,
        tell: Callable[[str], None] = lambda _: None,
    ) -> None:
        if (snapshot is None) == (expected is None):
            raise ValueError("the trainer's numbers are a snapshot or an Expected: one of them")
        self.snapshot, self.expected, self.tell = snapshot, expected, tell
        self.__name__ = NAME  # what pytest registers a plugin object under (pluggy's canonical name)
        self.diagnosis: Diagnosis | None = None
        self.error: str | None = None
        self.report: Path | None = None  # the run's --rl-report, where the diagnosis section goes

    def diagnose(self, dep: RLDeployment, item: pytest.Item) -> Diagnosis:
        """The diagnosis of `dep` against the trainer's numbers, carried on `item`'s report (the
        run's report shows it) and kept here for the command. What cannot be measured at all (the
        snapshot cannot be scored, the deployment cannot be reached or its answers read) is kept
        in `error` and raised: the test fails."""
        import httpx

        from pytest_rlrollout.remote.cassette import CassetteMiss
        from pytest_rlrollout.remote.limits import LimitExceeded
        from pytest_rlrollout.runs.diagnose import Diagnose, numerics_band
        from pytest_rlrollout.suite.reporting import DIAGNOSIS_PROPERTY

        self.report = dep.options.report
        numerics = dep.options.numerics
        try:
            declared = _config(self.snapshot) if self.snapshot is not None else dep.base_config
            expected = self.expected if self.expected is not None else self._scored(dep, declared)
            diagnosis = Diagnose(
                dep.driver,
                expected,
                self_tolerance=numerics.fingerprint_tolerance,
                numerics_band=numerics_band(numerics.logprob_tolerance, declared),
                replicas=max(dep.capabilities.replicas, 1),
                paced=dep.observable_swaps,  # the bundled deployment decodes slowly enough for a load to overlap
                tell=self.tell,
                salt=dep.salted("diagnose"),  # this run's (a recording's when replayed)
            ).run()
        except CassetteMiss as e:
            self.error = f"the recording replayed holds no such diagnosis ({e}); record one with --rl-record DIR"
            raise
        except (ValueError, OSError, RuntimeError, httpx.HTTPError, LimitExceeded) as e:
            # (DiagnoseError and the snapshot's errors are ValueErrors, WeightSyncError a RuntimeError)
            self.error = f"{type(e).__name__}: {e}"
            raise
        item.user_properties.append((DIAGNOSIS_PROPERTY, json.dumps(diagnosis.as_dict())))
        self.diagnosis = diagnosis
        return diagnosis

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The session's test skipped (a recording without this diagnosis, replayed): why, kept."""
        if report.skipped and self.diagnosis is None and self.error is None:
            longrepr = report.longrepr
            said = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.error = said.removeprefix("Skipped: ")

    def _scored(self, dep: RLDeployment, declared: dict[str, Any] | None) -> Expected:
        """The canary scored here by a local forward pass of the snapshot (float32, the run's
        scorer), its ids below the snapshot's vocabulary."""
        from pytest_rlrollout.runs.diagnose import Expected
        from pytest_rlrollout.runs.weight_sync import WeightSync

        assert self.snapshot is not None  # (only then)
        vocab = (declared or {}).get("vocab_size")
        tokens = WeightSync(dep.driver, vocab=vocab if isinstance(vocab, int) else None).canary
        numerics = dep.options.numerics
        self.tell(f"the trainer's numbers: the canary scored by a local forward pass of {self.snapshot}")
        return Expected.from_snapshot(self.snapshot, tokens, scorer=numerics.scorer, device=numerics.scorer_device)


def _config(snapshot: Path) -> dict[str, Any] | None:
    """The snapshot's config.json (the precision it declares, its vocabulary), or None."""
    path = snapshot / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    return config if isinstance(config, dict) else None
