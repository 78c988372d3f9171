"""The run's plan and budget in pytest: each test that changes the deployment is planned (its
`rl_loads`, priced by `runs.plan.Planner`) once it holds the deployment, then left out by the
profile or the budget, or run; `rl_plan` (`rlrollout plan`) plans every such test and runs none.

What a test was planned to load and what it did travel on its report (`Observed.planned`,
`Observed.swaps` and its uploads), so the report shows them side by side. What the run has
spent lives in a file beside the run's record, written only under the deployment's exclusive
lock (the lock every state-changing test holds), so xdist workers share one budget.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlrollout.suite.evidence import observed
from pytest_rlrollout.suite.options import options
from pytest_rlrollout.suite.outcomes import inconclusive
from pytest_rlrollout.suite.shared import share_planned, shared_loads

if TYPE_CHECKING:
    from pytest_rlrollout.runs.plan import Load, Planner, TestPlan
    from pytest_rlrollout.suite.deployment import RLDeployment
    from pytest_rlrollout.suite.run_config import Budget


@dataclass
class PlanBook:
    """`rl_plan`: every state-changing test, planned or left out (and why), in run order."""

    planned: list[TestPlan] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (test, why)
    full_bytes: int = 0
    unpriced: list[tuple[str, str]] = field(default_factory=list)  # (test, why its loads are not priced)
    model: str | None = None  # the model the snapshots name (a LoRA's base_model)


BOOK = pytest.StashKey[PlanBook]()


def book(config: pytest.Config) -> PlanBook:
    if BOOK not in config.stash:
        config.stash[BOOK] = PlanBook()
    return config.stash[BOOK]


def declared_loads(request: pytest.FixtureRequest, dep: RLDeployment) -> list[Load] | None:
    """The test's loads as its `rl_loads` marks declare them on this deployment."""
    from pytest_rlrollout.runs.plan import Context, declared

    callspec = getattr(request.node, "callspec", None)
    context = Context(
        has=dep.capabilities.has,
        engine=str(dep.engine),
        spans_only=dep.driver.reading.spans_only,
        reset_policies=dep.driver.reset_policies,
        params=dict(callspec.params) if callspec is not None else {},
    )
    return declared(list(request.node.iter_markers("rl_loads")), context)


def must_clauses_bound(item: pytest.Item, dep: RLDeployment) -> list[str]:
    from pytest_rlrollout.contract import catalogue

    cat = catalogue()
    return [
        c for m in item.iter_markers("rl_clause") for c in m.args if cat[c].level == "MUST" and cat[c].binds(dep.engine)
    ]


class Spent:
    """What the run's state-changing tests have spent, in a file every worker shares."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> dict[str, int]:
        return json.loads(self.path.read_text()) if self.path.is_file() else {}

    def add(self, figures: dict[str, int]) -> None:
        now = self.read()
        for k, v in figures.items():
            now[k] = now.get(k, 0) + v
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(now))
        tmp.replace(self.path)


def spent(config: pytest.Config, dep: RLDeployment) -> Spent:
    import hashlib

    from pytest_rlrollout.suite.run_start import run_dir

    return Spent(run_dir(config) / f"rl-spent-{hashlib.sha256(dep.key.encode()).hexdigest()[:12]}.json")


def over_budget(budget: Budget, plan: TestPlan, full_bytes: int, spent: dict[str, int]) -> str | None:
    """Why the test's plan does not fit what is left of the budget (None when it fits)."""
    full = plan.totals(full_bytes)
    limits = (
        ("rl_max_swaps", budget.swaps, "swaps", full["swaps"]),
        ("rl_max_upload_bytes", budget.upload_bytes, "uploaded", full["uploaded"]),
        ("rl_max_full_uploads", budget.full_uploads, "full_uploads", full["full_uploads"]),
    )
    for key, limit, what, needs in limits:
        if limit is not None and needs and spent.get(what, 0) + needs > limit:
            return (
                f"left out by the run's budget: {key} = {limit}, {spent.get(what, 0)} spent, and this test "
                f"would take {needs} more ({what.replace('_', ' ')})"
            )
    return None


@pytest.fixture(scope="session")
def _rl_planner(
    request: pytest.FixtureRequest, rl_deployment: RLDeployment, rl_snapshots: Any
) -> Iterator[Planner | None]:
    """The run's planner: a dry twin of its snapshot factory (None without a factory, and when
    recording or replaying: a plan asks what is served, an exchange no cassette holds)."""
    if rl_snapshots is None or rl_deployment.cassettes is not None:
        yield None
        return
    from pytest_rlrollout.runs.plan import Planner

    planner = Planner(rl_snapshots, None, reference_cases=lambda: request.getfixturevalue("rl_base_cases"))
    book(request.config).full_bytes, book(request.config).model = rl_snapshots.full_bytes, rl_snapshots.model
    yield planner
    planner.close()


def plan_or_leave_out(request: pytest.FixtureRequest, dep: RLDeployment) -> None:
    """For a state-changing test that holds the deployment: the profile, the plan and the budget.
    Under `rl_plan` the test is planned and not run."""
    item, budget = request.node, dep.options.budget
    if budget.profile == "read-only":
        _leave_out(request, "left out by the profile read-only (rl_profile): it changes what the deployment serves")
    if budget.musts_only and not must_clauses_bound(item, dep):
        _leave_out(
            request, f"left out by the profile core (rl_profile): it judges no MUST clause that {dep.engine} binds"
        )
    planning = budget.plan is not None
    if not (planning or budget.limited or dep.mode == "live"):
        return
    loads = declared_loads(request, dep)
    if loads is not None:  # the core profile's shared swaps: made once, by the first test of each share
        loads = shared_loads(request.config, item, loads, sharing=budget.shares_swaps, has=dep.capabilities.has)
    planner = request.getfixturevalue("_rl_planner")
    why = None
    if loads is None:
        why = "its loads are not declared (rl_loads)"
    elif planner is None:
        why = "no snapshots can be built here (a bucket and a base are needed), or the run records or replays"
    if why is not None:
        unpriced(request, why)
        return
    from pytest_rlrollout.remote.cassette import portable_id

    if not (planning and planner.synced):  # a plan goes on from what it planned; a run from where it is
        planner.sync(dep.serving())
    before = planner.mark()
    try:
        plan = planner.plan(item.nodeid, loads, key=portable_id(item.nodeid))  # as rl_snapshot_factory names it
    except (LookupError, ValueError, OSError) as e:  # the base lacks what a change needs: the test will say so
        planner.back(before)
        unpriced(request, f"its loads could not be priced ({type(e).__name__}: {e})")
        return
    if planning:
        from pytest_rlrollout.runs.plan import totals

        b = book(request.config)
        why = over_budget(budget, plan, planner.real.full_bytes, totals(b.planned, planner.real.full_bytes))
        if why is not None:
            b.left_out.append((item.nodeid, why))
            planner.back(before)  # the next test is planned without this one's loads
        else:
            b.planned.append(plan)
            share_planned(request.config, item)
        pytest.skip("planned")
    observed(item).planned = plan.figures()
    if budget.limited:
        why = over_budget(budget, plan, planner.real.full_bytes, spent(request.config, dep).read())
        if why is not None:
            inconclusive(why)
    share_planned(request.config, item)


def unpriced(request: pytest.FixtureRequest, why: str) -> None:
    """A test whose loads have no price: a plan lists it so; a run with a budget leaves it out
    (what it would spend is unknown); any other run runs it unplanned."""
    budget = options(request.config).budget
    if budget.plan is not None:
        book(request.config).unpriced.append((request.node.nodeid, why))
        pytest.skip(f"planned: {why}")
    if budget.limited:
        inconclusive(f"left out by the run's budget ({budget.describe()}): {why}, so its cost is unknown")


def _leave_out(request: pytest.FixtureRequest, why: str) -> None:
    if options(request.config).budget.plan is not None:
        book(request.config).left_out.append((request.node.nodeid, why))
    inconclusive(why)


def spend(request: pytest.FixtureRequest, dep: RLDeployment) -> None:
    """After a state-changing test, under its lock: what it did, added to what the run spent."""
    from pytest_rlrollout.runs.plan import priced

    o = observed(request.node)
    did = o.loaded()
    full = book(request.config).full_bytes
    did["full_uploads"] = sum(full > 0 and priced(u, "").is_full_upload(full) for u in o.uploads)
    spent(request.config, dep).add(did)


class PlanPrinter:
    """`rl_plan`: the plan on the terminal, and as JSON at the path given."""

    def __init__(self, config: pytest.Config):
        self.config = config

    def document(self) -> dict[str, Any]:
        from pytest_rlrollout.runs.plan import totals

        o, b = options(self.config), book(self.config)
        budget = o.budget
        sums = totals(b.planned, b.full_bytes)
        estimate = sums.get("swaps", 0) * budget.swap_seconds if budget.swap_seconds is not None else None
        return {
            "deployment": o.deployment or o.base_url or "the bundled reference deployment",
            "engine": self._engine(),
            "model": b.model,
            "profile": budget.profile,
            "budget": {"swaps": budget.swaps, "upload_bytes": budget.upload_bytes, "full_uploads": budget.full_uploads},
            "base_bytes": b.full_bytes,
            "tests": [p.as_dict(b.full_bytes) for p in b.planned],
            "left_out": [{"test": t, "why": why} for t, why in b.left_out],
            "unpriced": [{"test": t, "why": why} for t, why in b.unpriced],
            "totals": sums,
            "swap_seconds": budget.swap_seconds,
            "estimated_seconds": estimate,
        }

    def _engine(self) -> str | None:
        from pytest_rlrollout.suite.stash import DISCOVERED

        found = self.config.stash.get(DISCOVERED, None)
        return found.engine if found is not None else None

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        path = options(self.config).budget.plan
        if path is not None and str(path) != "-":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.document(), indent=1) + "\n")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.section("rl-rollout plan")
        for line in plan_lines(self.document()):
            terminalreporter.write_line(line)
        path = options(self.config).budget.plan
        if path is not None and str(path) != "-":
            terminalreporter.write_line(f"plan: {path}")


def plan_lines(doc: dict[str, Any]) -> list[str]:
    """A plan (`PlanPrinter.document`) as text: a line per test, its loads, and the totals."""
    from pytest_rlrollout.suite.report.text import size

    lines = [
        f"{doc['deployment']} (engine {doc['engine'] or 'not decided'}), profile {doc['profile']}; "
        f"the base is {size(doc['base_bytes'])}"
    ]
    lines.append(
        f"{'swaps':>5} {'signals':>7} {'uploaded':>10} {'copied':>10} {'linked':>10} {'written':>10}  test: loads"
    )
    for t in doc["tests"]:
        loads = ", ".join(f"{p['kind']} {p['end']}" for p in t["loads"]) or "nothing built"
        lines.append(
            f"{t['swaps']:>5} {t['signals']:>7} {size(t['uploaded']):>10} {size(t['copied']):>10} "
            f"{size(t['linked']):>10} {size(t['written']):>10}  {t['test']}: {loads}"
        )
    s = doc["totals"]
    lines.append(
        f"total: {len(doc['tests'])} tests, {s.get('swaps', 0)} swaps, {s.get('signals', 0)} signals, "
        f"{size(s.get('uploaded', 0))} uploaded ({s.get('full_uploads', 0)} whole snapshots), "
        f"{size(s.get('copied', 0))} copied inside the bucket, {size(s.get('linked', 0))} linked, "
        f"{size(s.get('written', 0))} written here"
    )
    if doc["estimated_seconds"] is not None:
        lines.append(
            f"estimated wall time of the swaps: {s.get('swaps', 0)} × {doc['swap_seconds']:g} s = "
            f"{doc['estimated_seconds'] / 60:.0f} min (rl_swap_seconds)"
        )
    else:
        lines.append("estimated wall time: set rl_swap_seconds (how long one swap takes on this deployment)")
    for what, key in (("left out", "left_out"), ("not priced", "unpriced")):
        for t in doc[key]:
            lines.append(f"{what}: {t['test']}: {t['why']}")
    return lines
