"""The pytest side of the run's report: collects every clause-tagged test's outcome (on the
controller only; xdist workers just run tests) into the report model, writes `--rl-report`
through `report.files.write`, and prints the roll-up at the end."""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.suite.evidence import evidence_of
from pytest_rlrollout.suite.options import options
from pytest_rlrollout.suite.outcomes import outcome_of
from pytest_rlrollout.suite.report.diagnosis import DiagnosisSummary
from pytest_rlrollout.suite.report.files import paths, write
from pytest_rlrollout.suite.report.header import Provenance
from pytest_rlrollout.suite.report.model import (
    FAILED,
    ClauseResult,
    Report,
    Summary,
    TestResult,
    in_catalogue_order,
)
from pytest_rlrollout.suite.report.soak import SoakSummary
from pytest_rlrollout.suite.report.text import OUTCOMES
from pytest_rlrollout.suite.run_config import RLConfig
from pytest_rlrollout.suite.run_start import run_state
from pytest_rlrollout.suite.stash import DISCOVERED, WORKER_DISCOVERY
from pytest_rlrollout.suite.swaps import served_by

SOAK_PROPERTY = "rl_soak"  # a soak's summary (`SoakSummary` JSON), on the report of the test that carries it
DIAGNOSIS_PROPERTY = (
    "rl_diagnosis"  # a diagnosis (`Diagnosis.as_dict` JSON), on the report of `rlrollout diagnose`'s test
)


class Collector:
    """Gathers the outcome of every clause-tagged test (xdist workers' reports included): the
    worst of its setup, call and teardown phases, with the call's evidence."""

    def __init__(self) -> None:
        self.by_test: dict[str, tuple[list[str], TestResult]] = {}
        self.soak: SoakSummary | None = None
        self.diagnosis: DiagnosisSummary | None = None

    def record(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == SOAK_PROPERTY:
                self.soak = SoakSummary.from_json(json.loads(str(value)))
            elif key == DIAGNOSIS_PROPERTY:
                self.diagnosis = DiagnosisSummary.from_json(json.loads(str(value)))
        clauses = [str(v) for k, v in report.user_properties if k == "rl_clause"]
        if not clauses:
            return
        outcome, reason = outcome_of(report)
        _, t = self.by_test.setdefault(report.nodeid, (clauses, TestResult(report.nodeid)))
        t.duration += report.duration
        seen = evidence_of(report)
        if seen is not None:
            t.observed, t.exchanges, t.timeline, t.uploads = seen.observed, seen.exchanges, seen.timeline, seen.uploads
            t.numerics, t.measures = seen.numerics, seen.measures
            t.planned, t.done = seen.planned, seen.done
            if outcome in FAILED and seen.reason:
                reason = seen.reason  # the assertion's own message, not pytest's last lines
        if outcome.severity < t.outcome.severity:
            t.outcome, t.reason = outcome, reason

    def clauses(self) -> dict[str, ClauseResult]:
        """One result per clause, in the catalogue's order."""
        cat = catalogue()
        out: dict[str, ClauseResult] = {}
        for clauses, t in (self.by_test[k] for k in sorted(self.by_test)):
            for cid in clauses:
                c = cat[cid]
                out.setdefault(cid, ClauseResult(cid, c.level, c.area, c.rule)).add(t)
        return in_catalogue_order(out)


class Reporting:
    def __init__(self, config: pytest.Config):
        self.config, self.collector, self.started = config, Collector(), time.monotonic()
        self.discovery: dict[str, Any] | None = None  # what an xdist worker discovered

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.collector.record(report)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        found = (getattr(node, "workeroutput", None) or {}).get(WORKER_DISCOVERY)
        if found and self.discovery is None:
            self.discovery = json.loads(found)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        path = options(self.config).report
        collected = self.collector
        if path and (collected.by_test or collected.diagnosis is not None):
            report = Report.judged(collected.clauses(), provenance(self.config), self._discovery())
            write(path, replace(report, soak=collected.soak, diagnosis=collected.diagnosis))

    def _discovery(self) -> dict[str, Any] | None:
        """The engine and capabilities the run judged: found in this process, by a worker, or
        in the recording being replayed."""
        found = self.config.stash.get(DISCOVERED, None)
        if found is not None:
            return found.as_dict()
        meta = options(self.config).replay_meta or {}
        return self.discovery or meta.get("discovery")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.collector.by_test:
            return
        summary = Summary.of(self.collector.clauses())
        terminalreporter.section("rl-rollout clauses")
        for _, group in summary.groups():
            for name, c in group.items():
                shown = "  ".join(f"{o} {c[o]}" for o in OUTCOMES if c.get(o))
                terminalreporter.write_line(f"{name:8} {shown}")
        planned = [t for _, t in self.collector.by_test.values() if t.planned is not None]
        if planned:
            off = [t for t in planned if t.off_plan]
            terminalreporter.write_line(
                f"plan: {len(planned)} tests planned, {len(planned) - len(off)} loaded as planned"
                + "".join(
                    f"\n  off plan: {t.test} ({', '.join(t.off_plan)}: {t.planned} planned, {t.done} done)" for t in off
                )
            )
        terminalreporter.write_line(f"wall time {time.monotonic() - self.started:.1f} s")
        report = options(self.config).report
        if report:
            terminalreporter.write_line("report: " + ", ".join(map(str, paths(report))))


def provenance(config: pytest.Config) -> Provenance:
    """Where the verdicts come from: deployment, mode, recording, suite version, base digest, and
    for a live run what was served at the start and at the end."""
    from pytest_rlrollout import __version__

    o = options(config)
    cassettes = o.replay or o.record
    out = {
        "deployment": o.deployment or "local",
        "mode": o.mode,
        "cassettes": _cassette_digest(cassettes),
        "recorded": str(o.record) if o.record else None,
        "base_url": o.base_url,
        "suite_version": __version__,
        "level": o.level,
        "transition": o.transition,
        "snapshot": str(o.snapshot) if o.snapshot else None,
        "base_digest": _base_digest(o),
        "numerics": (
            f"served in {o.numerics.dtype}: fingerprint tolerance {o.numerics.fingerprint_tolerance:g}, "
            f"logprob tolerance {o.numerics.logprob_tolerance:g}; from {o.numerics.source}"
        ),
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if o.mode == "live":
        out.update(_live_state(config))
    return Provenance.from_json({k: v for k, v in out.items() if v is not None})


def _cassette_digest(directory: Path | None) -> str | None:
    if directory is None or not directory.is_dir():
        return None
    from pytest_rlrollout.remote.cassette import digest

    return digest(directory)


def _base_digest(o: RLConfig) -> str | None:
    """sha256 over the base's config, index and spec (what a swap is built from)."""
    from pytest_rlrollout.snapshot.layout import CONFIG, INDEX, SPEC

    if o.base_snapshot is None:
        if o.mode == "local":
            from pytest_rlrollout.snapshot import tiny_moe

            return f"reference model {tiny_moe.BASE_IDENTITY}"
        return None
    h = hashlib.sha256()
    for name in (CONFIG, INDEX, SPEC):
        path = o.base_snapshot / name
        h.update(path.read_bytes() if path.is_file() else b"")
    return "sha256:" + h.hexdigest()


def _live_state(config: pytest.Config) -> dict[str, Any]:
    """What was served at the start and at the end, and how to restore the start."""
    state = run_state(config)
    start = state.start
    if start is None:
        return {}
    end = state.end or start
    cleanups = state.cleanups  # one read of the workers' files
    removed = sorted({i for c in cleanups for i in c.removed})
    kept = sorted({i for c in cleanups for i in c.kept} - set(removed))  # kept until the start was restored
    before, after = start.identities, end.identities
    adapters = sorted(
        {i for r in end.replicas for i in served_by(r)} - {i for r in start.replicas for i in served_by(r)} - set(after)
    )
    out: dict[str, Any] = {
        "served_at_start": before,
        "served_at_end": after,
        "uploaded_and_removed": removed,
        "uploaded_and_kept": kept,
        "adapters_left_loaded": adapters,
    }
    restored = state.restore
    if restored is not None:
        out["restored"] = restored.restored
    elif before != after:
        out["restore"] = (
            f"the run left {after} serving (kept in the bucket); to serve {before} again, upload it under a new "
            f"identity (identities cannot be reused) and signal it as a full snapshot, "
            f'e.g. POST /hot_load/v1/models/hot_load {{"identity": "<new identity>"}}'
        )
    return out
