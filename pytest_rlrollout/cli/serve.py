"""`rlrollout serve`: the reference deployment in the foreground, printing the suite's command for
it, until Ctrl-C, SIGTERM or SIGHUP."""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.cli.exits import EXIT_OK, UsageError
from pytest_rlrollout.cli.stopping import WOKEN, StopSignals, StopTimedOut
from pytest_rlrollout.engines import DEFAULT, DIALECTS, SPECS, smg, spec, vllm, with_control_plane

if TYPE_CHECKING:
    from pytest_rlrollout.reference.fleet import Fleet
    from pytest_rlrollout.reference.server import Running

BUILT_IN_KEY = "rl-reference-key"  # the reference deployment's public default key
# How long a stop may take: the deployment lets its requests in flight finish for up to 10 s
# (reference.server.GRACE) and its replicas' workers end within 5 s after that; past this bound
# something hangs, and the stop is given up. After a second signal nothing waits for the streams.
STOP_WITHIN = 30.0
HURRIED_WITHIN = 10.0

# the reference's dialects: hosted (a bucket URL, the built-in key) and self-hosted (one engine)
HOSTED = ", ".join(s.name for s in SPECS if s.dialect and not s.self_hosted)
SELF_HOSTED = ", ".join(s.name for s in SPECS if s.dialect and s.self_hosted)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sv = sub.add_parser("serve", help="run the reference deployment (a hot-load deployment of the tiny MoE)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=0, help="0 picks a free port")
    sv.add_argument("--bucket", type=Path, help="snapshot bucket directory (default: a new temporary one)")
    sv.add_argument(
        "--bucket-url",
        metavar="URL",
        help=f"{HOSTED}: an object store bucket (s3://, gs://) the deployment downloads each "
        "snapshot from, as a hosted one does; --bucket is then its local copy. The base is put "
        "there at start; credentials come from the environment",
    )
    sv.add_argument("--bucket-endpoint-url", metavar="URL", help="the object store's endpoint (MinIO, moto, ...)")
    sv.add_argument(
        "--engine",
        choices=DIALECTS,
        default=DEFAULT,
        help="the wire it speaks: "
        + "; ".join(f"{s.name}: {s.dialect.serving.format(transition='ASYNC')}" for s in SPECS if s.dialect),
    )
    sv.add_argument(
        "--layout",
        choices=["tiny", "qwen3-30b-a3b"],
        default="tiny",
        help="the base it serves when --bucket holds none: the reference model, or Qwen3-30B-A3B's "
        "structure (48 layers, 128 experts, top-8, its 18,867 tensor names) at the reference's "
        "widths (as `rlrollout make-base --layout`)",
    )
    sv.add_argument("--replicas", type=int, help=f"default: 2 ({HOSTED}), 1 ({SELF_HOSTED})")
    sv.add_argument(
        "--fleet",
        type=int,
        metavar="N",
        help=f"{SELF_HOSTED}: N engines on one bucket behind SGLang's model gateway (smg --enable-rl, "
        "the fleet extra); --port is then the gateway's",
    )
    sv.add_argument(
        "--no-gateway",
        action="store_true",
        help="with --fleet: no gateway; the suite fans out to the engines itself (rl_fleet_urls)",
    )
    sv.add_argument(
        "--faulty-engine",
        type=int,
        metavar="I",
        help="with --fleet: the --fault switches hit engine I only (0-based; default: every engine)",
    )
    sv.add_argument(
        "--vllm-release",
        choices=vllm.RELEASES,
        default=vllm.DIALECT_VERSION,
        help=f"--engine {vllm.NAME}: the release it speaks (0.33.0 refuses requests arriving while paused "
        "in abort or wait mode, and returns policy-version spans on its OpenAI routes)",
    )
    sv.add_argument("--transition", choices=["async", "sync", "ASYNC", "SYNC"], default="async")
    sv.add_argument("--api-key", help=f"default: rl-reference-key ({HOSTED}), none asked for ({SELF_HOSTED})")
    sv.add_argument(
        "--control-api-key",
        help=f"{with_control_plane().name}: a key of its own for the hot-load API (default: --api-key)",
    )
    sv.add_argument(
        "--enable-return-routed-experts",
        action="store_true",
        help=f"{SELF_HOSTED}: completions carry routed_experts (as vLLM's flag on a GPU server; its CPU build has "
        "none, and neither has this dialect by default)",
    )
    sv.add_argument(
        "--fault",
        nargs="+",
        action="extend",
        default=[],
        metavar="SWITCH",
        help="fault switches to turn on (break a clause on purpose): a clause ID, ID:VARIANT, or a behaviour name; "
        "takes several and repeats",
    )
    sv.add_argument("--list-faults", action="store_true", help="list every fault switch with what it does, and exit")
    # the delays default to the pace at which the conformance suite can observe swaps
    sv.add_argument("--load-delay", type=float, help="seconds each replica takes to load a snapshot")
    sv.add_argument("--stagger", type=float, default=0.0, help="extra load seconds per replica index (staggered swaps)")
    sv.add_argument(
        "--swap-delay",
        type=float,
        help="seconds a replica pauses at the swap (default 1: the live profile polls twice a second)",
    )
    sv.add_argument("--token-delay", type=float, help="seconds per decode step (0: full speed)")
    sv.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Serve until stopped (exit 0); options that do not fit the engine are usage errors, found
    before anything is built, bound or created."""
    if args.list_faults:
        switches = _fault_switches()
        width = max(map(len, switches), default=0)
        print("\n".join(f"{name:{width}}  {what}" for name, what in switches.items()))
        return EXIT_OK
    faults = _check_faults(args.fault)  # before anything is built, bound or created
    engine = spec(args.engine)
    self_hosted = engine.self_hosted  # one server, swapped through its RL routes
    if engine.async_only and args.transition.upper() != "ASYNC":
        raise UsageError(f"--engine {args.engine}: {engine.async_only}; --transition sync does not apply")
    if args.control_api_key is not None and not engine.control_plane:
        control = with_control_plane()
        raise UsageError(f"--control-api-key is the key of {control.title}'s hot-load API (--engine {control.name})")
    if args.enable_return_routed_experts and not self_hosted:
        raise UsageError(
            f"--enable-return-routed-experts is a self-hosted engine's flag (--engine "
            f"{SELF_HOSTED.replace(', ', '|')}); the others return routing matrices when a request asks "
            "for them"
        )

    if args.vllm_release != vllm.DIALECT_VERSION and args.engine != vllm.NAME:
        raise UsageError(f"--vllm-release is the {vllm.ENGINE.title} dialect's (--engine {vllm.NAME})")
    if args.fleet is not None and (not self_hosted or args.fleet < 1):
        raise UsageError(
            f"--fleet N: N >= 1 engines of a self-hosted dialect (--engine {SELF_HOSTED.replace(', ', '|')})"
        )
    if args.fleet and not args.no_gateway and spec(smg.NAME).binds_like != args.engine:
        raise UsageError(
            f"--fleet behind {smg.NAME}: the suite's {smg.NAME} binding drives "
            f"{spec(smg.NAME).binds_like} engines, not {args.engine}; add --no-gateway"
        )
    if args.no_gateway and not args.fleet:
        raise UsageError("--no-gateway is a --fleet's: its engines with no gateway in front")
    if args.faulty_engine is not None and not (args.fleet and 0 <= args.faulty_engine < args.fleet):
        raise UsageError(f"--faulty-engine {args.faulty_engine}: an engine of --fleet (0..N-1)")
    if args.bucket_endpoint_url is not None and args.bucket_url is None:
        raise UsageError("--bucket-endpoint-url is the endpoint of --bucket-url's object store")
    if args.bucket_url is not None and self_hosted:
        raise UsageError(f"--bucket-url: {args.engine} reloads from a directory of this machine (--bucket)")
    options = _settings(args, faults, self_hosted)
    if args.bucket_url is not None:
        options |= _mirror(args)
    # Caught from here on, before there is anything to clean up: a signal that arrives while the
    # deployment starts stops it once it has started. The handlers go back last (a caller in this
    # process keeps its own; the program itself ends quietly on a signal after it stopped).
    with StopSignals(then="default" if getattr(args, "program", False) else "restore") as signals:
        stopped_by = _serve(args, options, signals)
        # said before the handlers go: the line proves the stop ended (the bucket removed)
        print(f"stopped ({signal.Signals(stopped_by).name})", flush=True)
    return EXIT_OK


def _serve(args: argparse.Namespace, options: dict[str, Any], signals: StopSignals) -> int:
    """Serve until a stop signal, then stop (the deployment, then its temporary bucket); the
    number of the signal that stopped it."""
    import tempfile

    from pytest_rlrollout.reference import reference_deployment
    from pytest_rlrollout.reference.server import GRACE

    cleanup = contextlib.ExitStack()
    temporary = args.bucket is None
    try:
        bucket = Path(tempfile.mkdtemp(prefix="rlrollout-bucket-")) if temporary else args.bucket
        if temporary:
            # removed after the deployment stops (the stack unwinds last-in first-out); a
            # --bucket the user named is theirs and never removed
            cleanup.callback(_remove_tree, bucket)
        if args.fleet:
            fleet = cleanup.enter_context(_fleet(args, bucket, options))
            print("\n".join(_fleet_announcement(fleet, bucket, options)), flush=True)
            dep: Running | Fleet = fleet
        else:
            dep = running = cleanup.enter_context(
                reference_deployment(bucket, host=args.host, port=args.port, **options)
            )
            if args.bucket_url is not None:  # the store holds the base under its identity, as a hosted bucket does
                _put_base(args, bucket / running.settings.base_identity)
            print("\n".join(_announcement(running, bucket, options)), flush=True)
        stopped_by = signals.wait()
    except BaseException:
        cleanup.close()
        raise
    assert stopped_by is not None  # no timeout, and nothing wakes it before the stop: a signal's number
    print(
        f"stopping ({signal.Signals(stopped_by).name}): requests in flight may finish for up to {GRACE:g} s; "
        "a second signal ends them now",
        flush=True,
    )
    _stop(cleanup, dep, signals, bucket if temporary else None, within=STOP_WITHIN)
    return stopped_by


def _stop(
    cleanup: contextlib.ExitStack, dep: Running | Fleet, signals: StopSignals, bucket: Path | None, within: float
) -> None:
    """Unwind `cleanup` in a thread of its own while this (the main) thread waits on `signals`:
    a second signal makes the deployment stop waiting for its streams, and a stop still under way
    after `within` seconds (after HURRIED_WITHIN once hurried) is given up: the temporary bucket
    (if any) is removed here and StopTimedOut raised."""
    ended: list[BaseException | None] = []

    def unwind() -> None:
        try:
            cleanup.close()
            ended.append(None)
        except BaseException as e:  # raised again on the main thread, below
            ended.append(e)
        finally:
            signals.wake()

    threading.Thread(target=unwind, name="rlrollout-serve-stop", daemon=True).start()
    deadline = time.monotonic() + within
    while not ended:
        got = signals.wait(timeout=max(0.0, deadline - time.monotonic()))
        if got is None:
            if bucket is not None:
                _remove_tree(bucket)
            removed = f"; its temporary bucket {bucket} was removed" if bucket and not bucket.exists() else ""
            raise StopTimedOut(f"the deployment did not stop within {within:g} s{removed}")
        if got != WOKEN:  # a second signal: no more waiting for the streams in flight
            dep.hurry_stop()
            deadline = min(deadline, time.monotonic() + HURRIED_WITHIN)
    if ended[0] is not None:
        raise ended[0]


def _settings(args: argparse.Namespace, faults: frozenset[str], self_hosted: bool) -> dict[str, Any]:
    """The reference deployment's settings from the options, each dialect's defaults filled in."""
    from pytest_rlrollout.reference.settings import SERVED_PACE

    options = dict(
        engine=args.engine,
        transition=args.transition.upper(),
        faults=faults,
        stagger=args.stagger,
        routed_experts=args.enable_return_routed_experts,
        vllm_release=args.vllm_release,
        layout=args.layout,
        **{k: SERVED_PACE[k] if getattr(args, k) is None else getattr(args, k) for k in SERVED_PACE},
    )
    # each dialect's defaults: 2 replicas and the built-in key on Fireworks; one engine and no key on vLLM
    given = (("replicas", args.replicas), ("api_key", args.api_key), ("control_api_key", args.control_api_key))
    options |= {k: v for k, v in given if v is not None}
    if not self_hosted:
        options.setdefault("api_key", BUILT_IN_KEY)
    return options


def _fleet(args: argparse.Namespace, bucket: Path, options: dict[str, Any]) -> contextlib.AbstractContextManager[Fleet]:
    """The reference fleet the options describe: --fleet engines, the faults on one or all."""
    from pytest_rlrollout.reference.fleet import reference_fleet

    settings = dict(options)
    engine, faults = settings.pop("engine"), settings.pop("faults")
    hit = [args.faulty_engine] if args.faulty_engine is not None else range(args.fleet)
    return reference_fleet(
        bucket,
        args.fleet,
        engine=engine,
        faults=dict.fromkeys(hit, faults),
        host=args.host,
        port=args.port,
        gateway=not args.no_gateway,
        **settings,
    )


def _fleet_announcement(fleet: Fleet, bucket: Path, options: dict[str, Any]) -> list[str]:
    """What `serve --fleet` prints: the gateway, its engines, the suite's command for the fleet."""
    from pytest_rlrollout.engines import listed_fleet

    first = fleet.engines[0]
    base = bucket / first.settings.base_identity
    gateway = [f"gateway:    {fleet.base_url}"] if fleet.gateway is not None else []
    named = [*gateway, f"engines:    {', '.join(fleet.urls)}", f"model:      {first.model}", f"bucket:     {bucket}"]
    reached = (
        f"--rl-engine={smg.NAME}"
        if fleet.gateway is not None
        else f"-o 'rl_fleet_urls={' '.join(fleet.urls)}' --rl-engine={listed_fleet(options['engine']).name}"
    )
    command = (
        f"--rl-base-url={fleet.base_url} --rl-model={first.model} {reached} --rl-allow-hot-load"
        f" --rl-bucket-url={bucket} --rl-base-snapshot={base}"
        + _paced(first, options["engine"])
        + " -o rl_served_dtype=float32"
    )
    dialect = spec(options["engine"]).dialect
    assert dialect is not None  # a fleet is of a self-hosted dialect
    serving = dialect.serving.format(transition=options["transition"])
    front = f"behind {smg.NAME}" if fleet.gateway is not None else "with no gateway"
    return [
        *named,
        f"conformance: rlrollout conformance {command}",
        f"serving {first.settings.base_identity} on {len(fleet.engines)} engines {front}, {serving}",
    ]


def _announcement(dep: Running, bucket: Path, options: dict[str, Any]) -> list[str]:
    """What `serve` prints once the deployment is up: where it is, the suite's command for it, and
    what it serves. The built-in key is public; a key of the user's own is never echoed."""
    engine, key = options["engine"], options.get("api_key")
    shown_key = _shown(key, "--api-key")
    base = bucket / dep.settings.base_identity
    endpoint = options.get("mirror_options", {}).get("endpoint_url")
    # where the suite puts snapshots: the object store when there is one (its endpoint an ini key)
    bucket_url = options.get("mirror") or str(bucket)
    bucket_url += f" -o rl_bucket_endpoint_url={endpoint}" if endpoint else ""
    s = spec(engine)
    if s.self_hosted:
        named = [f"base URL:   {dep.base_url}", f"model:      {dep.model}", f"bucket:     {bucket}"]
        command = (
            f"--rl-base-url={dep.base_url} --rl-model={dep.model} --rl-engine={engine} --rl-allow-hot-load"
            f" --rl-bucket-url={bucket} --rl-base-snapshot={base}"
            + (f" --rl-api-key={shown_key}" if key is not None else "")
        )
    elif s.control_plane:
        # the gateway and the hot-load API on one host here; a real deployment has two
        shown_control = _shown(options.get("control_api_key") or key, "--control-api-key")
        deployment = dep.settings.deployment_id
        named = [
            f"gateway:    {dep.base_url}",
            f"hot-loads:  {dep.base_url}",
            f"deployment: {deployment}",
            f"model:      {dep.model}",
            f"bucket:     {bucket}",
            f"environment: COREWEAVE_API_KEY={shown_control}",
        ]
        command = (
            f"--rl-deployment={deployment} --rl-base-url={dep.base_url} -o rl_control_url={dep.base_url}"
            f" --rl-model={dep.model} --rl-engine={engine} --rl-api-key={shown_key} --rl-allow-hot-load"
            f" --rl-bucket-url={bucket_url} --rl-base-snapshot={base}"
        )
    else:
        named = [
            f"base URL:   {dep.base_url}",
            f"deployment: {dep.name}",
            f"model:      {dep.model}",
            f"bucket:     {bucket}",
        ]
        command = (
            f"--rl-deployment={dep.name} --rl-base-url={dep.base_url} --rl-model={dep.model}"
            f" --rl-api-key={shown_key} --rl-allow-hot-load --rl-bucket-url={bucket_url}"
            f" --rl-base-snapshot={base} -o rl_transition={options['transition']}"
        )
    dialect = s.dialect
    assert dialect is not None  # --engine's choices are the dialects
    if dialect.stream_tokens is not None:
        command += f" -o rl_long_stream_tokens={dialect.stream_tokens}"
    serving = dialect.serving.format(transition=options["transition"])
    command += _paced(dep, engine)
    command += " -o rl_served_dtype=float32"  # its numpy engine computes in float32, whatever config.json declares
    replicas = len(dep.deployment.replicas)
    if options.get("mirror"):  # the suite's bucket; the one above is the deployment's local copy of it
        named.append(f"store:      {options['mirror']}" + (f" (endpoint {endpoint})" if endpoint else ""))
    return [
        *named,
        f"conformance: rlrollout conformance {command}",
        f"serving {dep.settings.base_identity} on {replicas} replica(s), {serving}",
    ]


TENSORS_PER_SECOND = 300  # the swap timeout's floor per tensor of the base (see _paced): 63 s for 18,867


def _paced(dep: Running, engine: str) -> str:
    """The suite's waits for this deployment's pace: how long one swap takes (every replica loads
    at once, the last one `stagger` seconds per replica later, then pauses at the swap), for the
    plan's estimate, and a swap timeout of three swaps, never under 10 s, nor under a second per
    `TENSORS_PER_SECOND` tensors of the base: a load reads and checks every tensor's header, and a
    Qwen3-30B-A3B-shaped base (18,867 tensors) took over 10 s to swap on two busy cores. On the
    vLLM and SGLang dialects the timeout is the live profile's 900 s unless a swap outgrows it."""
    from pytest_rlrollout.snapshot.build import weight_map
    from pytest_rlrollout.suite.run_config import LIVE

    s = dep.settings
    swap = s.load_delay + s.stagger * (len(dep.deployment.replicas) - 1) + s.swap_delay
    base = s.bucket / s.base_identity
    tensors = len(weight_map(base)) if base.is_dir() else 0
    timeout = max(10, math.ceil(3 * swap), math.ceil(tensors / TENSORS_PER_SECOND))
    said = f" -o rl_swap_seconds={swap:g}"
    return said if spec(engine).self_hosted and timeout <= LIVE.swap else said + f" -o rl_swap_timeout={timeout}"


def _store(args: argparse.Namespace) -> Any:
    from pytest_rlrollout.remote.bucket import Store

    return Store(endpoint_url=args.bucket_endpoint_url)


def _mirror(args: argparse.Namespace) -> dict[str, Any]:
    """The deployment's settings for an object store bucket, once the store answered for it."""
    from pytest_rlrollout.remote.bucket import Bucket, BucketError

    store = _store(args)
    try:
        Bucket(args.bucket_url, store).check()
        storage = store.storage_options(args.bucket_url.split("://", 1)[0])
    except (ValueError, BucketError) as e:
        raise UsageError(f"--bucket-url: {e}") from None
    return {"mirror": args.bucket_url.rstrip("/"), "mirror_options": storage}


def _put_base(args: argparse.Namespace, base: Path) -> None:
    from pytest_rlrollout.remote.bucket import Bucket

    remote = Bucket(args.bucket_url, _store(args))
    if not remote.exists(base.name):
        remote.upload(base, base.name)


def _fault_switches() -> dict[str, str]:
    """Every fault switch `serve --fault` takes, with what it does (behaviours included)."""
    from pytest_rlrollout.reference.faults import BEHAVIOURS, FAULTS

    return FAULTS | BEHAVIOURS


def _check_faults(names: Sequence[str]) -> frozenset[str]:
    """The switches; a usage error naming the unknown ones."""
    unknown = [n for n in dict.fromkeys(names) if n not in _fault_switches()]
    if unknown:
        raise UsageError(
            f"--fault: unknown fault switch(es) {', '.join(unknown)} (`rlrollout serve --list-faults` lists them)"
        )
    return frozenset(names)


def _remove_tree(path: Path) -> None:
    import shutil

    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass  # removed already: a stop given up removes it before the hung stop may get to it
    except OSError as e:
        print(f"rlrollout serve: could not remove the temporary bucket {path}: {e}", file=sys.stderr)


def _shown(key: str | None, option: str) -> str | None:
    """A key as `serve` prints it: the built-in one is public; one of the user's own never shows."""
    return key if key in (None, BUILT_IN_KEY) else f"<the {option} you chose>"
