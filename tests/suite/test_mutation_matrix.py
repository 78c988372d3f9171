"""The mutation matrix: every fault switch of the reference deployment makes the conformance tests
of its clause fail (and no clause the contract does not tie to it); with no fault, every clause
passes, in both transition modes.

Each row runs the installed suite in this process (pytester, no interpreter start-up) with
`-o rl_local_faults=<switch>` and reads its clause report. A row runs its clause's tests and every
test whose requests read its switch (the reference deployment records which switches it is asked
about): a test that never asks meets nothing the switch changes, and passed in the no-fault run of
the same modules its rows share. The broken snapshot variants' rows come from
tests/snapshot/test_validator.py, which proves the validator reports exactly that clause. Rows
land in `build/mutation-matrix/`; the session's end assembles `build/mutation-matrix.{json,md}`.
"""

from __future__ import annotations

import fcntl
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

# Imported here, before any in-process run: pytester forgets what a run imported, and numpy and
# the server stack must not be imported afresh for every row.
import pytest_rlrollout.reference.app
import pytest_rlrollout.runs.snapshots  # noqa: F401
from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.reference import faults
from pytest_rlrollout.reference.faults import FAULTS, clause_of, switches_for
from pytest_rlrollout.snapshot import broken
from pytest_rlrollout.suite.options import CONFORMANCE

from ..support import write_row

AREA_MODULE = {
    "HL": "test_hot_load.py",
    "SNAP": "test_hot_load.py",
    "SWAP": "test_swap.py",
    "CACHE": "test_cache.py",
    "SESS": "test_session.py",
    "VER": "test_version.py",
    "R3": "test_r3.py",
    "INF": "test_inference.py",
    "FID": "test_fidelity.py",
    "NUM": "test_numerics.py",
    "CTL": "test_control.py",
}
SNAP_MUST = {c.id for c in catalogue().area("SNAP") if c.level == "MUST"}
# Faults whose violation also breaks other clauses by the contract's own logic.
COLLATERAL = {
    # 'new_session' keeping entries for everyone keeps them for requests without a session too
    "CACHE-MATRIX-NS-NEW": {"CACHE-NOSESSION-1"},
    # cutting every in-flight stream at a swap cuts it under every reset_prompt_cache value too
    "SWAP-ASYNC-1": {"SWAP-KV-1"},
    # requests admitted after a swap are served by the old weights: a stream among them keeps
    # the old identity after the next swap
    "SWAP-NEW-1": {"SWAP-ASYNC-2"},
    # a chunk naming a snapshot unloaded before it was generated breaks both clauses
    "SWAP-ASYNC-2": {"VER-STREAM-1"},
    "SWAP-ASYNC-2:stale": {"VER-STREAM-1"},
    # serving unvalidated snapshots serves the violating variant of every SNAP rule, config
    # mismatches and incremental snapshots after a ledger reset included, and refuses none at POST
    "HL-POST-5": SNAP_MUST | {"HL-CONFIG-1", "HL-LEDGER-1", "HL-POST-5a"},
    # validation after the 200 serves nothing broken, but refuses nothing at POST time either
    "HL-POST-5a": SNAP_MUST | {"SNAP-ID-1"},
    # a replica that keeps the old weights under the new label serves other weights than its
    # peers under one label: the same weights no longer fingerprint alike on every replica
    "FID-SWAP-1:one": {"FID-SAME-1"},
}
# Faults the issue requires to fail more than their own clause.
ALSO_FAILS = {"SWAP-ASYNC-2:stale": {"VER-STREAM-1"}}
# Modules beyond the area's that a fault's row runs (to see ALSO_FAILS).
MORE_MODULES = {"SWAP-ASYNC-2:stale": ["test_version.py"]}
JUDGED = {"pass", "not-applicable"}
# The clauses judged on routing matrices (vLLM: routed_experts, behind a server flag).
ROUTING = {c.id for c in catalogue().area("R3")} | {"NUM-ROUTE-1"}


@pytest.fixture(autouse=True)
def _shared_reference_cases(reference, monkeypatch):
    """Every row's run judges the same reference snapshots: build them once per worker."""
    from pytest_rlrollout.snapshot import cases

    monkeypatch.setattr(cases, "ReferenceCases", lambda root: reference)


@pytest.fixture(autouse=True)
def _no_pictures(monkeypatch):
    """The rows read their report's verdicts, never its NUM pictures (tests/numerics and the HTML
    report's tests judge those): drawing them with matplotlib cost the rows 14 s of CPU."""
    from pytest_rlrollout.suite.report import files

    monkeypatch.setattr(files, "draw", lambda report: ({}, "not drawn in the mutation matrix"))


def fault_args(switch: str) -> list[str]:
    """The inner run's arguments that start the reference deployment with `switch` on: the one
    place that spells the option."""
    return ["-o", f"rl_local_faults={switch}"]


def run_suite_report(pytester: pytest.Pytester, *args: str, plugins: tuple = ()) -> tuple[dict[str, str], dict]:
    """The installed suite, in this process: clause → outcome, and the whole report."""
    # --tb=native: a failure's text (the report's reason) without pytest re-parsing the module's
    # source for every frame, which the rows' failing tests paid for each row
    result = pytester.runpytest_inprocess(
        *args, "-p", "no:randomly", "-p", "no:cacheprovider", "--tb=native", "--rl-report=r.json", plugins=list(plugins)
    )
    report = pytester.path / "r.json"
    assert report.is_file(), "\n".join(result.outlines[-30:])
    doc = json.loads(report.read_text())
    return outcomes(doc), doc


def outcomes(doc: dict) -> dict[str, str]:
    """A report's clause → outcome."""
    return {k: v["outcome"] for k, v in doc["clauses"].items()}


def run_suite(pytester: pytest.Pytester, *args: str) -> dict[str, str]:
    return run_suite_report(pytester, *args)[0]


def group(engine: str, *, sync: bool = False, routed_experts: bool = False, one_replica: bool = False) -> str:
    """The name of a deployment set-up: the rows that start the deployment alike, and the
    no-fault test that starts it so (what each test read in that run decides what each row runs)."""
    return f"mm-{engine}-{sync:d}{routed_experts:d}{one_replica:d}"


# The no-fault run of each set-up that has a no-fault test. It is made once per pytest run by the
# first test that needs it, that test or a row, on whichever worker (`NoFaultRuns`): the rows carry
# no xdist group, so xdist spreads them over both workers.
ROUTING_MODULES = [str(CONFORMANCE / "test_r3.py"), str(CONFORMANCE / "test_numerics.py")]
NO_FAULT_ARGS = {
    group("fireworks"): [str(CONFORMANCE), "-o", "rl_transition=ASYNC"],
    group("fireworks", sync=True): [str(CONFORMANCE), "-o", "rl_transition=SYNC"],
    group("vllm"): [str(CONFORMANCE), "--rl-engine=vllm"],
    group("vllm", routed_experts=True): [*ROUTING_MODULES, "--rl-engine=vllm"],
    group("sglang"): [str(CONFORMANCE), "--rl-engine=sglang"],
    group("sglang", routed_experts=True): [*ROUTING_MODULES, "--rl-engine=sglang"],
    group("coreweave"): [str(CONFORMANCE), "--rl-engine=coreweave"],
    group("coreweave", one_replica=True): [str(CONFORMANCE / "test_cache.py"), "--rl-engine=coreweave"],
}


@pytest.mark.slow
@pytest.mark.parametrize("transition", ["ASYNC", "SYNC"])
def test_no_fault_every_clause_passes(no_faults, transition):
    got, _, _ = no_faults.of(group("fireworks", sync=transition == "SYNC"))
    assert {k: v for k, v in got.items() if v not in JUDGED} == {}
    assert {c.id for c in catalogue()} <= set(got)


@pytest.mark.slow
def test_no_fault_every_clause_passes_through_the_vllm_driver(no_faults):
    """The reference deployment's vLLM dialect through the vLLM driver: every clause vLLM binds
    passes, but the ones whose binding needs what the dialect does not offer (routing matrices,
    as vLLM's CPU build; an API key nobody set), which say so."""
    got, doc, _ = no_faults.of(group("vllm"))
    assert doc["engine"]["name"] == "vllm"
    vllm = {c.id for c in catalogue() if c.binds("vllm")}
    unjudged = {k: v for k, v in got.items() if k in vllm and v != "pass"}
    assert unjudged == dict.fromkeys(ROUTING & vllm, "unsupported"), unjudged  # no routed_experts, as on CPU
    # the SNAP self-checks of the suite's own snapshots ask no deployment: they pass on either wire
    deployed = {c.id for c in catalogue()} - {c.id for c in catalogue().area("SNAP")}
    assert {k for k in deployed - vllm if got.get(k) != "not-applicable"} == set(), got


@pytest.mark.slow
def test_no_fault_every_clause_passes_through_the_sglang_driver(no_faults):
    """The reference deployment's SGLang dialect through the SGLang driver: every clause SGLang
    binds passes, but the routing ones, which say the server flag they need; every other clause
    of a deployment is not-applicable."""
    got, doc, _ = no_faults.of(group("sglang"))
    assert doc["engine"]["name"] == "sglang"
    bound = {c.id for c in catalogue() if c.binds("sglang")}
    assert {k: v for k, v in got.items() if k in bound and v != "pass"} == dict.fromkeys(ROUTING & bound, "unsupported")
    deployed = {c.id for c in catalogue()} - {c.id for c in catalogue().area("SNAP")}
    assert {k: got.get(k) for k in deployed - bound if got.get(k) != "not-applicable"} == {}


@pytest.mark.slow
def test_no_fault_routing_passes_through_the_sglang_driver(no_faults, routed_experts):
    """With --enable-return-routed-experts, every routing clause SGLang binds passes through its driver."""
    got, _, _ = no_faults.of(group("sglang", routed_experts=True))
    bound = {c.id for c in catalogue() if c.binds("sglang") and c.id in ROUTING}
    assert {k: got.get(k) for k in bound if got.get(k) != "pass"} == {}


# The reset-matrix cells judged on a new session: it must land on the replica holding the prefix.
ACROSS_REPLICAS = {"CACHE-MATRIX-ALL-NEW", "CACHE-MATRIX-NONE-NEW"}


@pytest.mark.slow
def test_no_fault_every_clause_passes_through_the_coreweave_driver(no_faults):
    """The reference deployment's CoreWeave dialect through the CoreWeave driver: every clause
    CoreWeave binds passes; every other clause of a deployment is not-applicable."""
    got, doc, _ = no_faults.of(group("coreweave"))
    assert doc["engine"]["name"] == "coreweave"
    bound = {c.id for c in catalogue() if c.binds("coreweave")}
    unjudged = {k: got.get(k) for k in bound if got.get(k) != "pass"}
    # the gateway names no replica: on two replicas a new session's landing cannot be known
    assert unjudged == dict.fromkeys(ACROSS_REPLICAS, "inconclusive"), unjudged
    for cid in ACROSS_REPLICAS:
        assert "no fireworks-backend-host header" in doc["clauses"][cid]["tests"][0]["reason"]
    deployed = {c.id for c in catalogue()} - {c.id for c in catalogue().area("SNAP")}
    assert {k: got.get(k) for k in deployed - bound if got.get(k) != "not-applicable"} == {}


@pytest.mark.slow
def test_no_fault_the_new_session_cells_pass_on_one_coreweave_replica(no_faults, one_replica):
    """On one replica every session lands where the prefix is cached: the cells a header-less
    gateway leaves inconclusive on several replicas are judged, and pass."""
    got, _, _ = no_faults.of(group("coreweave", one_replica=True))
    bound = {c.id for c in catalogue().area("CACHE") if c.binds("coreweave")}
    assert bound >= ACROSS_REPLICAS
    assert {k: got.get(k) for k in bound if got.get(k) != "pass"} == {}


@pytest.mark.slow
def test_no_fault_routing_passes_through_the_vllm_driver(no_faults, routed_experts):
    """With routed_experts on (as a GPU server's --enable-return-routed-experts), every routing
    clause vLLM binds passes through the vLLM driver."""
    got, _, _ = no_faults.of(group("vllm", routed_experts=True))
    bound = {c.id for c in catalogue() if c.binds("vllm") and c.id in ROUTING}
    assert {k: got.get(k) for k in bound if got.get(k) != "pass"} == {}


def test_every_switch_and_variant_is_in_the_matrix():
    assert {clause_of(f) for f in FAULTS} <= {c.id for c in catalogue()}  # switches name real clauses
    assert set(broken.BREAKERS) == {c.id for c in catalogue().area("SNAP")}
    switched = {clause_of(f) for f in FAULTS}
    assert {c.id for c in catalogue() if c.area != "SNAP"} <= switched, "a clause without a switch"


# Each dialect of the reference deployment runs the rows of the switches of the clauses its engine
# binds, through that engine's driver: the Fireworks wire, and vLLM's (`--rl-engine=vllm`).
# One replica of several keeping the old weights is told apart only by a header naming the replica
# that answered (Fireworks' fireworks-backend-host): CoreWeave's gateway documents none, so the
# fingerprints' session keys reach the replicas as affinity spreads them, and nothing proves they
# reached that one.
UNSEEN = {"coreweave": {"FID-SWAP-1:one"}}
# CoreWeave lists replicas per hot-load: before the first one, what is served cannot be read. The
# rows of the clauses judged on it first run a module that hot-loads.
AFTER_A_HOT_LOAD = {"HL-GET-1": "test_fidelity.py", "NUM-LOGPROB-1": "test_hot_load.py"}


@dataclass(frozen=True)
class Setup:
    """How a row's deployment is started and which conformance modules it runs."""

    engine: str
    modules: tuple[str, ...]
    sync: bool = False  # -o rl_transition=SYNC
    routed_experts: bool = False  # the fixture of that name
    one_replica: bool = False  # the fixture of that name
    # whether the row may run only the tests that read its switch: not the SNAP rows (they select
    # their clause's tests by name), nor a row whose first module runs for what it leaves behind
    scopable: bool = True

    @classmethod
    def of(cls, fault: str, engine: str) -> Setup:
        clause = clause_of(fault)
        modules = [AREA_MODULE[clause.split("-")[0]], *MORE_MODULES.get(fault, [])]
        hot_load_first = engine == "coreweave" and clause in AFTER_A_HOT_LOAD
        if hot_load_first:  # CoreWeave says what is served once one was made
            modules.insert(0, AFTER_A_HOT_LOAD[clause])
        return cls(
            engine,
            tuple(modules),
            sync=clause.startswith("SWAP-SYNC"),
            routed_experts=engine in ("vllm", "sglang") and clause in ROUTING,
            one_replica=engine == "coreweave" and clause in ACROSS_REPLICAS,
            scopable=not clause.startswith("SNAP-") and not hot_load_first,
        )

    def args(self) -> list[str]:
        sync = ["-o", "rl_transition=SYNC"] if self.sync else []
        return [*(str(CONFORMANCE / m) for m in self.modules), *sync, f"--rl-engine={self.engine}"]

    @property
    def group(self) -> str:
        """The set-up's name (`group`): its no-fault run, where it has one, says what each test reads."""
        return group(self.engine, sync=self.sync, routed_experts=self.routed_experts, one_replica=self.one_replica)

    @property
    def key(self) -> str:
        """Rows with one key start the same deployment on the same modules."""
        return f"{self.group}-{'+'.join(m.removesuffix('.py') for m in self.modules)}"


# The fast tier (CONTRIBUTING.md) keeps one row per engine: a stream's framing broken, caught
# through each driver's own wire; the slow tier runs every other row.
FAST_ROW = "INF-SSE-1"


def _row(fault: str, engine: str):
    marks = () if fault == FAST_ROW else (pytest.mark.slow,)
    return pytest.param(fault, engine, id=fault if engine == "fireworks" else f"{engine}-{fault}", marks=marks)


ROWS = [_row(f, "fireworks") for f in sorted(switches_for("fireworks"))] + [
    _row(f, engine)
    for engine in ("vllm", "sglang", "coreweave")
    for f in sorted(switches_for(engine))
    if f not in UNSEEN.get(engine, set())
]


def started_with(monkeypatch, engine: str, **settings) -> None:
    """The reference's `engine` dialect started with `settings` over its defaults."""
    import dataclasses

    from pytest_rlrollout.engines import registry

    was = registry.spec(engine)
    dialect = dataclasses.replace(was.dialect, defaults={**was.dialect.defaults, **settings})
    monkeypatch.setitem(registry.BY_NAME, engine, dataclasses.replace(was, dialect=dialect))


@pytest.fixture
def one_replica(monkeypatch):
    """The CoreWeave dialect started with one replica (its gateway names none that answered)."""
    started_with(monkeypatch, "coreweave", replicas=1)


@pytest.fixture
def routed_experts(monkeypatch):
    """The vLLM and SGLang dialects started as servers with --enable-return-routed-experts (off by
    default on both; vLLM's CPU build cannot turn it on)."""
    for engine in ("vllm", "sglang"):
        started_with(monkeypatch, engine, routed_experts=True)


# Faults whose violation, on vLLM's wire, also breaks other clauses by the contract's own logic.
VLLM_COLLATERAL = {
    **COLLATERAL,
    # serving unvalidated snapshots serves the violating variant of every rule the binding checks
    "HL-POST-5": {"SNAP-SAFETENSORS-1", "SNAP-COVER-1"},
    # a pause that does not stop generation does not hold a drained request either
    "CTL-PAUSE-1": {"CTL-PAUSE-4"},
    # vLLM's default swap ('all') resets the prefix cache: a reset that breaks streams breaks the swap too
    "SWAP-KV-1": {"SWAP-ASYNC-1"},
}


# Faults whose violation, on SGLang's wire, also breaks other clauses by the contract's own logic.
SGLANG_COLLATERAL = {
    **COLLATERAL,
    # serving unvalidated snapshots serves the violating variant of every rule the binding checks
    "HL-POST-5": {"SNAP-SAFETENSORS-1", "SNAP-COVER-1"},
    # SGLang's default swap ('all') flushes the cache: a flush that breaks streams breaks the swap too
    "SWAP-KV-1": {"SWAP-ASYNC-1"},
}


# Faults whose violation, on CoreWeave's wire, also breaks other clauses by the contract's own logic.
COREWEAVE_COLLATERAL = {**COLLATERAL}


# Switches under which a load never finishes on every replica: each wait for one lasts the whole
# swap timeout (3 s locally), so their rows wait 1 s; the reference loads the tiny snapshot in
# well under 0.3 s with both cores busy, and a swap that fails its wait is what the rows prove.
NEVER_SERVED = {"HL-GET-2": 1.0, "HL-GET-3": 1.0}


class _Reads:
    """Plugin of a no-fault run: the switches asked about while each test ran (its set-up,
    call and teardown, the deployment's threads included), and outside every test."""

    def __init__(self, by_test: dict[str, set[str]] | None = None, outside: set[str] | None = None):
        self.by_test: dict[str, set[str]] = by_test or {}
        self.outside: set[str] = outside or set()

    def to_json(self) -> dict:
        return {"by_test": {k: sorted(v) for k, v in self.by_test.items()}, "outside": sorted(self.outside)}

    @classmethod
    def from_json(cls, doc: dict) -> _Reads:
        return cls({k: set(v) for k, v in doc["by_test"].items()}, set(doc["outside"]))

    def pytest_sessionstart(self):
        faults.record_reads(self.outside)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item):
        faults.record_reads(self.by_test.setdefault(item.nodeid, set()))
        try:
            return (yield)
        finally:
            faults.record_reads(self.outside)


class _Only:
    """Plugin of a row's run: only the given tests and those of the given clauses."""

    def __init__(self, nodeids: set[str], clauses: set[str]):
        self.nodeids, self.clauses = nodeids, clauses

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        def wanted(item) -> bool:
            judged = {c for m in item.iter_markers("rl_clause") for c in m.args}
            return item.nodeid in self.nodeids or bool(judged & self.clauses)

        config.hook.pytest_deselected(items=[i for i in items if not wanted(i)])
        items[:] = [i for i in items if wanted(i)]


def only_readers(reads: _Reads | None, switch: str, clauses: set[str] = frozenset()) -> tuple:
    """The plugins that leave a run with `switch` on to the tests that read it without a fault
    and those of `clauses`; none (every test) when it is not known who reads it, or it is read
    outside any test."""
    if reads is None or switch in reads.outside:
        return ()
    return (_Only({nodeid for nodeid, names in reads.by_test.items() if switch in names}, clauses),)


def run_no_fault(pytester: pytest.Pytester, *args: str) -> tuple[dict[str, str], dict, _Reads]:
    """A no-fault run that records what each test reads."""
    reads = _Reads()
    try:
        got, doc = run_suite_report(pytester, *args, plugins=(reads,))
    finally:
        faults.record_reads(None)
    return got, doc, reads


# This process's copies of the no-fault runs: by set-up name (`NoFaultRuns.of`), and by Setup.key
# (a row's own no-fault run of its modules, for a set-up without a no-fault test).
_MADE: dict[str, tuple[dict[str, str], dict, _Reads]] = {}


class NoFaultRuns:
    """The no-fault runs the rows compare against, each made once per pytest run: the first
    worker that needs one makes it while holding a lock in a directory the workers share, and
    leaves it there; a worker that needs it meanwhile waits for it (the rows of a set-up then
    spread over every worker, and no two workers pay for one run)."""

    def __init__(self, pytester: pytest.Pytester, shared: Path):
        self.pytester, self.shared = pytester, shared

    def of(self, setup: str) -> tuple[dict[str, str], dict, _Reads]:
        """The no-fault run of a set-up (`NO_FAULT_ARGS`)."""
        return self._made(setup, NO_FAULT_ARGS[setup])

    def reads(self, setup: Setup) -> _Reads:
        """What each test of `setup`'s modules reads without a fault: from its set-up's no-fault
        run (its no-fault test judges it in full), else from a no-fault run of its modules. Either
        must fail no clause: a row's "no other clause fails" compares against it."""
        if setup.group in NO_FAULT_ARGS:
            name, args = setup.group, NO_FAULT_ARGS[setup.group]
        else:
            name, args = setup.key, setup.args()
        got, _, reads = self._made(name, args)
        assert {k: v for k, v in got.items() if v == "fail"} == {}, f"{name} fails without a fault"
        return reads

    def _made(self, name: str, args: list[str]) -> tuple[dict[str, str], dict, _Reads]:
        if name not in _MADE:
            self.shared.mkdir(parents=True, exist_ok=True)
            made = self.shared / f"{name}.json"
            with open(self.shared / f"{name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                if not made.is_file():
                    _, doc, reads = run_no_fault(self.pytester, *args)
                    (self.shared / f"{name}.part").write_text(json.dumps({"doc": doc, "reads": reads.to_json()}))
                    (self.shared / f"{name}.part").rename(made)
                kept = json.loads(made.read_text())
            _MADE[name] = (outcomes(kept["doc"]), kept["doc"], _Reads.from_json(kept["reads"]))
        return _MADE[name]


@pytest.fixture
def no_faults(pytester, tmp_path_factory, worker_id) -> NoFaultRuns:
    """The run's no-fault runs, kept where every xdist worker of this run finds them (the parent
    of the workers' temporary directories; this run's own one without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return NoFaultRuns(pytester, (base if worker_id == "master" else base.parent) / "mutation-matrix-no-fault")


@pytest.mark.parametrize(("fault", "engine"), ROWS)
def test_fault_switch_fails_its_clause(pytester, no_faults, request, fault, engine):
    """A row runs its modules with the switch on, but only the tests whose requests read that
    switch in a no-fault run (a test that never asks about it meets nothing it changes) and the
    tests of its clause: every other test passed without the fault. A switch read outside any
    test runs every test."""
    clause = clause_of(fault)
    setup = Setup.of(fault, engine)
    if setup.routed_experts:
        request.getfixturevalue("routed_experts")
    if setup.one_replica:
        request.getfixturevalue("one_replica")
    area = clause.split("-")[0]
    args, plugins = [*setup.args(), *fault_args(fault)], ()
    if clause in NEVER_SERVED:
        args += ["-o", f"rl_swap_timeout={NEVER_SERVED[clause]}"]
    if area == "SNAP":  # the deployment stops enforcing one SNAP rule at hot-load time
        args += ["-k", f"{clause} or nested"]
    elif setup.scopable:
        plugins = only_readers(no_faults.reads(setup), fault, {clause, *ALSO_FAILS.get(fault, ())})
    got, doc = run_suite_report(pytester, *args, plugins=plugins)
    write_row(fault if engine == "fireworks" else f"{fault} ({engine})", "fault switch", got, clause)
    assert got.get(clause) == "fail", got
    for also in ALSO_FAILS.get(fault, set()) if engine == "fireworks" else ():  # VER-STREAM-1 is Fireworks
        assert got.get(also) == "fail", f"{fault} must also fail {also}: {got}"
    others = {k for k, v in got.items() if v == "fail"} - {clause}
    # a SNAP rule not enforced at hot-load time serves that rule's violating variant (HL-POST-5)
    collateral = {
        "fireworks": COLLATERAL,
        "vllm": VLLM_COLLATERAL,
        "sglang": SGLANG_COLLATERAL,
        "coreweave": COREWEAVE_COLLATERAL,
    }[engine]
    allowed = collateral.get(fault, {"HL-POST-5"} if area == "SNAP" else set())
    assert others <= allowed, f"{fault} also fails {sorted(others)}"
    # a failure shows its case: the assertion's message and the exchange behind it
    for test in (t for t in doc["clauses"][clause]["tests"] if t["outcome"] == "fail"):
        assert test["reason"].strip(), f"{test['test']}: no assertion message in the report"
        assert any("answer: " in e and len(e.split("answer: ", 1)[1]) > 0 for e in test["exchanges"]), (
            f"{test['test']}: no response excerpt in the report's evidence: {test['exchanges']}"
        )


# The modules whose tests read what completions carry (HL, SESS and SNAP read no stream).
CONTENT_MODULES = [
    str(CONFORMANCE / f"test_{m}.py") for m in ("inference", "swap", "cache", "r3", "version", "fidelity", "numerics")
]


@pytest.mark.slow
def test_a_usage_only_final_chunk_is_legal(pytester, no_faults):
    """OpenAI streams may carry the usage on a chunk of its own with no choice after the
    finish_reason: every clause is judged as without it. Run on the tests that read the switch in
    the no-fault run (the others pass there)."""
    reads = no_faults.of(group("fireworks"))[2]
    got = run_suite_report(
        pytester, *CONTENT_MODULES, *fault_args("usage-only-chunk"), plugins=only_readers(reads, "usage-only-chunk")
    )[0]
    assert {k: v for k, v in got.items() if v not in JUDGED} == {}
    assert {"INF-SSE-1", "INF-USAGE-1", "SWAP-ASYNC-1"} <= set(got), got  # streams were judged with it


# What answers with nothing in them can still show: the hot-load API, snapshot rules, which
# replica answered, policy versions, SSE framing, refusals, and requests queued or refused.
WITHOUT_CONTENT = {c.id for c in catalogue() if c.area in ("HL", "SNAP", "SESS", "VER")} | {
    "SWAP-ASYNC-3",
    "SWAP-ASYNC-4",
    "SWAP-SYNC-2",
    "SWAP-NEW-1",
    "INF-SSE-1",
    "INF-ERR-1",
}


@pytest.mark.slow
def test_empty_answers_pass_no_clause_about_their_content(pytester):
    """Every answer 200 and empty (no text, logprobs, routing, usage, cached tokens): no clause
    about what answers carry passes, and every pass names what it observed."""
    got, doc = run_suite_report(pytester, *CONTENT_MODULES, *fault_args("empty-content"))
    passed = {k for k, v in got.items() if v == "pass"}
    assert passed - WITHOUT_CONTENT == set(), f"passed on empty answers: {sorted(passed - WITHOUT_CONTENT)}"
    assert {"INF-LOGPROBS-1", "INF-USAGE-1", "R3-STREAM-1", "CACHE-HIT-1"} <= {k for k, v in got.items() if v == "fail"}
    for cid in passed:
        for test in doc["clauses"][cid]["tests"]:
            assert test["outcome"] != "pass" or test["observed"], f"{test['test']} passed on no observation"
