"""The deployment under test and its fixtures: `rl_deployment`, `rl_snapshot_factory`,
`rl_swap`, `rl_session`, and the lock that keeps read-only tests out of swaps.

Local runs (the default) start the reference deployment, one per xdist worker. Live runs talk
to `--rl-deployment` at `--rl-base-url`; they change nothing without `--rl-allow-hot-load`,
record what was served at the start, and remove every snapshot they uploaded at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_rlrollout.client import busy
from pytest_rlrollout.report import inconclusive, unsupported

DEFAULT_BASE_URL = "https://api.fireworks.ai"
# The local deployment's pace: streams last long enough, and swaps pause long enough, for the
# swap clauses to be observed (a real deployment is slower than the tiny model on its own).
LOCAL_PROFILE = {"token_delay": 0.003, "swap_delay": 0.1, "load_delay": 0.03}


class HotLoadNotAllowed(Exception):
    """A state change was attempted on a live deployment without --rl-allow-hot-load."""


def option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    if value is None and name in ("rl_deployment", "rl_base_url", "rl_model"):
        return config.getini(name)
    return value


def run_dir(config: pytest.Config) -> Path:
    """A directory shared by the controller and every xdist worker of this run."""
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return base.parent if hasattr(config, "workerinput") else base


class RLDeployment:
    """The deployment under test: a DeploymentClient plus what the suite knows about it."""

    def __init__(self, client: Any, *, allow_hot_load: bool, base_snapshot: Path | None = None,
                 bucket: Any = None, transition: str | None = None, swap_timeout: float | None = None):  # fmt: skip
        self.client, self.allow_hot_load = client, allow_hot_load
        self.base_snapshot, self.bucket_store = base_snapshot, bucket
        self._transition, self._swap_timeout = transition, swap_timeout
        self._long_stream: int | None = None
        self._capabilities: dict[str, Any] | None = None
        self.starting: list[dict[str, Any]] = []

    @property
    def target(self) -> Any:
        return self.client.target

    @property
    def mode(self) -> str:
        return self.target.mode

    @property
    def key(self) -> str:
        """Names the deployment for the lock and the run's shared record (same URL + name = same)."""
        return f"{self.target.base_url}|{self.target.deployment}"

    @property
    def bucket(self) -> Path | None:
        """The bucket's directory when it is on this machine."""
        return self.bucket_store.local_path if self.bucket_store is not None else None

    # ----------------------------------------------------------------------- state changes (guarded)

    def hot_load(self, body: Any, **kw: Any) -> Any:
        """POST a signal; a 409 (a load still in progress: one load at a time) is retried until
        the deadline, as a trainer's client would."""
        self._check_allowed("hot-load")
        deadline = time.monotonic() + self.swap_timeout
        while True:
            r = self.client.hot_load(body, **kw)
            if r.status_code != 409 or time.monotonic() > deadline or "ledger" in r.text:
                return r
            time.sleep(0.02)

    def hint(self, identity: str, file: str) -> Any:
        self._check_allowed("hot-load hint")
        return self.client.hint(identity, file)

    def reset_ledger(self) -> Any:
        self._check_allowed("ledger reset")
        return self.client.reset_ledger()

    def _check_allowed(self, what: str) -> None:
        if not self.allow_hot_load:
            raise HotLoadNotAllowed(
                f"refusing a {what} on {self.target.deployment}: pass --rl-allow-hot-load to allow state changes"
            )

    # ----------------------------------------------------------------------- what it is

    @property
    def base_config(self) -> dict[str, Any] | None:
        """config.json of the served base model, when a local copy is known (--rl-base-snapshot)."""
        if self.base_snapshot is None or not (self.base_snapshot / "config.json").is_file():
            return None
        return json.loads((self.base_snapshot / "config.json").read_text())

    @property
    def capabilities(self) -> dict[str, Any]:
        """Discovered once, without changing state: moe, nonstream_version, replicas, lora,
        ledger, backend_host, transition."""
        if self._capabilities is None:
            caps = self.client.capabilities()
            declared = (self.client.resource().get("hotLoadTransitionType") or "").upper() or None
            caps["transition"] = self._transition or declared
            self._capabilities = caps
        return self._capabilities

    def replicas(self) -> list[dict[str, Any]]:
        r = self.client.status()
        body = r.json() if r.status_code == 200 else {}
        return body.get("replicas") if isinstance(body.get("replicas"), list) else []

    def serving(self) -> str | None:
        """The snapshot identity every replica serves, or None when they differ."""
        ids = {r.get("current_snapshot_identity") for r in self.replicas()}
        return ids.pop() if len(ids) == 1 else None

    @property
    def recorded_mode(self) -> str:
        """`local` or `live`: where the exchanges came from (in replay, where they were recorded)."""
        if self.mode == "replay":
            return self.client.transport.session.meta.get("recorded_mode", "live")
        return self.mode

    @property
    def long_stream_tokens(self) -> int:
        """Tokens a stream must last for a swap to land inside it (--rl-long-stream-tokens)."""
        return self._long_stream or (64 if self.recorded_mode == "local" else 256)

    @property
    def swap_timeout(self) -> float:
        """How long a swap may take (--rl-swap-timeout; the reference deployment swaps in ms)."""
        return self._swap_timeout or (900.0 if self.mode == "live" else 5.0)

    def wait_for(self, identity: str, lora: bool = False) -> Any:
        """client.wait with this deployment's timeouts (a stalled rollout fails early)."""
        local = self.mode != "live"
        return self.client.wait(identity, timeout=self.swap_timeout, poll=0.01 if local else 0.5, lora=lora,
                                stalled_after=1.0 if local else 120.0)  # fmt: skip

    def settle(self, timeout: float | None = None) -> bool:
        """Poll until no replica is loading or swapping; False at the deadline."""
        deadline = time.monotonic() + (timeout or self.swap_timeout)
        while time.monotonic() < deadline:
            replicas = self.replicas()
            if not replicas:
                return False  # nothing to observe (see HL-GET-1)
            if all(r.get("readiness") and not busy(r) for r in replicas):
                return True
            time.sleep(0.02)
        return False

    @property
    def cassettes(self) -> Any:
        """The recording or replaying transport, or None."""
        from pytest_rlrollout.cassette import CassetteTransport

        t = self.client.transport
        return t if isinstance(t, CassetteTransport) else None

    def __getattr__(self, name: str) -> Any:  # status, wait, ledger, complete, mark, ...
        return getattr(self.client, name)


# --------------------------------------------------------------------------- swaps


@dataclass
class SwapResult:
    built: Any
    response: Any  # the POST response
    waited: Any  # client.Waited, or None when the POST was refused


class Swapper:
    """`rl_swap`: build the next snapshot and swap the deployment to it."""

    def __init__(self, deployment: RLDeployment, factory: Any):
        self.deployment, self.factory = deployment, factory

    def signal(self, built: Any, **extra: Any) -> SwapResult:
        """Signal `built` (with extra body fields) and wait until it is served or fails."""
        return self.follow(built, self.post(built, **extra))

    def post(self, built: Any, **extra: Any) -> Any:
        """Only the POST: tests that act between the signal and the rollout call `follow` after."""
        return self.deployment.hot_load({**built.signal, **extra})

    def follow(self, built: Any, response: Any) -> SwapResult:
        """Wait until the signalled snapshot is served everywhere or fails, and leave the
        deployment at rest either way."""
        if response.status_code != 200:
            self.deployment.settle()
            return SwapResult(built, response, None)
        waited = self.deployment.wait_for(built.identity, lora=built.kind == "lora")
        if waited.ok and built.kind == "full":
            self.factory.loaded_full()
        if not waited.ok:
            self.deployment.settle()
        return SwapResult(built, response, waited)

    def build(self, label: str = "step", change: dict[str, Any] | None = None) -> Any:
        return self.factory.step(self.deployment.serving(), label, change)

    def __call__(self, label: str = "step", change: dict[str, Any] | None = None, **extra: Any) -> SwapResult:
        """Swap to a new snapshot (a sentinel delta when possible); a swap that fails here is a
        precondition of the calling test, so the test is inconclusive, not failed."""
        result = self.signal(self.build(label, change), **extra)
        if result.waited is None or not result.waited.ok:
            why = result.response.text[:300] if result.waited is None else result.waited.error
            inconclusive(f"the swap to {result.built.identity} did not complete ({why}); see HL-POST-1/HL-GET-2")
        return result


# --------------------------------------------------------------------------- fixtures


def _local_deployment(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RLDeployment]:
    from pytest_rlrollout import refmodel
    from pytest_rlrollout.bucket import Bucket
    from pytest_rlrollout.client import DeploymentClient, Target
    from pytest_rlrollout.deployment import reference_deployment

    bucket = tmp_path_factory.mktemp("rl-bucket")
    transition = (config.getoption("rl_transition") or "ASYNC").upper()
    faults = frozenset(config.getoption("rl_local_fault"))
    with reference_deployment(bucket, faults=faults, transition=transition, **LOCAL_PROFILE) as dep:
        target = Target(dep.name, dep.base_url, dep.model, dep.api_key, mode="local")
        with DeploymentClient(target, transport=_cassette_transport(config, dep.api_key)) as client:
            yield RLDeployment(client, allow_hot_load=True, base_snapshot=bucket / refmodel.BASE_IDENTITY,
                               bucket=Bucket(bucket), transition=transition,
                               swap_timeout=config.getoption("rl_swap_timeout"))  # fmt: skip


def _live_deployment(config: pytest.Config, name: str) -> Iterator[RLDeployment]:
    from pytest_rlrollout.bucket import Bucket
    from pytest_rlrollout.client import DeploymentClient, Target

    model = option(config, "rl_model")
    if not model:
        raise pytest.UsageError(f"--rl-deployment {name}: also pass --rl-model (the model it serves)")
    key = config.getoption("rl_api_key") or os.environ.get("FIREWORKS_API_KEY")
    if not key:
        raise pytest.UsageError(f"--rl-deployment {name}: pass --rl-api-key or set FIREWORKS_API_KEY")
    try:
        target = Target(name, option(config, "rl_base_url") or DEFAULT_BASE_URL, model, key,
                        inference_url=config.getoption("rl_inference_url") or "", mode="live")  # fmt: skip
    except ValueError as e:
        raise pytest.UsageError(f"--rl-deployment: {e}") from None
    base = config.getoption("rl_base")
    bucket_url = config.getoption("rl_bucket_url")
    try:
        bucket = Bucket(bucket_url) if bucket_url else None
    except ValueError as e:
        raise pytest.UsageError(f"--rl-bucket-url: {e}") from None
    transition = (config.getoption("rl_transition") or "").upper() or None
    with DeploymentClient(target, transport=_cassette_transport(config, key)) as client:
        yield RLDeployment(client, allow_hot_load=config.getoption("rl_allow_hot_load"),
                           base_snapshot=Path(base) if base else None, bucket=bucket, transition=transition,
                           swap_timeout=config.getoption("rl_swap_timeout"))  # fmt: skip


@pytest.fixture(scope="session")
def rl_deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The deployment under test (`--rl-deployment`); the reference deployment by default;
    recorded with `--rl-record DIR`, or replayed offline with `--rl-replay DIR`."""
    config = request.config
    name = option(config, "rl_deployment") or "local"
    replay = config.getoption("rl_replay")
    if replay:
        gen = _replay_deployment(config, tmp_path_factory, cassette_dir(replay))
    elif name == "local":
        gen = _local_deployment(config, tmp_path_factory)
    else:
        gen = _live_deployment(config, name)
    with _closing(gen) as dep:
        dep._long_stream = config.getoption("rl_long_stream_tokens")
        dep.starting = dep.replicas()
        dep.capabilities  # discovered now, so recordings hold it in the session cassette  # noqa: B018
        _record_state(config, "start", dep)
        yield dep
        _record_state(config, f"end-{os.getpid()}", dep)
        cassettes = dep.cassettes
        if cassettes is not None and cassettes.mode == "record":
            session = cassettes.session
            session.meta.update(deployment=dep.target.deployment, model=dep.target.model, recorded_mode=dep.mode,
                                transition=dep.capabilities["transition"], run_id=_run_id(config))  # fmt: skip
            session.write(dep.target.api_key)


def _cassette_transport(config: pytest.Config, key: str):
    """A recording transport when --rl-record is given, else None."""
    directory = config.getoption("rl_record")
    if not directory:
        return None
    from pytest_rlrollout.cassette import Cassette, CassetteTransport

    session = Cassette(Path(directory) / "_session.json")
    return CassetteTransport("record", key, Path(directory), session, record_mode=config.getoption("rl_record_mode"))


def cassette_dir(value: str) -> Path:
    """A cassette directory, or the name of one shipped with the package (`reference`)."""
    path = Path(value)
    if path.is_dir():
        return path
    from pytest_rlrollout.catalogue import data_dir

    try:
        shipped = data_dir("cassettes") / value
    except FileNotFoundError:
        shipped = path
    if not shipped.is_dir():
        raise pytest.UsageError(f"--rl-replay {value}: no such directory (and no shipped cassettes of that name)")
    return shipped


def _replay_deployment(config: pytest.Config, tmp_path_factory, directory: Path) -> Iterator[RLDeployment]:
    from pytest_rlrollout import refmodel
    from pytest_rlrollout.bucket import Bucket
    from pytest_rlrollout.cassette import Cassette, CassetteTransport
    from pytest_rlrollout.client import DeploymentClient, Target

    session_file = directory / "_session.json"
    if not session_file.is_file():
        raise pytest.UsageError(f"--rl-replay {directory}: no _session.json (record with --rl-record first)")
    session = Cassette.load(session_file)
    meta = session.meta
    transport = CassetteTransport("replay", "replay-key", directory, session)
    # snapshots are still built (their signals must match the recording), into a bucket nobody reads
    bucket = tmp_path_factory.mktemp("rl-replay-bucket")
    base = config.getoption("rl_base")
    base_snapshot = Path(base) if base else refmodel.make_base(bucket / refmodel.BASE_IDENTITY)
    target = Target(meta["deployment"], "http://replay.invalid", meta["model"], "replay-key", mode="replay")
    with DeploymentClient(target, transport=transport) as client:
        yield RLDeployment(client, allow_hot_load=True, base_snapshot=base_snapshot, bucket=Bucket(bucket),
                           transition=meta.get("transition"), swap_timeout=config.getoption("rl_swap_timeout"))  # fmt: skip


class _closing:
    def __init__(self, gen: Iterator[RLDeployment]):
        self.gen = gen

    def __enter__(self) -> RLDeployment:
        return next(self.gen)

    def __exit__(self, *exc: object) -> None:
        for _ in self.gen:
            pass


def _record_state(config: pytest.Config, name: str, dep: RLDeployment) -> None:
    """Start / end status for the report's restore instructions (the first start wins)."""
    if dep.mode != "live":
        return
    path = run_dir(config) / "rl-state" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"replicas": dep.replicas(), "at": time.time()}
    try:
        with open(path, "x") as f:
            json.dump(doc, f)
    except FileExistsError:
        pass


@pytest.fixture(scope="session")
def rl_snapshot_factory(request: pytest.FixtureRequest, rl_deployment: RLDeployment, tmp_path_factory):
    """Builds and uploads the snapshots swap tests signal (sentinel deltas, full snapshots,
    LoRA adapters, broken variants); removes what it uploaded at the end of the session."""
    from pytest_rlrollout.snapshot_factory import SnapshotFactory

    if rl_deployment.base_snapshot is None or rl_deployment.bucket_store is None:
        inconclusive("swaps need --rl-bucket-url (where the deployment reads snapshots) and --rl-base-snapshot")
    config = request.config
    run_id = _run_id(config)
    if rl_deployment.mode == "replay":
        run_id = rl_deployment.cassettes.session.meta["run_id"]
    workdir = tmp_path_factory.mktemp("rl-snapshots")
    record = run_dir(config) / f"rl-record-{hashlib.sha256(rl_deployment.key.encode()).hexdigest()[:12]}.json"
    made = SnapshotFactory(rl_deployment.base_snapshot, rl_deployment.bucket_store, workdir, run_id, record,
                           model=rl_deployment.target.model)  # fmt: skip
    yield made
    removed = made.cleanup()
    if rl_deployment.mode == "live":
        path = run_dir(config) / "rl-state" / f"removed-{os.getpid()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(removed))


def _run_id(config: pytest.Config) -> str:
    """Unique per run; when adding to existing cassettes (--rl-record-mode=once), theirs, so that
    old and new cassettes name the same snapshots alike."""
    record = config.getoption("rl_record")
    session = Path(record) / "_session.json" if record else None
    if session is not None and config.getoption("rl_record_mode") == "once" and session.is_file():
        return json.loads(session.read_text())["meta"]["run_id"]
    return ((getattr(config, "workerinput", {}) or {}).get("testrunuid") or _controller_run_id(config))[:8]


def _controller_run_id(config: pytest.Config) -> str:
    marker = run_dir(config) / "rl-run-id"
    if not marker.exists():
        marker.write_text(uuid.uuid4().hex)
    return marker.read_text()


@pytest.fixture
def rl_swap(rl_deployment: RLDeployment, rl_snapshot_factory) -> Swapper:
    """`rl_swap(label, change, **signal_fields)` swaps to a new snapshot and waits for it;
    `rl_swap.build()` / `rl_swap.signal(built)` split the two steps."""
    return Swapper(rl_deployment, rl_snapshot_factory)


@pytest.fixture(autouse=True)
def _rl_deployment_lock(request: pytest.FixtureRequest):
    """Exclusive for `rl_swaps` tests, shared for every other test of the deployment."""
    if "rl_deployment" not in request.fixturenames:
        yield
        return
    dep: RLDeployment = request.getfixturevalue("rl_deployment")
    swaps = request.node.get_closest_marker("rl_swaps") is not None
    if swaps and not dep.allow_hot_load:
        inconclusive("this test changes the deployment's state; pass --rl-allow-hot-load to run it")
    for mark in request.node.iter_markers("rl_requires"):
        for capability in mark.args:
            _require(dep, capability)
    factory = request.getfixturevalue("rl_snapshot_factory") if "rl_snapshot_factory" in request.fixturenames else None
    if factory is not None:
        from pytest_rlrollout.cassette import portable_id

        factory.for_test(portable_id(request.node.nodeid))
    from pytest_rlrollout.locking import DeploymentLock

    lock = DeploymentLock(dep.key)
    with lock.exclusive() if swaps else lock.shared(), _cassette_for(dep, request.node.nodeid, factory):
        yield
        if swaps:  # the next test starts from a deployment at rest
            dep.settle()


@contextlib.contextmanager
def _cassette_for(dep: RLDeployment, nodeid: str, factory: Any) -> Iterator[None]:
    """Record into, or replay from, this test's cassette; the factory's knowledge at the start
    of the test travels with it so replayed swaps build the same snapshots."""
    t = dep.cassettes
    if t is None:
        yield
        return
    from pytest_rlrollout.cassette import Cassette, cassette_name

    path = t.directory / cassette_name(nodeid)
    if t.mode == "replay":
        if not path.is_file():
            inconclusive(f"no cassette for this test in {t.directory} (record it with --rl-record)")
        cassette = Cassette.load(path)
        if factory is not None and "factory" in cassette.meta:
            factory.restore(cassette.meta["factory"])
    else:
        cassette = Cassette(path)
        if factory is not None:
            cassette.meta["factory"] = factory.state()
    keep = t.mode == "record" and not (t.record_mode == "once" and path.is_file())
    t.use(cassette)
    try:
        yield
    finally:
        t.use(t.session)
        if keep:
            cassette.meta["test"] = nodeid
            cassette.write(dep.target.api_key)


def _require(dep: RLDeployment, capability: str) -> None:
    """rl_requires: `moe`, `lora`, `ledger`, `nonstream_version`, `backend_host`, `transition:ASYNC`."""
    from pytest_rlrollout.report import not_applicable

    caps = dep.capabilities
    if capability.startswith("transition:"):
        wanted = capability.split(":", 1)[1]
        if caps["transition"] is None:
            inconclusive("the transition type is unknown: the deployment resource does not say; pass --rl-transition")
        if caps["transition"] != wanted:
            not_applicable(f"the deployment uses {caps['transition']} transitions, this clause is about {wanted}")
        return
    if capability not in caps:
        raise pytest.UsageError(f"rl_requires: unknown capability {capability!r}")
    if not caps[capability]:
        unsupported(f"the deployment does not offer {capability}")


@dataclass
class RLSession:
    """One multi-turn session: every request carries its `x-multi-turn-session-id`."""

    deployment: RLDeployment
    session_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"x-multi-turn-session-id": self.session_id}

    def complete(self, body: dict[str, Any], *, chat: bool = False, headers: dict[str, str] | None = None) -> Any:
        """A parsed Stream (policy versions, routing entries, cached tokens from every channel)."""
        return self.deployment.complete(body, chat=chat, headers=self.headers | (headers or {}))

    def openai(self) -> Any:
        """An `openai.OpenAI` client for the inference API with this session's header."""
        import openai

        t = self.deployment.target
        return openai.OpenAI(base_url=t.inference_url.rstrip("/") + "/v1", api_key=t.api_key,
                             default_headers=self.headers)  # fmt: skip

    def http(self) -> Any:
        """An httpx client for the inference API with auth and this session's header."""
        import httpx

        t = self.deployment.target
        return httpx.Client(base_url=t.inference_url, headers=self.deployment.auth_headers() | self.headers, timeout=60)


@pytest.fixture
def rl_session(rl_deployment: RLDeployment, request: pytest.FixtureRequest) -> RLSession:
    """A fresh session on the deployment under test, named after the test."""
    return RLSession(rl_deployment, f"{request.node.name}-{uuid.uuid4().hex[:8]}")
