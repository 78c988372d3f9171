"""The pytest plugin (entry point `rlrollout`): options, markers and the run's report.

Options are read once into `RLConfig` (suite/run_config.py) by suite/options.py; the fixtures live in the modules
listed in `pytest_plugins`: the deployment under test, swaps and snapshots, sessions, and the
exporter gate. This module and those stay cheap to import: heavy imports wait for a fixture.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlrollout.contract.outcomes import Outcome
from pytest_rlrollout.suite.evidence import Observed, attach, observed, telling
from pytest_rlrollout.suite.options import CONFORMANCE, OPTIONS, options, read_options
from pytest_rlrollout.suite.outcomes import SHOULD_FAILURE, SUITE_ERROR
from pytest_rlrollout.suite.run_config import RLConfig
from pytest_rlrollout.suite.settings import add_options
from pytest_rlrollout.suite.stash import DISCOVERED, MISSING, RL_TEST, WORKER_DISCOVERY

if TYPE_CHECKING:
    from pytest_rlrollout.remote.discovery import Discovery

EXCHANGES = 4  # the last exchanges of a failed test shown as its evidence
ASSERTION = 2000  # characters of a failure's message kept as evidence

pytest_plugins = [
    "pytest_rlrollout.suite.opening",
    "pytest_rlrollout.suite.holding",
    "pytest_rlrollout.suite.swaps",
    "pytest_rlrollout.suite.session",
    "pytest_rlrollout.suite.gate",
    "pytest_rlrollout.suite.shared",
    "pytest_rlrollout.suite.dating",
    "pytest_rlrollout.suite.violations",
    "pytest_rlrollout.suite.moe",
    "pytest_rlrollout.suite.soak_report",
    "pytest_rlrollout.suite.planning",
]

# fixtures whose users change what the deployment serves: their tests are rl_swaps tests
STATEFUL = frozenset({"rl_swap", "rl_shared"})
MARKERS = (
    "rl_clause(*ids): the contract clauses a test judges (IDs from `rlrollout clauses`)",
    "rl_swaps: the test changes the deployment's state (hot-loads, ledger resets); implied by the rl_swap fixture",
    "rl_requires(*capabilities): optional features the test needs",
    "rl_breaks: the test signals a snapshot that may leave the deployment unable to serve; it runs after the others",
    "rl_soak: a verdict of the soak, run only with -o rl_soak=true (rlrollout soak)",
    "rl_loads(*loads): what a state-changing test loads (runs.plan.Load values, or a function of the deployment "
    "giving them): the run's plan and budget price it",
    "rl_shares(share, *parts): the swap a test is judged on, which the core profile shares with every test "
    "naming the same share (suite.shared)",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[OPTIONS] = read_options(config)  # a usage error ends the run here, before collection
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    if not hasattr(config, "workerinput"):
        if options(config).mode == "live":
            config.stash[DISCOVERED] = _preflight(config)  # once, before any test, on the controller
        if options(config).budget.plan is not None:
            if getattr(config.option, "numprocesses", None):
                raise pytest.UsageError("rl_plan plans the run in one process: drop -n")
            from pytest_rlrollout.suite.planning import PlanPrinter

            config.pluginmanager.register(PlanPrinter(config), "rlrollout-plan")
        else:
            from pytest_rlrollout.suite.reporting import Reporting

            config.pluginmanager.register(Reporting(config), "rlrollout-reporting")
    if options(config).snapshot is not None and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [str(CONFORMANCE / "test_snap.py")]


def _preflight(config: pytest.Config) -> Discovery:
    """Reach the live deployment with the run's names and key, decide its engine and discover
    what it offers; a run that could only misjudge it ends here with what to fix."""
    import httpx

    from pytest_rlrollout.engines import presumed
    from pytest_rlrollout.remote.discovery import PreflightError
    from pytest_rlrollout.remote.drivers import driver_for
    from pytest_rlrollout.remote.limits import LimitExceeded
    from pytest_rlrollout.remote.preflight import preflight
    from pytest_rlrollout.suite.connecting import connect, served_path
    from pytest_rlrollout.suite.run_start import fingerprint_start

    o = options(config)
    # before the preflight decides: the engine the names given point to (a CoreWeave UUID comes with a control plane)
    guess = presumed(deployment=o.deployment, control_url=o.control_url or "")
    with connect(o, o.engine or guess) as probing:
        try:
            engine, decided = preflight(probing.client, o.engine)
            driver = driver_for(engine, probing.client, bucket=served_path(o.bucket_url))
            found = driver.discover(transition=o.transition, decided=decided)
            fingerprint_start(driver, found, o.base_snapshot)
            return found
        except PreflightError as e:
            raise pytest.UsageError(f"preflight: {e}") from None
        except (httpx.HTTPError, LimitExceeded) as e:
            raise pytest.UsageError(
                f"preflight: the deployment stopped answering the capability probes ({type(e).__name__}: {e})"
            ) from None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: workers judge the deployment the controller's preflight discovered."""
    found = node.config.stash.get(DISCOVERED, None)
    if found is not None:
        node.workerinput[WORKER_DISCOVERY] = json.dumps(found.as_dict())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Clause marks checked and carried on every report. Against a live or recorded deployment,
    the SNAP tests' checks of the suite's own bundled snapshots are left out: they would be
    reported as verdicts on a deployment they never asked; without rl_soak, the soak's."""
    from pytest_rlrollout.contract import catalogue

    own: list[pytest.Item] = []
    if options(config).mode != "local" and options(config).snapshot is None:
        own = [i for i in items if "rl_snapshot_under_test" in getattr(i, "fixturenames", ())]
    if options(config).soak is None:  # a soak takes minutes: asked for by name (`rlrollout soak`, -o rl_soak=true)
        own += [i for i in items if i.get_closest_marker("rl_soak") is not None]
    if own:
        config.hook.pytest_deselected(items=own)
        left_out = set(map(id, own))
        items[:] = [i for i in items if id(i) not in left_out]
    # a test that may leave the deployment broken (a real engine has died of a refused load) comes
    # last, so that no other verdict rests on what it left; within each group the order is kept
    items.sort(key=lambda i: i.get_closest_marker("rl_breaks") is not None)
    cat = catalogue()
    for item in items:
        # a test given the means to change the deployment changes it: exclusive, and only with
        # --rl-allow-hot-load on a live deployment (no marker to forget)
        if STATEFUL & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("rl_swaps") is None:
            item.add_marker(pytest.mark.rl_swaps)
        for mark in item.iter_markers("rl_clause"):
            unknown = [c for c in mark.args if c not in cat]
            if unknown or not mark.args:
                raise pytest.UsageError(f"{item.nodeid}: rl_clause names unknown clause(s) {unknown or '(none)'}")
            # carried on every report of the test, so xdist workers' reports keep their clauses
            item.user_properties.extend(("rl_clause", c) for c in mark.args)
    _plan_order(config, items, cat)


def _plan_order(config: pytest.Config, items: list[pytest.Item], cat: Any) -> None:
    """A plan looks only at the tests that change state; a run with a budget spends it on MUST
    clauses first (the tests that may break the deployment still last)."""
    budget = options(config).budget
    if budget.plan is not None:
        read_only = [i for i in items if i.get_closest_marker("rl_swaps") is None]
        if read_only:
            config.hook.pytest_deselected(items=read_only)
            items[:] = [i for i in items if i.get_closest_marker("rl_swaps") is not None]
    if budget.musts_first:

        def must(item: pytest.Item) -> bool:
            return any(cat[c].level == "MUST" for m in item.iter_markers("rl_clause") for c in m.args)

        items.sort(key=lambda i: (i.get_closest_marker("rl_breaks") is not None, not must(i)))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """xdist: a worker sends what it discovered to the controller's report. The controller, once
    every test is done, serves what was served at the start again where the engine allows it."""
    config = session.config
    found = config.stash.get(DISCOVERED, None)
    if found is not None and hasattr(config, "workeroutput"):
        config.workeroutput[WORKER_DISCOVERY] = json.dumps(found.as_dict())
    elif found is not None:
        from pytest_rlrollout.suite.run_start import restore_start

        restore_start(config, found.engine)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """A capability the deployment's engine requires is missing: the test fails, naming it."""
    missing = item.stash.get(MISSING, None)
    if missing is not None:
        pytest.fail(missing, pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """An intent the engine has no binding for, met by a test of a clause it binds (a variant of
    it: `reset_prompt_cache: new_session` on vLLM): that variant is not-applicable, as the
    catalogue makes the clauses it does not bind."""
    from pytest_rlrollout.remote.drivers.base import Unbound
    from pytest_rlrollout.suite.outcomes import not_applicable

    try:
        return (yield)
    except Unbound as e:
        not_applicable(str(e))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """On a clause test's report: its evidence (what it observed, the exchanges, a timeline).
    A pass that observed nothing is `inconclusive`. rl_level = must: a failure of SHOULD clauses
    only is reported (the clause's outcome stays `fail`) but does not fail the run (xfailed)."""
    report = yield
    clauses = [str(v) for k, v in item.user_properties if k == "rl_clause"]
    if report.when != "call" or not clauses:
        return report
    held = item.stash.get(RL_TEST, None)
    exchanges = telling(list(held.exchanges), EXCHANGES) if held is not None and report.failed else []
    attach(report, item, exchanges, _assertion(call) if report.failed else "")
    if report.failed and call.excinfo is not None and not _deployments_fault(call.excinfo.value):
        report.user_properties.append((SUITE_ERROR, type(call.excinfo.value).__name__))
    if report.failed and call.excinfo is not None and (slow := _cut_by_the_suite(call.excinfo.value)):
        report.outcome = "skipped"  # slow is not wrong: a time bound of the suite's is never the deployment's fail
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {Outcome.INCONCLUSIVE}: {slow}")
    if report.passed and not observed(item).anything:
        report.outcome = "skipped"
        report.longrepr = (
            str(item.path),
            item.location[1] or 0,
            f"Skipped: {Outcome.INCONCLUSIVE}: the test observed nothing to judge",
        )
    if report.failed and options(item.config).level == "must":
        from pytest_rlrollout.contract import catalogue

        if all(catalogue()[c].level == "SHOULD" for c in clauses):
            report.outcome = "skipped"
            report.wasxfail = f"{SHOULD_FAILURE} {', '.join(clauses)} (a SHOULD clause; rl_level = must)"
    return report


def _deployments_fault(e: BaseException) -> bool:
    """A test fails the deployment only by an assertion about what it answered (a bound it went
    past included) or by its transport failing; any other exception is the suite's (or a
    cassette's) error, never a finding about the deployment."""
    import httpx

    return isinstance(e, AssertionError | pytest.fail.Exception | httpx.HTTPError)


def _cut_by_the_suite(e: BaseException) -> str | None:
    """Why the test is inconclusive when one of the suite's own time bounds passed before any of
    an answer came (Limits.exchange, the test's deadline); None otherwise. A stream cut while
    sending is judged by the test (`observe.not_cut_by_the_suite`), and a bound on what an answer
    holds (its bytes, its events) stays the deployment's fail."""
    from pytest_rlrollout.remote.limits import LimitExceeded
    from pytest_rlrollout.suite.observe import TIME_BOUNDS

    if not isinstance(e, LimitExceeded) or not e.silent or not e.bound.startswith(TIME_BOUNDS):
        return None
    return (
        f"{e}: no answer within the suite's own bound, which no clause sets (slow is not wrong; raise "
        "rl_exchange_timeout or rl_test_timeout)"
    )


def _assertion(call: pytest.CallInfo) -> str:
    """What a failed test said: its own message (else pytest's explanation of the assert), or
    the exception's one line."""
    if call.excinfo is None:
        return ""
    e = call.excinfo.value
    text = (str(e) if isinstance(e, AssertionError | pytest.fail.Exception) else call.excinfo.exconly()).strip()
    if not text.startswith("assert "):  # the test's own message says it; pytest's explanation repeats it
        text = text.split("\nassert ", 1)[0]
    return text[:ASSERTION]


@pytest.fixture(scope="session")
def rl_config(pytestconfig: pytest.Config) -> RLConfig:
    """This run's settings: its options and ini keys, read and checked once. The deployment and
    every fixture of the suite take theirs from here; override it in a conftest.py to change
    them for the tests below it, e.g. `return dataclasses.replace(rl_config, numerics=...)`."""
    return options(pytestconfig)


@pytest.fixture
def rl_observe(request: pytest.FixtureRequest) -> Observed:
    """`rl_observe(n, what)` records that the test judged `n` of `what`; a clause test passes
    only on something observed (otherwise it is `inconclusive`). `rl_observe.timeline` holds a
    swap test's timeline for the report's picture."""
    return observed(request.node)


def pytest_report_header(config: pytest.Config) -> list[str]:
    o = options(config)
    if o.snapshot is not None:
        return [f"rlrollout: snapshot {o.snapshot} (base: {o.base_snapshot or 'none'})"]
    if o.mode == "local":
        return []
    lines = [f"rlrollout: {o.mode} deployment {o.deployment or o.base_url}"]
    found = config.stash.get(DISCOVERED, None)
    if found is None and o.replay_meta and "discovery" in o.replay_meta:
        from pytest_rlrollout.remote.discovery import Discovery

        found = Discovery.from_dict(o.replay_meta["discovery"])
    if found is not None:
        lines.append(f"rlrollout: engine {found.engine} ({found.decided}); capabilities:")
        lines += [f"  {name:18} {has:3}  {seen}" for name, has, seen in found.table()]
    return lines
