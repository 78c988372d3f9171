"""What a test saw: its observations (what a pass rests on), the exchanges behind a failure,
and for swap tests a timeline. Carried on the test's report (xdist-safe) as the report model's
`TestResult`, read by the collector (`suite.reporting`).

A clause test that passes without observing anything is `inconclusive`, never a pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_rlrollout.suite.report import model

EVIDENCE = "rl_evidence"  # the user_properties key


@dataclass
class Timeline(model.Timeline):
    """Records a swap test's observations over time for the report's picture, on the run's clock
    (`RLDeployment.mark`: on the cassette's timeline in replay); `relative` is the report's
    timeline, its times from the first event."""

    _last: dict[int, str] = field(default_factory=dict, repr=False)

    def mark(self, t: float, what: str) -> None:
        self.marks.append((t, what))

    def status(self, t: float, replicas: list[dict[str, Any]]) -> None:
        """One status poll: every replica whose state changed since the last poll is noted."""
        for i, r in enumerate(replicas):
            said = replica_state(r)
            if self._last.get(i) != said:
                self._last[i] = said
                self.replicas.append((t, i, said))

    def relative(self) -> model.Timeline:
        t0 = min(self.times(), default=0.0)

        def r(t: float) -> float:
            return round(t - t0, 4)

        return model.Timeline(
            title=self.title,
            old=self.old,
            new=self.new,
            chunks=[(r(t), v) for t, v in self.chunks],
            marks=[(r(t), what) for t, what in self.marks],
            replicas=[(r(t), i, said) for t, i, said in self.replicas],
            probes=[(r(sent), r(answered), status) for sent, answered, status in self.probes],
        )


def replica_state(replica: dict[str, Any]) -> str:
    """What a replica's status says, in a few words: 'serving X', 'loading Y', 'error Y'."""
    from pytest_rlrollout.remote.replicas import loading_state  # the plugin imports this module: httpx only when used

    state = loading_state(replica)
    stage, target = state.get("stage"), state.get("target_snapshot_identity")
    current = replica.get("current_snapshot_identity")
    if stage and stage not in ("ready", "idle", "done") and target and target != current:
        return f"{stage} {target}"
    return f"serving {current}" if replica.get("readiness") else f"not ready ({stage or 'no stage'})"


@dataclass
class Observed:
    """`rl_observe(n, what)`: the test judged `n` of `what` (n = 0 is nothing)."""

    facts: list[tuple[int, str]] = field(default_factory=list)
    timeline: Timeline | None = None
    uploads: list[dict[str, Any]] = field(default_factory=list)  # snapshots built: bytes uploaded and copied
    figures: dict[str, Any] | None = None  # numbers a clause reports (NUM figures, FID's max |Δ|)
    swaps: int = 0  # loads the deployment served for this test
    planned: dict[str, int] | None = None  # what the run's plan said it would load (runs.plan.TestPlan.figures)

    def __call__(self, n: int, what: str) -> int:
        self.facts.append((int(n), what))
        return n

    def swap(self, title: str) -> Timeline:
        """Start this test's timeline (one per test: the last one started is reported)."""
        self.timeline = Timeline(title)
        return self.timeline

    def loaded(self) -> dict[str, int]:
        """What the test loaded, in the figures its plan gives (`runs.plan.TestPlan.figures`):
        swaps, snapshots built and their bytes as the factory noted them."""
        from pytest_rlrollout.runs.plan import BYTES

        return {
            "swaps": self.swaps,
            "built": len(self.uploads),
            **{k: sum(int(u.get(k) or 0) for u in self.uploads) for k in BYTES},
        }

    @property
    def anything(self) -> bool:
        return any(n > 0 for n, _ in self.facts)

    def text(self) -> str:
        return "; ".join(f"{n} {what}" for n, what in self.facts if n > 0)


OBSERVED = pytest.StashKey[Observed]()


def observed(item: pytest.Item) -> Observed:
    if OBSERVED not in item.stash:
        item.stash[OBSERVED] = Observed()
    return item.stash[OBSERVED]


def telling(exchanges: list[Any], n: int) -> list[Any]:
    """The last `n` exchanges, status polls folded into the latest one (a swap test polls the
    status dozens of times; the stream or signal before them is what proves a failure)."""
    polls = [i for i, e in enumerate(exchanges) if e.method == "GET" and e.path.endswith("/hot_load")]
    kept = [e for i, e in enumerate(exchanges) if i not in polls[:-1]]
    return kept[-n:]


def attach(report: pytest.TestReport, item: pytest.Item, exchanges: list[Any], assertion: str = "") -> None:
    """Put the test's observations, failure message, exchanges and timeline on its report, as the
    report's own record of a test (its outcome is left to the collector, which reads every phase)."""
    o = observed(item)
    numerics, measures = model.figures_from_json(o.figures)
    seen = model.TestResult(
        report.nodeid,
        reason=assertion,
        observed=o.text(),
        exchanges=[e.text() for e in exchanges],
        timeline=o.timeline.relative() if o.timeline is not None else None,
        uploads=[model.Upload.from_json(u) for u in o.uploads],
        numerics=numerics,
        measures=measures,
        planned=o.planned,
        done=o.loaded() if o.planned is not None or o.uploads or o.swaps else None,
    )
    report.user_properties.append((EVIDENCE, json.dumps(seen.to_json())))


def evidence_of(report: pytest.TestReport) -> model.TestResult | None:
    """What `attach` put on a test's report (its `reason` is the failure's message), if anything."""
    for key, value in report.user_properties:
        if key == EVIDENCE:
            return model.TestResult.from_json(json.loads(str(value)))
    return None
