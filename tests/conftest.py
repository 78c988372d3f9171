import contextlib
import functools
import os
import shutil
import sys
from pathlib import Path

import httpx._transports.default
import pytest

# Imported once here: an in-process pytester run restores sys.meta_path when it ends, which drops
# the import hook `six` installs, so matplotlib first imported inside such a run (a report with
# NUM pictures) could not be imported again afterwards.
with contextlib.suppress(ImportError):
    import matplotlib.backends.backend_agg
    import matplotlib.figure  # noqa: F401

from pytest_rlrollout.cli.stopping import interrupting
from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.snapshot import tiny_moe
from pytest_rlrollout.snapshot.cases import ReferenceCases

from .hostile.budget import ROWS as HOSTILE_ROWS
from .hostile.budget import assemble as assemble_hostile
from .processes import Child, ended, serving
from .support import ROWS, Client, assemble

pytest_plugins = ["pytester"]


def _one_default_tls_context() -> None:
    """Every httpx client the tests make (httpx.get, httpx.Client, the openai SDK's) builds a TLS
    context and loads the CA bundle into it, 30 ms of CPU, although every server the tests talk
    to is plain HTTP on loopback; thousands of clients spent over a minute of CPU on it. The
    default context is made once per process (per SSL_CERT_FILE and SSL_CERT_DIR, which it reads)
    here, as the deployment client already does (`remote.transport.tls_context`); any other verify or a
    client certificate still gets a context of its own."""
    transports = httpx._transports.default
    create = transports.create_ssl_context
    if getattr(create, "shared_default", False):  # a pytester run in this process loads this file again
        return

    @functools.cache
    def default(trust_env: bool, cert_file: str | None, cert_dir: str | None):
        return create(trust_env=trust_env)

    def create_ssl_context(verify=True, cert=None, trust_env=True):
        if verify is True and cert is None:
            env = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")) if trust_env else (None, None)
            return default(trust_env, *env)
        return create(verify=verify, cert=cert, trust_env=trust_env)

    create_ssl_context.shared_default = True
    transports.create_ssl_context = create_ssl_context


_one_default_tls_context()


@pytest.fixture(scope="session", autouse=True)
def _no_schemathesis_plugin():
    """The suite runs pytest inside tests (pytester) and in subprocesses; schemathesis's pytest
    plugin costs seconds per start-up and none of those runs uses it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTEST_ADDOPTS", "-p no:schemathesis")
        yield


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> ReferenceCases:
    """Valid reference snapshots of every kind; tests copy before they change anything."""
    return ReferenceCases(tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="session")
def base_snapshot(tmp_path_factory) -> Path:
    return tiny_moe.make_base(tmp_path_factory.mktemp("base") / tiny_moe.BASE_IDENTITY)


@pytest.fixture
def bucket(tmp_path, base_snapshot) -> Path:
    """A bucket holding the reference base."""
    b = tmp_path / "bucket"
    b.mkdir()
    shutil.copytree(base_snapshot, b / tiny_moe.BASE_IDENTITY)
    return b


@pytest.fixture
def start(bucket):
    """start(**settings) -> a running reference deployment on `bucket`, stopped at teardown."""
    with contextlib.ExitStack() as stack:
        yield lambda **settings: stack.enter_context(reference_deployment(bucket, **settings))


@pytest.fixture
def dep(start):
    return start()


@pytest.fixture
def client(dep):
    c = Client(dep)
    yield c
    c.http.close()


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester whose in-process runs load this project's plugin alone and keep the library
    modules a run imported. pytester forgets every module a run imported; numpy's and the server
    stack's extension modules crash when imported a second time in one process. Modules written
    into the test's directory are still forgotten, so two tests' `test_user.py` never collide."""
    from _pytest.pytester import SysModulesSnapshot

    own = str(pytester.path.parent)

    def written_here(name: str) -> bool:
        return (getattr(sys.modules.get(name), "__file__", None) or "").startswith(own)

    snapshot = lambda: SysModulesSnapshot(preserve=lambda name: not written_here(name))  # noqa: E731
    monkeypatch.setattr(pytester, "_Pytester__take_sys_modules_snapshot", snapshot)  # around each run
    monkeypatch.setattr(pytester, "_sys_modules_snapshot", snapshot())  # around the test
    inline_run = pytester.inline_run

    def with_the_plugin_only(*args, **kwargs):
        # This project's plugin, by its entry point's name, and no other installed one: a run that
        # may autoload plugins also lists every installed distribution's files to mark them for
        # assertion rewriting (0.1 s a run, 15 s of the suite's CPU), and loads plugins it never uses.
        with pytest.MonkeyPatch.context() as env:
            env.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
            return inline_run("-p", "rlrollout", *args, **kwargs)

    monkeypatch.setattr(pytester, "inline_run", with_the_plugin_only)
    return pytester


def _outermost(session: pytest.Session) -> bool:
    """The run's own session on the controller: not an xdist worker, and not a pytester run in
    this process (which loads this conftest again when its files sit under tests/)."""
    if hasattr(session.config, "workerinput"):
        return False
    first = _SESSIONS.setdefault("outer", session)
    return first is session


_SESSIONS: dict[str, pytest.Session] = {}


# Files of the longest single tests (a minute and more each: whole conformance runs against
# `rlrollout serve`, a wheel in a fresh venv, recordings, `transformers serve`): collected first.
# xdist (--dist loadgroup) hands out its groups, largest first, then single tests in collection
# order; one of these handed out last ran alone at the end while the other worker idled.
LONG_FIRST = (
    "tests/suite/test_live_runs.py",
    "tests/suite/test_replay.py",
    "tests/interop/test_transformers_serve.py",
    "tests/contract/test_static_checks.py",  # mypy: a minute with a cold cache (a fresh machine)
)


def pytest_configure(config):
    """SIGTERM and SIGHUP end a test run through its teardown, as Ctrl-C does: the servers and
    processes the tests started are stopped by their fixtures and `finally` blocks (pytest alone
    dies of SIGTERM where it stands, and leaves them running)."""
    stack = contextlib.ExitStack()
    stack.enter_context(interrupting())
    config.add_cleanup(stack.close)


# The slow tier (`-m slow`; CONTRIBUTING.md): files whose tests start real gateways, engines or
# fresh interpreters, run the whole suite again, soak, or wait out slow swaps. The mutation
# matrix marks its own rows (one per engine stays fast). The fast tier is everything else.
SLOW = (
    "tests/fleet/",
    "tests/suite/test_shared_swaps.py",
    "tests/suite/test_live_runs.py",
    "tests/suite/test_slow_swaps.py",
    "tests/suite/test_replay.py",
    "tests/runs/test_plan.py",
    "tests/runs/test_diagnose_command.py",  # a diagnosis per fault, each a session against a reference deployment
    "tests/soak/test_soak_runs.py",
    "tests/soak/test_soak_signals.py",
    "tests/test_stopping.py",
    "tests/test_cleanup.py",
    "tests/remote/test_bucket_store.py",
    "tests/interop/test_transformers_serve.py",
    "tests/hostile/test_secrets.py",
    "tests/hostile/test_client.py",  # hostile servers and inputs at scale: seconds each
    "tests/hostile/test_validator.py",
    "tests/hostile/test_reference.py",
    "tests/hostile/test_deadlines.py",
    "tests/interop/test_model_parity.py",  # torch and transformers loaded, real checkpoints
    "tests/interop/test_clients.py",
    "tests/docs/test_commands.py",  # the docs' commands: two of them are whole conformance runs
    "tests/runs/test_training_loop.py::test_the_command_the_docs_show",  # a fresh interpreter imports torch: 9 s
)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))  # stable: the rest keep their order


def pytest_sessionstart(session):
    # rows of an earlier run would mix in; but the slow tier completes the fast tier's matrices
    # (CI runs the two in turn, CONTRIBUTING.md), so it keeps their rows
    if _outermost(session) and session.config.option.markexpr != "slow":
        for rows in (ROWS, HOSTILE_ROWS):
            shutil.rmtree(rows, ignore_errors=True)


def pytest_sessionfinish(session):
    if _outermost(session):
        doc = assemble()
        if doc is not None:
            print(f"\nmutation matrix: {doc['caught']}/{doc['total']} caught -> build/mutation-matrix.md")
        hostile = assemble_hostile()
        if hostile is not None:
            print(f"hostile inputs: {hostile['inputs']} fed to {len(hostile['targets'])} targets -> build/hostile.md")


@pytest.fixture
def serve():
    """`serve(*args)`: `rlrollout serve ARGS` in a process of its own, once it serves (a
    `processes.Child`). Whatever the test does, none is left running after it."""
    children: list[Child] = []

    def start(*args: str) -> Child:
        children.append(serving(*map(str, args)))
        return children[-1]

    yield start
    for child in children:
        ended(child.proc, within=5)
