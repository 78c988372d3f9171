"""The `rlrollout` command: validate, export, delta, apply, make-base, serve, numerics, plan,
conformance, soak, diagnose, cleanup, clauses, matrix.

One module a command (the snapshot tools share one), each holding its sub-parser's `register`
and its `run`; this module assembles the parser and ends every run the same way: a usage error as
one line and exit 2, a closed pipe as 141, Ctrl-C as 130, a stop that hung as one line and exit 3.
Commands import what they run inside `run`, so `rlrollout --help` loads none of it. `main` runs
a command in the caller's process; `program` is the `rlrollout` executable."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from pytest_rlrollout.cli import (
    clauses,
    cleanup,
    conformance,
    diagnose,
    matrix,
    numerics,
    plan,
    serve,
    snapshot_tools,
    soak,
    validate,
)
from pytest_rlrollout.cli.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_FINDINGS,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
)
from pytest_rlrollout.cli.stopping import StopTimedOut

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FINDINGS",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "main",
    "parser",
    "program",
]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlrollout", description="RL-rollout hot-load deployment contract tools")
    sub = p.add_subparsers(dest="command", required=True)
    # in the order `rlrollout --help` lists them
    for command in (
        validate,
        snapshot_tools,
        serve,
        numerics,
        plan,
        conformance,
        soak,
        diagnose,
        cleanup,
        clauses,
        matrix,
    ):
        command.register(sub)
    return p


def program() -> NoReturn:
    """The `rlrollout` executable (its console script and `python -m pytest_rlrollout.cli`): `main`
    as the whole process. A command then need not hand signal handlers back to a caller, and a
    stop that hung ends the process rather than wait at the interpreter's exit for the threads
    that hang (it joins them)."""
    sys.exit(main(program=True))


def main(argv: Sequence[str] | None = None, *, program: bool = False) -> int:
    """Run one command (`argv`: its words, default sys.argv[1:]) and return its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _main(argv, program)
        # flush here, not at interpreter exit, so a closed pipe surfaces inside this handler
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (`| head`). Point stdout at /dev/null so the interpreter's own
        # flush at exit finds nowhere to fail and prints no "Exception ignored" noise.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


# commands that run a pytest session: their own options are theirs (`parse`), every other argument
# goes to pytest untouched (argparse would claim -o, -q, ...)
PYTEST_SESSIONS = {"plan": plan, "diagnose": diagnose}


def _main(argv: list[str], program: bool) -> int:
    if argv[:1] == ["conformance"]:
        if argv[1:2] in (["-h"], ["--help"]):
            sys.stdout.write(conformance.conformance_help())
            return EXIT_OK
        # everything after the word goes to pytest untouched (argparse would claim -q, -n, ...)
        return conformance.run(argparse.Namespace(pytest_args=argv[1:]))
    if argv[:1] and argv[0] in PYTEST_SESSIONS and argv[1:2] not in (["-h"], ["--help"]):
        command = PYTEST_SESSIONS[argv[0]]
        try:
            return command.run(command.parse(argv[1:]))
        except UsageError as e:
            print(f"rlrollout {argv[0]}: error: {e}", file=sys.stderr)
            return EXIT_USAGE
    if argv[:1] == ["soak"]:  # its own options, then everything else to pytest, as above
        try:
            return soak.run(argparse.Namespace(pytest_args=argv[1:]))
        except UsageError as e:
            print(f"rlrollout soak: error: {e}", file=sys.stderr)
            return EXIT_USAGE
    args = parser().parse_args(argv)
    args.program = program
    from pytest_rlrollout.snapshot.arc2 import DeltaError
    from pytest_rlrollout.snapshot.build import SnapshotError

    try:
        return args.run(args)
    except BrokenPipeError:
        raise  # an OSError, but not a failure of the command: main() ends quietly
    except (UsageError, SnapshotError, DeltaError, NotADirectoryError, FileNotFoundError, ValueError, OSError) as e:
        print(f"rlrollout {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except StopTimedOut as e:
        print(f"rlrollout {args.command}: error: {e}", file=sys.stderr, flush=True)
        if program:  # what hangs would hold the interpreter's exit for good: end here
            sys.stdout.flush()
            os._exit(EXIT_INTERNAL)
        return EXIT_INTERNAL
