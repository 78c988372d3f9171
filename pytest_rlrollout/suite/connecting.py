"""Reaching a deployment: the bundled reference deployment started here (local, one per xdist
worker), a live one through its engine's driver (`connect`: the one way the plugin and the
`rlrollout` commands reach it), or a recording answered from cassettes (replay); with
`--rl-record`, every exchange recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlrollout.engines import DEFAULT, spec
from pytest_rlrollout.suite.deployment import RLDeployment, timed
from pytest_rlrollout.suite.run_config import RLConfig

if TYPE_CHECKING:
    import httpx

    from pytest_rlrollout.engines import Engine
    from pytest_rlrollout.remote.cassette import CassetteTransport
    from pytest_rlrollout.remote.drivers import Driver


LOCAL_KEY = "rl-reference-key"  # the bundled deployment's API key


@contextlib.contextmanager
def local_deployment(opts: RLConfig, tmp: pytest.TempPathFactory) -> Iterator[RLDeployment]:
    from pytest_rlrollout.reference import reference_deployment
    from pytest_rlrollout.remote.bucket import Bucket
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.drivers import driver_for
    from pytest_rlrollout.remote.secret import Secret
    from pytest_rlrollout.remote.target import Target
    from pytest_rlrollout.snapshot import tiny_moe

    bucket = tmp.mktemp("rl-bucket")
    engine = opts.engine or DEFAULT  # the dialect the bundled deployment speaks (--rl-engine)
    # full speed; tests that observe a swap in progress slow it down (RLDeployment.observable_swaps)
    # with an API key in either dialect (vLLM asks for none by default): HL-AUTH-1 is judged too
    release: dict[str, Any] = {"vllm_release": opts.local_vllm_release} if opts.local_vllm_release else {}
    with reference_deployment(
        bucket, engine=engine, faults=opts.local_faults, transition=opts.transition, api_key=LOCAL_KEY, **release
    ) as dep:
        # a self-hosted server is addressed by its URL alone; a hosted deployment by its name
        # (accounts/<a>/deployments/<d>) or its UUID (its hot-loads name it)
        name = {"path": dep.name, "uuid": dep.settings.deployment_id, None: None}[spec(engine).names]
        target = Target(name, dep.base_url, dep.model, Secret(LOCAL_KEY), engine=engine)
        transport = _recorder(opts, target.api_key)
        with DeploymentClient(target, transport=transport, timeout=opts.timeouts.request, limits=opts.limits) as client:
            driver = driver_for(engine, client, bucket=str(bucket.resolve()))
            yield RLDeployment(
                driver, opts, base_snapshot=bucket / tiny_moe.BASE_IDENTITY, bucket=Bucket(bucket), local=dep
            )


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
def live_deployment(opts: RLConfig, engine: Engine, config: pytest.Config) -> Iterator[RLDeployment]:
    from pytest_rlrollout.remote.bucket import Bucket

    # a long upload says how far it is, on the terminal (xdist workers have none: they say nothing)
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    progress = None if terminal is None else (lambda p: terminal.write_line(p.line()))
    bucket = Bucket(opts.bucket_url, opts.store, progress=progress) if opts.bucket_url else None
    with connect(opts, engine, _recorder(opts, opts.api_key)) as driver:
        yield RLDeployment(driver, opts, base_snapshot=opts.base_snapshot, bucket=bucket)


@contextlib.contextmanager
def replayed_deployment(opts: RLConfig, tmp: pytest.TempPathFactory) -> Iterator[RLDeployment]:
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
