"""The deployment under test: `RLDeployment` and the `rl_deployment` fixture, and one test's
hold on it, `rl_test`: what the test requires, its cassette when recording or replaying, the
lock that keeps read-only tests out of swaps, its exchanges and its deadline.

Local runs (the default) start the reference deployment, one per xdist worker. Live runs talk
to `--rl-deployment`; they change nothing without `--rl-allow-hot-load` and record what was
served at the start. Replays answer every request from cassettes.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

import pytest

from pytest_rlrollout.engines import DEFAULT, spec
from pytest_rlrollout.suite.options import RLConfig, options
from pytest_rlrollout.suite.outcomes import inconclusive, not_applicable, unsupported
from pytest_rlrollout.suite.run_state import Cleanup, Restored, RunState, Served
from pytest_rlrollout.suite.stash import DISCOVERED, MISSING, RL_TEST, WORKER_DISCOVERY

if TYPE_CHECKING:
    import httpx

    from pytest_rlrollout.engines import Engine
    from pytest_rlrollout.reference import Running
    from pytest_rlrollout.remote.bucket import Bucket
    from pytest_rlrollout.remote.cassette import Cassette, CassetteTransport
    from pytest_rlrollout.remote.discovery import Discovery
    from pytest_rlrollout.remote.drivers import Driver, Status
    from pytest_rlrollout.remote.fingerprint import Fingerprint
    from pytest_rlrollout.remote.options import CompletionOptions, LoadOptions
    from pytest_rlrollout.remote.replicas import Waited
    from pytest_rlrollout.remote.stream import Exchange, Stream
    from pytest_rlrollout.remote.target import Target
    from pytest_rlrollout.suite.prompts import Prompt


LOCAL_KEY = "rl-reference-key"  # the bundled deployment's API key


class HotLoadNotAllowed(Exception):
    """A state change was attempted on a live deployment without --rl-allow-hot-load."""


class RLDeployment:
    """The deployment under test, as the `rl_deployment` fixture hands it out: the contract's
    intents, on the wire of its engine's driver (`driver`; `client` is the bounded HTTP client
    under it, whose exchanges are a test's evidence).

    Reads never change state; `hot_load`, `hint`, `reset_ledger`, `pause`, `resume`,
    `reset_cache` and `set_label` raise `HotLoadNotAllowed` on a live deployment unless the run
    passed `--rl-allow-hot-load`.
    """

    def __init__(
        self,
        driver: Driver,
        opts: RLConfig,
        *,
        base_snapshot: Path | None,
        bucket: Bucket | None,
        local: Running | None = None,
    ):
        self.driver, self.client, self.options = driver, driver.client, opts
        self.base_snapshot, self.bucket = base_snapshot, bucket
        self.timeouts = opts.timeouts
        timed(driver, opts)
        self._local = local  # the bundled reference deployment, when it runs in this process
        self.discovery: Discovery | None = None  # what it is and offers; set before any test
        self.run_id = "run"  # unique per run (the recording's in replay); set before any test
        driver.served_config = self.base_config

    @property
    def target(self) -> Target:
        return self.client.target

    @property
    def mode(self) -> str:
        """`local`, `live` or `replay`."""
        return self.options.mode

    @property
    def allow_hot_load(self) -> bool:
        return self.options.allow_hot_load

    @property
    def key(self) -> str:
        """Names the deployment for the lock and the run's shared record (same URL + name = same)."""
        return f"{self.target.base_url}|{self.target.deployment}"

    @property
    def cassettes(self) -> CassetteTransport | None:
        """The recording or replaying transport, or None."""
        from pytest_rlrollout.remote.cassette import CassetteTransport

        t = self.client.transport
        return t if isinstance(t, CassetteTransport) else None

    # ----------------------------------------------------------------------- reading

    def status(self, *, headers: dict[str, str] | None = None) -> Status:
        """What the deployment says each replica serves (the engine's status read, its answer kept)."""
        return self.driver.read_status(headers=headers)

    def replicas(self) -> list[dict[str, Any]]:
        """The replicas, in the hot-load status's shape; [] when the status cannot be read."""
        return self.driver.replicas()

    def replicas_if_answering(self) -> list[dict[str, Any]] | None:
        """The replicas; None when the deployment does not answer at all (a test marked rl_breaks
        may leave it dead: what the run does at its end then says so instead of raising, which
        would turn that test's verdict into an error)."""
        import httpx

        from pytest_rlrollout.remote.limits import LimitExceeded

        try:
            return self.replicas()
        except (httpx.TransportError, LimitExceeded):
            return None

    def served_identities(self) -> list[str | None]:
        """`current_snapshot_identity` of every replica."""
        return [r.get("current_snapshot_identity") for r in self.replicas()]

    def serving(self) -> str | None:
        """The snapshot identity every replica serves, or None when they differ."""
        ids = set(self.served_identities())
        return ids.pop() if len(ids) == 1 else None

    def ledger(self) -> httpx.Response:
        return self.driver.ledger()

    def complete(self, body: dict[str, Any], **options: Unpack[CompletionOptions]) -> Stream:
        """A completion in the contract's vocabulary (streamed when `body["stream"]`), sent on the
        engine's wire and parsed into a `Stream`: policy version per chunk, logprobs entries,
        routing matrices, usage, cached tokens of every channel. `on_chunk` sees each chunk as it
        arrives, `on_status` the status as soon as the answer's head arrives."""
        return self.driver.complete(body, **options)

    def post_inference(self, content: bytes, *, chat: bool = False) -> httpx.Response:
        """POST raw bytes to the completions endpoint (malformed requests on purpose)."""
        return self.driver.post_inference(content, chat=chat)

    def auth_headers(self) -> dict[str, str]:
        return self.client.auth_headers()

    def mark(self, name: str) -> float:
        """Now, in seconds; on the cassette's timeline when recording or replaying."""
        return self.client.mark(name)

    def decide(self, name: str, live: bool) -> bool:
        """`live`; when replaying, what the recording decided under `name` (`DeploymentClient.decide`)."""
        return self.client.decide(name, live)

    @property
    def engine(self) -> Engine:
        """Whose wire the deployment speaks: `fireworks`, `vllm` or `openai`."""
        return self.driver.engine

    @property
    def capabilities(self) -> Discovery:
        """What the deployment offers (the capability vocabulary), discovered without changing it."""
        assert self.discovery is not None, "discovered when the rl_deployment fixture starts"
        return self.discovery

    # ----------------------------------------------------------------------- what a test sends

    def salted(self, name: str) -> str:
        """`name`, unique to this run: session ids, isolation keys and prompts of a run never meet
        the prompt-cache entries of an earlier run against the same long-lived deployment."""
        return f"rl-{self.run_id}-{name}"

    def session(self, name: str, **more: str) -> dict[str, str]:
        """Headers of a session of this run named `name` (plus any other headers)."""
        return {"x-multi-turn-session-id": self.salted(name), **more}

    def prompt(self, name: str, tokens: int = 24) -> Prompt:
        """A prompt no other test and no earlier run sends: token ids when the deployment takes
        them, else about `tokens` words of text."""
        from pytest_rlrollout.suite.prompts import make_prompt

        ids = self.capabilities.has("token_id_prompts") and self.driver.prompts_in_ids
        return make_prompt(self.salted(name), tokens, ids=ids, vocab=(self.base_config or {}).get("vocab_size"))

    def sessions_per_replica(self, name: str) -> dict[str, dict[str, str]]:
        """Session headers of this run reaching each replica, by the replica's name (the session
        key itself where answers name none): one-token probes until every replica the deployment
        has answered, so that a clause about each replica is judged on each (a gateway's engines
        included). One replica: one session."""
        from pytest_rlrollout.remote.fingerprint import sessions_by_replica

        replicas = max(self.capabilities.replicas, 1)
        found, _, _ = sessions_by_replica(self.driver, replicas, lambda n: self.salted(f"{name}-{n}"))
        return {replica: {"x-multi-turn-session-id": key} for replica, key in found.items()}

    def token_ids(self, name: str, tokens: int) -> list[int]:
        """The token ids of a prompt no other test and no earlier run sends, for the tests that
        score a prompt's own tokens (they need `token_id_prompts`): the ids `prompt` sends where
        the deployment's routed path takes ids."""
        from pytest_rlrollout.suite.prompts import make_prompt

        ids = make_prompt(self.salted(name), tokens, ids=True, vocab=(self.base_config or {}).get("vocab_size")).ids
        assert ids is not None  # asked for ids
        return ids

    @functools.cached_property
    def base_config(self) -> dict[str, Any] | None:
        """config.json of the served base model, when a local copy is known (--rl-base-snapshot)."""
        if self.base_snapshot is None or not (self.base_snapshot / "config.json").is_file():
            return None
        return json.loads((self.base_snapshot / "config.json").read_text())

    @property
    def long_stream_tokens(self) -> int:
        """Tokens a stream must last for a swap to land inside it (rl_long_stream_tokens)."""
        return self.timeouts.long_stream_tokens

    @property
    def swap_timeout(self) -> float:
        return self.timeouts.swap

    @contextlib.contextmanager
    def observable_swaps(self) -> Iterator[None]:
        """While a test observes a swap in progress (a stream crossing it, probes landing inside
        it, a shard removed before it is read): the bundled reference deployment slows its loads,
        swaps and decode steps to a pace a client can observe, and otherwise runs at full speed.
        A deployment elsewhere keeps its own pace."""
        if self._local is None:
            yield
            return
        from pytest_rlrollout.reference.settings import OBSERVABLE_PACE

        self._local.deployment.set_pace(**OBSERVABLE_PACE)
        try:
            yield
        finally:
            self._local.deployment.set_pace(**dict.fromkeys(OBSERVABLE_PACE, 0.0))

    def wait_for(
        self, identity: str, *, lora: bool = False, progress: Callable[[list[dict[str, Any]]], None] | None = None
    ) -> Waited:
        """Wait until every replica serves `identity`, a replica reports its load failed, the
        rollout stalls part-way, or the swap timeout passes."""
        t = self.timeouts
        return self.driver.wait(
            identity,
            timeout=t.swap,
            poll=t.poll,
            lora=lora,
            progress=progress,
            stalled_after=t.stalled_after,
            first_poll=t.first_poll,
        )

    def settle(self) -> bool:
        """Poll until no replica is loading or swapping; False at the deadline or when no
        replica can be seen."""
        from pytest_rlrollout.remote.polling import ticks
        from pytest_rlrollout.remote.replicas import busy

        for _ in ticks(self.timeouts.swap, self.timeouts.poll, start=self.timeouts.first_poll):
            replicas = self.replicas()
            if not replicas:
                return False  # nothing to observe (see HL-GET-1)
            if all(r.get("readiness") and not busy(r) for r in replicas):
                return True
        return False

    # ----------------------------------------------------------------------- changing state (guarded)

    def hot_load(self, body: Any, **options: Unpack[LoadOptions]) -> httpx.Response:
        """Load the snapshot a signal names, through the engine's load API; a refusal because
        another load is in progress (one load at a time: `Driver.busy`) is signalled again until
        the swap timeout, as a trainer's client would. `midway`: see `Driver.load`."""
        from pytest_rlrollout.remote.polling import ticks

        self._check_allowed("hot-load")
        for _ in ticks(self.timeouts.swap, self.timeouts.retry):
            r = self.driver.load(body, **options)
            if not self.driver.busy(r):
                return r
        return r

    def hint(self, identity: str, file: str) -> httpx.Response:
        self._check_allowed("hot-load hint")
        return self.driver.hint(identity, file)

    def reset_ledger(self) -> httpx.Response:
        self._check_allowed("ledger reset")
        return self.driver.reset_ledger()

    def pause(self, mode: str, *, clear_cache: bool = False) -> httpx.Response:
        """Pause generation (`abort`, `wait` or `keep`: what in-flight requests do meanwhile)."""
        self._check_allowed("pause")
        return self.driver.pause(mode, clear_cache=clear_cache)

    def resume(self) -> httpx.Response:
        self._check_allowed("resume")
        return self.driver.resume()

    def paused(self) -> bool | None:
        """Whether generation is paused, as the deployment says (None: its answer does not say)."""
        return self.driver.paused()

    def reset_cache(self) -> httpx.Response:
        """Reset the prompt cache on request."""
        self._check_allowed("prompt-cache reset")
        return self.driver.reset_cache()

    def set_label(self, label: str) -> httpx.Response:
        """Publish `label` as the policy version, changing no weights."""
        self._check_allowed("policy label change")
        return self.driver.set_label(label)

    def _check_allowed(self, what: str) -> None:
        if not self.allow_hot_load:
            raise HotLoadNotAllowed(
                f"refusing a {what} on {self.target.deployment}: pass --rl-allow-hot-load to allow state changes"
            )


# --------------------------------------------------------------------------- opening one


def run_dir(config: pytest.Config) -> Path:
    """A directory shared by the controller and every xdist worker of this run."""
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return base.parent if hasattr(config, "workerinput") else base


def run_state(config: pytest.Config) -> RunState:
    """What a live run leaves for its report (start, ends, restore, cleanups), typed."""
    return RunState(run_dir(config) / "rl-state")


@contextlib.contextmanager
def _local(opts: RLConfig, tmp: pytest.TempPathFactory) -> Iterator[RLDeployment]:
    from pytest_rlrollout.reference import reference_deployment
    from pytest_rlrollout.remote.bucket import Bucket
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.drivers import driver_for
    from pytest_rlrollout.remote.target import Target
    from pytest_rlrollout.snapshot import tiny_moe

    bucket = tmp.mktemp("rl-bucket")
    engine = opts.engine or DEFAULT  # the dialect the bundled deployment speaks (--rl-engine)
    # full speed; tests that observe a swap in progress slow it down (RLDeployment.observable_swaps)
    # with an API key in either dialect (vLLM asks for none by default): HL-AUTH-1 is judged too
    release = {"vllm_release": opts.local_vllm_release} if opts.local_vllm_release else {}
    with reference_deployment(
        bucket, engine=engine, faults=opts.local_faults, transition=opts.transition, api_key=LOCAL_KEY, **release
    ) as dep:
        # a self-hosted server is addressed by its URL alone; a hosted deployment by its name
        # (accounts/<a>/deployments/<d>) or its UUID (its hot-loads name it)
        name = {"path": dep.name, "uuid": dep.settings.deployment_id, None: None}[spec(engine).names]
        target = Target(name, dep.base_url, dep.model, dep.api_key, engine=engine)
        transport = _recorder(opts, target.api_key)
        with DeploymentClient(target, transport=transport, timeout=opts.timeouts.request, limits=opts.limits) as client:
            driver = driver_for(engine, client, bucket=str(bucket.resolve()))
            yield RLDeployment(
                driver, opts, base_snapshot=bucket / tiny_moe.BASE_IDENTITY, bucket=Bucket(bucket), local=dep
            )


def timed(driver: Driver, opts: RLConfig) -> Driver:
    """`driver`, keeping the run's waits: a load answered once done may take the whole swap, and
    a swap's status is read at most once a poll interval (live: twice a second), whatever reads."""
    driver.load_wait, driver.status_gap = opts.timeouts.swap, opts.timeouts.poll
    return driver


@contextlib.contextmanager
def connect(opts: RLConfig, engine: Engine, transport: httpx.BaseTransport | None = None) -> Iterator[Driver]:
    """The live deployment the options name, through its engine's driver: the one way the plugin
    (preflight, tests, the restore at the end) and the `rlrollout` commands reach a deployment."""
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.drivers import driver_for
    from pytest_rlrollout.remote.target import Target

    assert opts.base_url and opts.model and opts.api_key is not None
    target = Target(
        opts.deployment,
        opts.base_url,
        opts.model,
        opts.api_key,
        inference_url=opts.inference_url or "",
        engine=engine,
        control_url=opts.control_url or "",
        control_key=opts.control_key,
        members=opts.fleet_urls,
    )
    with DeploymentClient(target, transport=transport, timeout=opts.timeouts.request, limits=opts.limits) as client:
        yield timed(driver_for(engine, client, bucket=served_path(opts.bucket_url)), opts)


@contextlib.contextmanager
def _live(opts: RLConfig, engine: Engine, config: pytest.Config) -> Iterator[RLDeployment]:
    from pytest_rlrollout.remote.bucket import Bucket

    # a long upload says how far it is, on the terminal (xdist workers have none: they say nothing)
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    progress = None if terminal is None else (lambda p: terminal.write_line(p.line()))
    bucket = Bucket(opts.bucket_url, opts.store, progress=progress) if opts.bucket_url else None
    with connect(opts, engine, _recorder(opts, opts.api_key)) as driver:
        yield RLDeployment(driver, opts, base_snapshot=opts.base_snapshot, bucket=bucket)


@contextlib.contextmanager
def _replay(opts: RLConfig, tmp: pytest.TempPathFactory) -> Iterator[RLDeployment]:
    from pytest_rlrollout.remote.bucket import Bucket
    from pytest_rlrollout.remote.cassette import Cassette, CassetteTransport
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.drivers import driver_for
    from pytest_rlrollout.remote.secret import Secret
    from pytest_rlrollout.remote.target import Target
    from pytest_rlrollout.snapshot import tiny_moe

    assert opts.replay is not None and opts.replay_meta is not None
    key = Secret("replay-key")
    session = Cassette.load(opts.replay / "_session.json", root=opts.replay)
    transport = CassetteTransport("replay", key, opts.replay, session, limits=opts.limits)
    # snapshots are still built (their signals must match the recording), into a bucket nobody reads
    bucket = tmp.mktemp("rl-replay-bucket")
    base = opts.base_snapshot or tiny_moe.make_base(bucket / tiny_moe.BASE_IDENTITY)
    engine = opts.engine or DEFAULT
    target = Target(
        opts.replay_meta["deployment"], "http://replay.invalid", opts.replay_meta["model"], key, engine=engine
    )
    with DeploymentClient(target, transport=transport, timeout=opts.timeouts.request, limits=opts.limits) as client:
        # the path the engine was told to read snapshots from is part of the recorded requests
        driver = driver_for(engine, client, bucket=opts.replay_meta.get("served_bucket"))
        yield RLDeployment(driver, opts, base_snapshot=base, bucket=Bucket(bucket))


def served_path(bucket_url: str | None) -> str | None:
    """Where an engine that loads from a path reads the bucket: a directory as an absolute
    path (`file://` URLs too); any other URL as it is, for the engine to resolve."""
    if bucket_url is None:
        return None
    if bucket_url.startswith("file://"):
        return str(Path(bucket_url.removeprefix("file://")).resolve())
    return bucket_url.rstrip("/") if "://" in bucket_url else str(Path(bucket_url).resolve())


def _recorder(opts: RLConfig, key: Any) -> CassetteTransport | None:
    """A recording transport when --rl-record is given, else None (plain HTTP)."""
    if opts.record is None:
        return None
    from pytest_rlrollout.remote.cassette import Cassette, CassetteTransport

    session = Cassette(opts.record / "_session.json")
    return CassetteTransport("record", key, opts.record, session, record_mode=opts.record_mode, limits=opts.limits)


@pytest.fixture(scope="session")
def rl_deployment(
    rl_config: RLConfig, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RLDeployment]:
    """The deployment under test (`--rl-deployment`); the bundled reference deployment by
    default; recorded with `--rl-record DIR`, or replayed offline with `--rl-replay DIR`."""
    config = request.config
    opts = rl_config
    opened = {
        "local": lambda: _local(opts, tmp_path_factory),
        "live": lambda: _live(opts, preflighted(config).engine, config),
        "replay": lambda: _replay(opts, tmp_path_factory),
    }[opts.mode]
    with opened() as dep:
        dep.discovery = config.stash[DISCOVERED] = discovered(config, dep)
        dep.run_id = run_id(config)
        if dep.mode == "live":  # for the report's restore instructions
            run_state(config).started(Served(dep.replicas()))
        yield dep
        if dep.mode == "live":
            # nothing answering (an rl_breaks test may leave the deployment dead): nothing served
            run_state(config).ended(Served(dep.replicas_if_answering() or []))
        cassettes = dep.cassettes
        if cassettes is not None and cassettes.mode == "record":
            if getattr(dep.driver, "bucket", None) is not None:  # part of the recorded load requests
                cassettes.session.meta["served_bucket"] = dep.driver.bucket
            cassettes.session.meta.update(
                deployment=dep.target.deployment,
                model=dep.target.model,
                recorded_mode=dep.mode,
                transition=dep.discovery.transition,
                engine=dep.engine,
                discovery=dep.discovery.as_dict(),
                run_id=dep.run_id,
                served_dtype=dep.options.numerics.dtype,
                profile=dep.options.budget.profile,
            )
            cassettes.session.write(dep.target.api_key)


def preflighted(config: pytest.Config) -> Discovery:
    """What the controller's preflight found (a live run): here, or shipped to this xdist worker."""
    from pytest_rlrollout.remote.discovery import Discovery

    if DISCOVERED not in config.stash:
        config.stash[DISCOVERED] = Discovery.from_dict(json.loads(config.workerinput[WORKER_DISCOVERY]))  # type: ignore[attr-defined]
    return config.stash[DISCOVERED]


def discovered(config: pytest.Config, dep: RLDeployment) -> Discovery:
    """The deployment's capabilities: from the controller's preflight (live), the recording
    (replay), or probed here (the local reference deployment, one per worker)."""
    from pytest_rlrollout.remote.discovery import Discovery

    if dep.mode == "live":
        found = preflighted(config)
    elif dep.mode == "replay" and "discovery" in (dep.options.replay_meta or {}):
        found = Discovery.from_dict(dep.options.replay_meta["discovery"])
    else:
        found = dep.driver.discover(transition=dep.options.transition, decided="the bundled reference deployment")
        if dep.mode == "local":  # a recording without its discovery holds no such exchanges
            fingerprint_start(dep.driver, found, dep.base_snapshot)
        return found
    dep.driver.adopt(found)
    return found


def base_served_now(driver: Driver, base: Path) -> str | None:
    """The identity under which every replica serves the base snapshot `base` now, or None: the
    base's own identity (its directory's name), or the engine's start label when the engine was
    started from that directory (vLLM's "default")."""
    served = {r.get("current_snapshot_identity") for r in driver.replicas()}
    label = served.pop() if len(served) == 1 else None
    if not isinstance(label, str):
        return None
    if label == base.name:
        return label
    started = driver.started_from() if label == driver.start_label() else None
    return label if started is not None and Path(started).resolve() == base.resolve() else None


def fingerprint_start(driver: Driver, found: Discovery, base: Path | None) -> None:
    """Before any test loads anything: the canary set scored on the base, when the deployment
    serves it (`found.start`; FID-SAME-1 compares every later load path of the base with it, and
    the restore at the end of a live run its result). Nothing when the base is unknown or not
    served, or the canaries cannot be scored (the FID tests, scoring them again, say why)."""
    if base is None or not all(map(found.has, ("logprobs", "echo", "token_id_prompts"))):
        return
    label = base_served_now(driver, base)
    scored = _canaries(driver, base) if label is not None else None
    if scored is not None:
        found.start = {"identity": label, "logprobs": [list(row) for row in scored.logprobs]}


def _canaries(driver: Driver, base: Path) -> Fingerprint | None:
    """The canary set scored now, under an isolation key of its own (no KV of this or any run
    takes part); None when the answers cannot be read as a fingerprint."""
    import uuid

    from pytest_rlrollout.remote.fingerprint import FingerprintError, fingerprint

    config = base / "config.json"
    vocab = json.loads(config.read_text()).get("vocab_size") if config.is_file() else None
    try:
        return fingerprint(driver, f"rlrollout-start-{uuid.uuid4().hex}", vocab=vocab)
    except FingerprintError:
        return None


def _restored_numbers(driver: Driver, found: Discovery | None, label: str, opts: RLConfig) -> str:
    """Whether the restored weights score as the start's did (where the start was fingerprinted)."""
    from pytest_rlrollout.remote.fingerprint import Fingerprint

    if found is None or found.start is None or found.start["identity"] != label or opts.base_snapshot is None:
        return ""
    now = _canaries(driver, opts.base_snapshot)
    if now is None:
        return "; the canary set could not be scored again to compare the numbers"
    start = Fingerprint.of(found.start["logprobs"])
    tolerance = opts.numerics.fingerprint_tolerance
    if now.same(start, tolerance):
        return f"; the weights score as at the start ({now.describe(start)} <= {tolerance:g})"
    return (
        f"; but the weights do not score as at the start: {now.describe(start)} > {tolerance:g} (the label "
        f"is back, the start's weights are not)"
    )


def restore_start(config: pytest.Config, engine: Engine) -> None:
    """After a live run that changed what is served: what the engine's driver can do to serve the
    start's snapshot again (vLLM: reload the directory the server started from and set the start
    label back), written down beside the start and end states for the report."""
    import httpx

    from pytest_rlrollout.remote.limits import LimitExceeded

    opts = options(config)
    state = run_state(config)
    start = state.start if opts.mode == "live" and opts.allow_hot_load else None
    label = start.label if start is not None else None
    if label is None:
        return
    with connect(opts, engine) as driver:
        try:
            if driver.replicas() and {r.get("current_snapshot_identity") for r in driver.replicas()} == {label}:
                return
            done = driver.restore(label)
            if done is not None:
                done += _restored_numbers(driver, config.stash.get(DISCOVERED, None), label, opts)
            after = driver.replicas()
        except (httpx.HTTPError, LimitExceeded) as e:  # e.g. a deployment a refused load left broken
            done, after = f"the start could not be restored: {type(e).__name__}: {e}", []
    if done is None:
        return
    state.restored(Restored(after, restored=done))
    if after and {r.get("current_snapshot_identity") for r in after} == {label}:
        _remove_kept(state, opts)


def _remove_kept(state: RunState, opts: RLConfig) -> None:
    """Once the start is served again, what the run kept because it was served at the end goes."""
    from pytest_rlrollout.remote.bucket import Bucket

    kept = sorted({i for c in state.cleanups for i in c.kept})
    if kept and opts.bucket_url:
        bucket = Bucket(opts.bucket_url, opts.store)
        for identity in kept:
            bucket.remove(identity)
        state.cleaned(Cleanup(kept, []), name="restored")


def run_id(config: pytest.Config) -> str:
    """Unique per run; in replay, the recording's; when adding to existing cassettes
    (rl_record_mode = once), theirs, so that old and new cassettes name the same snapshots."""
    opts = options(config)
    if opts.replay_meta is not None:
        return opts.replay_meta["run_id"]
    session = opts.record / "_session.json" if opts.record else None
    if session is not None and opts.record_mode == "once" and session.exists():
        return recorded_run_id(session)
    worker_uid = (getattr(config, "workerinput", {}) or {}).get("testrunuid")
    if worker_uid:
        return worker_uid[:8]
    import uuid

    marker = run_dir(config) / "rl-run-id"
    if not marker.exists():
        marker.write_text(uuid.uuid4().hex)
    return marker.read_text()[:8]


def recorded_run_id(session: Path) -> str:
    """The run id of the recording being added to, checked: it names snapshots and files."""
    from pytest_rlrollout.remote.cassette import Cassette
    from pytest_rlrollout.remote.cassette_file import CassetteError
    from pytest_rlrollout.suite.options import RUN_ID

    try:
        found = Cassette.load(session).meta.get("run_id")
    except CassetteError as e:
        raise pytest.UsageError(f"rl_record_mode = once: {e}") from None
    if not isinstance(found, str) or not RUN_ID.fullmatch(found):
        raise pytest.UsageError(f"rl_record_mode = once: {session} holds no usable run_id ({str(found)[:80]!r})")
    return found


# --------------------------------------------------------------------------- per test: its hold (rl_test)


def _requirements(request: pytest.FixtureRequest, dep: RLDeployment) -> None:
    """What the test needs of the deployment: a clause of its engine, state changes allowed
    (`rl_swaps`), capabilities (`rl_requires`). The suite, not the test, decides the outcome of
    what is missing (see contract/capabilities.py)."""
    from pytest_rlrollout.contract import catalogue

    clauses = [catalogue()[c] for mark in request.node.iter_markers("rl_clause") for c in mark.args]
    unbound = [c for c in clauses if not c.binds(dep.engine)]
    if unbound:  # the test's verdict is every clause's it is tagged with: each must mean something here
        bound = sorted({e for c in unbound for e in c.engines})
        not_applicable(
            f"{', '.join(c.id for c in unbound)}: no {dep.engine} binding (bound on {', '.join(bound)}); "
            f"the deployment's engine is {dep.engine} ({dep.capabilities.decided})"
        )
    if request.node.get_closest_marker("rl_swaps") is not None and not dep.allow_hot_load:
        inconclusive("read-only: pass --rl-allow-hot-load to let this test hot-load snapshots")
    must = any(c.level == "MUST" for c in clauses)
    for mark in request.node.iter_markers("rl_requires"):
        for capability in mark.args:
            _require(request.node, dep, capability, must=must)


def fail_in_call(item: pytest.Item, message: str) -> None:
    """Fail the test when it runs, with `message`: a finding made while setting it up (a
    capability the deployment must offer is missing) is the deployment's fault, not an error."""
    item.stash[MISSING] = message


def _require(item: pytest.Item, dep: RLDeployment, capability: str, *, must: bool) -> None:
    """A capability the test needs, or `transition:ASYNC|SYNC`."""
    from pytest_rlrollout.contract.capabilities import CAPABILITIES

    found = dep.capabilities
    if capability.startswith("transition:"):
        wanted = capability.split(":", 1)[1]
        if found.transition is None:
            inconclusive(
                "the transition type is unknown: the deployment resource does not say; set rl_transition (-o rl_transition=ASYNC|SYNC)"
            )
        if found.transition != wanted:
            not_applicable(f"the deployment uses {found.transition} transitions, this clause is about {wanted}")
        return
    if capability not in CAPABILITIES:
        raise pytest.UsageError(f"rl_requires: unknown capability {capability!r} (known: {', '.join(CAPABILITIES)})")
    if found.has(capability):
        return
    cap = CAPABILITIES[capability]
    seen = found.seen.get(capability, cap.probe)
    if cap.observable:
        inconclusive(f"cannot observe this: the deployment does not offer {capability}, {cap.about} ({seen})")
    if must and cap.required(dep.engine):
        fail_in_call(
            item,
            f"the deployment lacks {capability} ({cap.about}; probe: {seen}), which a {dep.engine} "
            "deployment must offer",
        )
    elif (flag := cap.flag(dep.engine)) is not None:
        unsupported(
            f"the deployment does not offer {capability}: {cap.about} (probe: {seen}); {dep.engine} "
            f"offers it with {flag}"
        )
    else:
        unsupported(f"the deployment does not offer {capability}: {cap.about} (probe: {seen})")


@dataclass
class RLTest:
    """One test's hold on the deployment (the `rl_test` fixture): its deadline, its exchanges
    (newest last: the evidence of a failure), its cassette when recording or replaying, and
    whether it holds the deployment alone (an `rl_swaps` test) or shares it."""

    deadline: float
    exchanges: collections.deque[Exchange]
    cassette: Cassette | None
    exclusive: bool


@pytest.fixture(autouse=True)
def rl_test(request: pytest.FixtureRequest) -> Iterator[RLTest | None]:
    """Every test of the deployment, in this order: what it requires (else it is not run and
    says why), its cassette, the lock (exclusive for `rl_swaps` tests, shared for the others,
    across processes; a swap test leaves the deployment at rest for the next), then its own
    exchanges and its deadline: everything it asks ends by `rl_test_timeout` after it got the
    lock, so a deployment that keeps a stream going fails that test naming the bound instead of
    holding the run. None for a test that does not use the deployment."""
    if "rl_deployment" not in request.fixturenames:
        yield None
        return
    from pytest_rlrollout.suite import planning

    dep: RLDeployment = request.getfixturevalue("rl_deployment")
    exclusive = request.node.get_closest_marker("rl_swaps") is not None
    try:
        _requirements(request, dep)
    except pytest.skip.Exception as e:
        if exclusive and dep.options.budget.plan is not None:  # the plan says why it leaves the test out
            planning.book(request.config).left_out.append((request.node.nodeid, str(e.msg)))
        raise
    breaks = request.node.get_closest_marker("rl_breaks") is not None
    with _cassette(request, dep) as cassette, _locked(dep, exclusive=exclusive, breaks=breaks):
        if exclusive:  # the profile, the plan and the budget, from where the run is now
            planning.plan_or_leave_out(request, dep)
        if breaks and dep.mode == "live" and dep.cassettes is None:
            _serving_before_it_breaks(dep)
        deadline = time.monotonic() + dep.timeouts.test
        try:
            with dep.client.scoped(deadline) as exchanges:
                test = request.node.stash[RL_TEST] = RLTest(deadline, exchanges, cassette, exclusive)
                yield test
        finally:
            if exclusive:
                planning.spend(request, dep)


def _serving_before_it_breaks(dep: RLDeployment) -> None:
    """A test that may break the deployment judges its clause only on one that serves when it
    starts: once an earlier such test left it unable to serve (a refused load kills vLLM's
    engine), what this one would see is that test's doing, not its own. Inconclusive then,
    saying so. (Live runs only: a recording holds no such probe, and the local deployment is
    never left unable to serve.)"""
    import httpx

    from pytest_rlrollout.remote.limits import LimitExceeded

    try:
        s = dep.complete({"prompt": dep.prompt("serving-before-it-breaks", 4).body, "max_tokens": 1})
        why = None if s.ok else f"HTTP {s.status} {s.body[:200]!r}"
    except (httpx.TransportError, LimitExceeded) as e:
        why = str(e)
    if why is not None:
        inconclusive(
            f"the deployment did not serve a one-token completion before this test ({why}): an earlier "
            "test that may break it (rl_breaks) left it unable to serve; judge this one on a deployment "
            "of its own (-k)"
        )


@contextlib.contextmanager
def _locked(dep: RLDeployment, *, exclusive: bool, breaks: bool = False) -> Iterator[None]:
    """The deployment's lock for one test; after an exclusive one, the deployment at rest. A test
    that `breaks` it may leave nothing that answers (vLLM's API server exits once its engine
    died): its verdict stands, and there is nothing to settle."""
    import httpx

    from pytest_rlrollout.remote.limits import LimitExceeded
    from pytest_rlrollout.remote.lock import DeploymentLock

    lock = DeploymentLock(dep.key)
    with lock.exclusive() if exclusive else lock.shared():
        yield
        if exclusive:
            try:
                dep.settle()  # in the test's cassette: a replay answers it as the recording did
            except (httpx.TransportError, LimitExceeded):
                if not breaks:
                    raise


@contextlib.contextmanager
def _cassette(request: pytest.FixtureRequest, dep: RLDeployment) -> Iterator[Cassette | None]:
    """This test's cassette when recording or replaying (None otherwise)."""
    t = dep.cassettes
    if t is None:
        yield None
        return
    from pytest_rlrollout.remote.cassette import Cassette, cassette_name
    from pytest_rlrollout.remote.cassette_file import CassetteError

    path = t.directory / cassette_name(request.node.nodeid)
    if t.mode == "replay":
        if not path.exists() and not path.is_symlink():
            inconclusive(f"no cassette for this test in {t.directory} (record it with --rl-record)")
        try:  # read as the transport reads it: confined to the cassette directory
            cassette = t.load(cassette_name(request.node.nodeid))
        except CassetteError as e:  # the recording is broken, not the deployment: an error naming it
            pytest.fail(f"cassette {e}", pytrace=False)
    else:
        cassette = Cassette(path)
    keep = t.mode == "record" and not (t.record_mode == "once" and path.is_file())
    t.use(cassette)
    try:
        yield cassette
    finally:
        t.use(t.session)
        if keep:
            cassette.meta["test"] = request.node.nodeid
            cassette.write(dep.target.api_key)
