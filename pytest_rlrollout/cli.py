"""The `rlrollout` command: validate, export, delta, apply, make-base, clauses."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 5GB, 512MiB, 1000000)")
    unit = (m.group(2) or "").upper().replace("I", "").rstrip("B")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(unit or " "))


def _cmd_validate(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot.validate import load_signal, validate

    signal = load_signal(args.signal) if args.signal else None
    report = validate(
        args.snapshot,
        base=args.base,
        parent=args.parent,
        signal=signal,
        identity=args.identity,
        base_model=tuple(args.base_model),
        hf_config=not args.no_transformers,
    )
    level = args.level.upper()
    if args.format == "json":
        print(json.dumps(report.as_dict(level), indent=2))
    else:
        print(report.text())
    return EXIT_OK if report.ok(level) else EXIT_FINDINGS


def _cmd_export(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import build

    dst = build.export_checkpoint(args.src, args.dst, max_bytes=args.max_shard_size)
    print(f"wrote {dst}")
    return EXIT_OK


def _cmd_delta(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import build

    signal = build.make_incremental(args.parent, args.target, args.out, threads=args.threads)
    print(json.dumps(signal, indent=2))
    return EXIT_OK


def _cmd_apply(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import build

    print(f"wrote {build.apply_incremental(args.parent, args.diff, args.out, threads=args.threads)}")
    return EXIT_OK


def _cmd_make_base(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import tiny_moe

    path = tiny_moe.make_base(args.dir)
    print(f"wrote {path} (model {tiny_moe.MODEL_NAME})")
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    import signal
    import tempfile
    import threading

    from pytest_rlrollout.reference import reference_deployment
    from pytest_rlrollout.reference.settings import OBSERVABLE_PACE

    bucket = args.bucket or Path(tempfile.mkdtemp(prefix="rlrollout-bucket-"))
    options = dict(
        replicas=args.replicas,
        transition=args.transition.upper(),
        api_key=args.api_key,
        faults=frozenset(args.fault),
        stagger=args.stagger,
        **{k: OBSERVABLE_PACE[k] if getattr(args, k) is None else getattr(args, k) for k in OBSERVABLE_PACE},
    )
    # the built-in key is public; a key of the user's own is never echoed
    shown_key = args.api_key if args.api_key == "rl-reference-key" else "<the --api-key you chose>"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with reference_deployment(bucket, host=args.host, port=args.port, **options) as dep:
        print(f"base URL:   {dep.base_url}")
        print(f"deployment: {dep.name}")
        print(f"model:      {dep.model}")
        print(f"bucket:     {bucket}")
        print(
            f"conformance: rlrollout conformance --rl-deployment={dep.name} --rl-base-url={dep.base_url}"
            f" --rl-model={dep.model} --rl-api-key={shown_key} --rl-allow-hot-load"
            f" --rl-bucket-url={bucket} --rl-base-snapshot={bucket / dep.settings.base_identity}"
            f" --rl-transition={options['transition']}"
            # this deployment's pace: a swap lands inside 64 tokens and takes well under 10 s
            f" --rl-long-stream-tokens=64 --rl-swap-timeout=10"
        )
        print(
            f"serving {dep.settings.base_identity} on {args.replicas} replica(s), {options['transition']}", flush=True
        )
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    return EXIT_OK


def _cmd_clauses(args: argparse.Namespace) -> int:
    from pytest_rlrollout.contract import catalogue

    cat = catalogue()
    if args.format == "md":
        if args.area:
            raise ValueError("--format md prints the whole contract; drop --area")
        from pytest_rlrollout.suite.docs import contract_markdown

        sys.stdout.write(contract_markdown())
        return EXIT_OK
    area = args.area.upper() if args.area else None
    if area is not None and area not in cat.areas:
        raise ValueError(f"--area {args.area}: no such area (areas: {', '.join(cat.areas)})")
    chosen = [c for c in cat if area is None or c.area == area]
    if args.format == "json":
        print(json.dumps([c.__dict__ for c in chosen], indent=2))
    else:
        for c in chosen:
            print(f"{c.id:24} {c.level:6} {c.rule}")
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlrollout", description="RL-rollout hot-load deployment contract tools")
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="check a snapshot directory against every SNAP clause (reads only)")
    v.add_argument("snapshot", type=Path)
    v.add_argument("--base", type=Path, help="the base model snapshot (enables config/coverage/tokenizer comparisons)")
    v.add_argument("--parent", type=Path, help="the parent snapshot: SNAPSHOT is an ARC2 diff of it")
    v.add_argument("--signal", type=Path, help="the hot-load request body (JSON) that will announce the snapshot")
    v.add_argument("--identity", help="the identity it will be signalled under (default: the directory name)")
    v.add_argument("--base-model", action="append", default=[], help="a name adapter_config.json may use for the base")
    v.add_argument(
        "--level", choices=["must", "should"], default="should", help="fail on MUST findings only, or on SHOULD too"
    )
    v.add_argument("--format", choices=["text", "json"], default="text")
    v.add_argument("--no-transformers", action="store_true", help="do not ask transformers whether config.json loads")
    v.set_defaults(run=_cmd_validate)

    e = sub.add_parser("export", help="re-lay a Hugging Face checkpoint as a hot-load snapshot")
    e.add_argument("src", type=Path)
    e.add_argument("dst", type=Path)
    e.add_argument("--max-shard-size", type=_size, default=5 * 1024**3, help="size cap per shard (default 5GiB)")
    e.set_defaults(run=_cmd_export)

    d = sub.add_parser("delta", help="write the ARC2 diff PARENT -> TARGET into OUT and print its signal body")
    d.add_argument("parent", type=Path)
    d.add_argument("target", type=Path)
    d.add_argument("out", type=Path)
    d.add_argument("--threads", type=int)
    d.set_defaults(run=_cmd_delta)

    a = sub.add_parser("apply", help="materialise the full snapshot an ARC2 diff describes")
    a.add_argument("parent", type=Path)
    a.add_argument("diff", type=Path)
    a.add_argument("out", type=Path)
    a.add_argument("--threads", type=int)
    a.set_defaults(run=_cmd_apply)

    m = sub.add_parser("make-base", help="write the tiny reference Qwen3-MoE base snapshot")
    m.add_argument("dir", type=Path)
    m.set_defaults(run=_cmd_make_base)

    sv = sub.add_parser("serve", help="run the reference deployment (a hot-load deployment of the tiny MoE)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=0, help="0 picks a free port")
    sv.add_argument("--bucket", type=Path, help="snapshot bucket directory (default: a new temporary one)")
    sv.add_argument("--replicas", type=int, default=2)
    sv.add_argument("--transition", choices=["async", "sync", "ASYNC", "SYNC"], default="async")
    sv.add_argument("--api-key", default="rl-reference-key")
    sv.add_argument("--fault", action="append", default=[], metavar="CLAUSE-ID", help="break one clause on purpose")
    # the delays default to the pace at which the conformance suite can observe swaps
    sv.add_argument("--load-delay", type=float, help="seconds each replica takes to load a snapshot")
    sv.add_argument("--stagger", type=float, default=0.0, help="extra load seconds per replica index (staggered swaps)")
    sv.add_argument("--swap-delay", type=float, help="seconds a replica pauses at the swap")
    sv.add_argument("--token-delay", type=float, help="seconds per decode step (0: full speed)")
    sv.set_defaults(run=_cmd_serve)

    cf = sub.add_parser(
        "conformance",
        help="run the installed conformance suite (any pytest option, e.g. --rl-deployment=..., -n 2)",
        description="Runs the conformance tests installed with the package. Module names (hot_load, swap, "
        "cache, ...) select modules; every other argument goes to pytest.",
    )
    cf.add_argument("pytest_args", nargs=argparse.REMAINDER)
    cf.set_defaults(run=_cmd_conformance)

    c = sub.add_parser("clauses", help="list the contract's clauses (--format md: the contract document)")
    c.add_argument("--area", help="only this area (SNAP, HL, SWAP, CACHE, SESS, VER, R3, INF, NUM)")
    c.add_argument("--format", choices=["text", "json", "md"], default="text")
    c.set_defaults(run=_cmd_clauses)
    return p


def _cmd_conformance(args: argparse.Namespace) -> int:
    import pytest

    from pytest_rlrollout.suite.options import CONFORMANCE as suite

    modules = {p.stem.removeprefix("test_"): p for p in suite.glob("test_*.py")}
    chosen = [str(modules[a.removeprefix("test_").removesuffix(".py")]) for a in args.pytest_args
              if a.removeprefix("test_").removesuffix(".py") in modules]  # fmt: skip
    rest = [a for a in args.pytest_args if a.removeprefix("test_").removesuffix(".py") not in modules]
    return int(pytest.main([*(chosen or [str(suite)]), "-p", "no:cacheprovider", f"--rootdir={suite}", *rest]))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["conformance"] and not {"-h", "--help"} & set(argv[1:2]):
        # everything after the word goes to pytest untouched (argparse would claim -q, -n, ...)
        return _cmd_conformance(argparse.Namespace(pytest_args=argv[1:]))
    args = parser().parse_args(argv)
    from pytest_rlrollout.snapshot.arc2 import DeltaError
    from pytest_rlrollout.snapshot.build import SnapshotError

    try:
        return args.run(args)
    except (SnapshotError, DeltaError, NotADirectoryError, FileNotFoundError, ValueError, OSError) as e:
        print(f"rlrollout {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
