"""The snapshot tools: `rlrollout export`, `delta`, `apply` and `make-base`, each a call into
pytest_rlrollout.snapshot that prints what it wrote."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pytest_rlrollout.cli.exits import EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = sub.add_parser("export", help="re-lay a Hugging Face checkpoint as a hot-load snapshot")
    e.add_argument("src", type=Path)
    e.add_argument("dst", type=Path)
    e.add_argument("--max-shard-size", type=_size, default=5 * 1024**3, help="size cap per shard (default 5GiB)")
    e.set_defaults(run=_export)

    # delta and apply take the same arguments: PARENT, the other side of the diff, OUT
    for name, other, run, help_ in (
        ("delta", "target", _delta, "write the ARC2 diff PARENT -> TARGET into OUT and print its signal body"),
        ("apply", "diff", _apply, "materialise the full snapshot an ARC2 diff describes"),
    ):
        c = sub.add_parser(name, help=help_)
        for positional in ("parent", other, "out"):
            c.add_argument(positional, type=Path)
        c.add_argument("--threads", type=int)
        c.set_defaults(run=run)

    m = sub.add_parser("make-base", help="write the tiny reference Qwen3-MoE base snapshot")
    m.add_argument("dir", type=Path)
    m.add_argument(
        "--layout",
        choices=["tiny", "qwen3-30b-a3b"],
        default="tiny",
        help="tiny: the reference model (4 layers, 8 experts, top-2); qwen3-30b-a3b: Qwen3-30B-A3B's "
        "structure and 18,867 tensor names (48 layers, 128 experts, top-8) at the reference's "
        "widths, one layer per shard",
    )
    m.set_defaults(run=_make_base)


def _size(text: str) -> int:
    from pytest_rlrollout.snapshot.layout import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _export(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import build

    dst = build.export_checkpoint(args.src, args.dst, max_bytes=args.max_shard_size)
    print(f"wrote {dst}")
    return EXIT_OK


def _delta(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import build

    signal = build.make_incremental(args.parent, args.target, args.out, threads=args.threads)
    print(json.dumps(signal, indent=2))
    return EXIT_OK


def _apply(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import build

    print(f"wrote {build.apply_incremental(args.parent, args.diff, args.out, threads=args.threads)}")
    return EXIT_OK


def _make_base(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import tiny_moe

    path = tiny_moe.make_base(args.dir, layout=args.layout)
    print(f"wrote {path} (model {tiny_moe.MODEL_NAME}, layout {args.layout})")
    return EXIT_OK
