"""`rlrollout validate`: a snapshot directory against every SNAP clause, with hints for the two
mistakes whose findings do not say what to run next."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.cli.console import print_text
from pytest_rlrollout.cli.exits import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, UsageError

if TYPE_CHECKING:
    from pytest_rlrollout.snapshot.validate import Report

# The bounds are the validator's constants (snapshot.untrusted, safetensors_io, validate.core),
# written out so that `--help` imports none of it; a test holds the two together.
DESCRIPTION = (
    "Checks a snapshot directory against every SNAP clause; reads only, writes nothing. Exit status: 0 valid, "
    "1 findings, 2 usage or I/O error, 3 internal error (a bug in the validator: please report it). "
    "The snapshot and the signal are read as untrusted input, within bounds far above real snapshots; what "
    "exceeds them is a finding (a usage error for the --signal file): JSON files of at most 32 MiB (the signal "
    "1 MiB), nested at most 64 deep, with at most 2097152 items; safetensors headers of at most 32 MiB and "
    "65536 tensors (names of at most 1024 characters, rank at most 64); at most 4096 safetensors files and "
    "262144 tensors per snapshot; at most 1000 findings per clause. FIFOs, sockets, devices, directories and "
    "symlinks that loop or leave the snapshot are named, never opened. Text output prints names escaped "
    "(\\n, \\x1b); --format json is JSON."
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    v = sub.add_parser(
        "validate",
        help="check a snapshot directory against every SNAP clause (reads only)",
        description=DESCRIPTION,
    )
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
    v.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 valid, 1 findings, 2 usage or I/O error, 3 internal error; every error is one line
    on stderr. Whatever the snapshot or the signal holds is a finding or a usage error, so an
    exception from the validation itself is a bug (exit 3), never a verdict."""
    try:
        signal = _validate_inputs(args)
    except (UsageError, ValueError, OSError) as e:  # the signal file, or a directory that is none
        return _validate_error(f"error: {e}", EXIT_USAGE)
    try:
        return _validate(args, signal)
    except BrokenPipeError:
        raise  # main() ends quietly
    except OSError as e:  # the snapshot directory itself cannot be listed
        return _validate_error(f"error: {e}", EXIT_USAGE)
    except Exception as e:
        return _validate_error(f"internal error: {type(e).__name__}: {_text_of(e)} (please report)", EXIT_INTERNAL)


def _validate_inputs(args: argparse.Namespace) -> dict[str, Any] | None:
    from pytest_rlrollout.snapshot.validate import load_signal

    for option, path in (("SNAPSHOT", args.snapshot), ("--base", args.base), ("--parent", args.parent)):
        if path is not None and not os.path.isdir(path):
            raise UsageError(f"{option} {path}: not a directory")
    return load_signal(args.signal) if args.signal else None


def _validate(args: argparse.Namespace, signal: dict[str, Any] | None) -> int:
    from pytest_rlrollout.snapshot import untrusted
    from pytest_rlrollout.snapshot.validate import validate

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
    doc = report.as_dict(level)
    hints = _validate_hints(report, args)
    if args.format == "json":
        # JSON escapes what text would have to: ensure_ascii turns every control character and
        # undecodable file name (a lone surrogate) into \uXXXX
        out = json.dumps({**doc, "hints": hints}, indent=2)
    else:
        out = "\n".join([report.text(level), *(untrusted.printable(f"hint: {h}") for h in hints)])
    print_text(out, sys.stdout)
    # one value decides both, so the exit code and the JSON's `valid` cannot disagree
    return EXIT_OK if doc["valid"] else EXIT_FINDINGS


def _validate_error(what: str, code: int) -> int:
    """One line on stderr, whatever `what` holds (a path or a message can hold newlines and
    terminal escapes, or be megabytes long)."""
    from pytest_rlrollout.snapshot import untrusted

    print_text(f"rlrollout validate: {untrusted.brief_text(untrusted.printable(what), 1000)}", sys.stderr)
    return code


def _text_of(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # an exception whose own message fails to build
        return "(no message)"


def _validate_hints(report: Report, args: argparse.Namespace) -> list[str]:
    """What to run next, for the two mistakes whose findings do not say it themselves."""
    hints = []
    snapshot = shlex.quote(str(args.snapshot))
    diff = args.parent is None and (report.kind == "incremental" or _holds_arc2_payloads(args.snapshot))
    if diff:
        # without the parent the diff is judged as a full snapshot (or half-judged), so every
        # U8 payload shows up as a wrong tensor
        hints.append(
            f"{snapshot} holds ARC2 diff payloads (1-D U8 tensors with Adler-32 checksums): "
            f"pass --parent PARENT, the snapshot the diff applies to"
        )
    elif report.of("SNAP-INDEX-2"):
        hints.append(
            f"shards mix layers (as save_pretrained's size-based split does): "
            f"`rlrollout export {snapshot} DST` re-lays the checkpoint one layer per shard"
        )
    return hints


def _holds_arc2_payloads(snapshot: Path) -> bool:
    """Whether every tensor of every safetensors file is an ARC2 payload: 1-D U8 with a decimal
    checksum under its name in `__metadata__` (what `rlrollout delta` writes). Files are read as
    the validator reads them: confined to the snapshot, regular files only, within its bounds."""
    from pytest_rlrollout.snapshot import safetensors_io as st
    from pytest_rlrollout.snapshot.layout import SnapshotDir
    from pytest_rlrollout.snapshot.validate.core import MAX_FILES

    d = SnapshotDir(snapshot)
    files = d.safetensors_files
    if not files or len(files) > MAX_FILES:
        return False
    for name in files:
        if d.unreadable(name) is not None:
            return False
        try:
            header = st.read_header(d.path(name))
        except (OSError, st.HeaderError):
            return False
        if not header.tensors:
            return False
        for tensor, t in header.tensors.items():
            if t.dtype != "U8" or len(t.shape) != 1 or not header.metadata.get(tensor, "").isdigit():
                return False
    return True
