"""`rlrollout plan`: what a conformance run would load into the deployment, before it loads
anything. It takes the conformance command's arguments, asks the deployment read-only what it
serves and offers, prices every state-changing test's loads on the run's base and bucket
(`-o rl_plan=PATH`), and prints the plan: each test with its swaps and bytes, the totals, and the
wall time at the swap time `rl_swap_seconds` states. It sends no state-changing request."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

from pytest_rlrollout.cli.exits import EXIT_OK, UsageError, pytest_status
from pytest_rlrollout.cli.stopping import interrupting


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="what a conformance run would load (swaps, bytes, time), asking the deployment nothing that "
        "changes it (takes `conformance`'s arguments)",
        description="Plans a conformance run: every test that would change the deployment, the loads it would "
        "make (full, ARC2, LoRA, copy inside the bucket, reload), the bytes it would upload, copy and write, and "
        "the totals. Arguments are `rlrollout conformance`'s (--rl-deployment, --rl-bucket-url, "
        "--rl-base-snapshot, -o rl_profile=core, -o rl_max_swaps=N, -o rl_swap_seconds=S, ...).",
    )
    _own_options(p)
    p.add_argument("pytest_args", nargs=argparse.REMAINDER)
    p.set_defaults(run=run)


def _own_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("text", "json"), default="text", help="how to print the plan (default text)")
    p.add_argument("--output", type=Path, metavar="PATH", help="also write the plan here as JSON")


def parse(argv: list[str]) -> argparse.Namespace:
    """Its own options (--format, --output) wherever they are; everything else goes to pytest
    untouched (argparse would claim -k, -o, -q, ...)."""
    own = argparse.ArgumentParser(prog="rlrollout plan", add_help=False)
    _own_options(own)
    try:
        args, rest = own.parse_known_args(argv)
    except SystemExit:  # argparse said what is wrong on stderr
        raise UsageError("--format is text or json; --output takes a path") from None
    args.pytest_args = rest
    return args


def run(args: argparse.Namespace) -> int:
    import pytest

    from pytest_rlrollout.suite.options import CONFORMANCE as suite
    from pytest_rlrollout.suite.planning import plan_lines

    if any(a.startswith("rl_plan=") for a in args.pytest_args):
        raise UsageError("rlrollout plan sets rl_plan itself: give --output PATH to keep the plan")
    if any(a in ("-n", "--numprocesses") or a.startswith(("-n", "--numprocesses=")) for a in args.pytest_args):
        raise UsageError("rlrollout plan plans in one process: drop -n")
    with tempfile.TemporaryDirectory(prefix="rl-plan-") as tmp:
        path = args.output or Path(tmp) / "plan.json"
        said = io.StringIO()
        with interrupting(), contextlib.redirect_stdout(said):  # pytest's lines; shown when the plan fails
            code = pytest.main(
                [
                    str(suite),
                    "-p",
                    "no:cacheprovider",
                    f"--rootdir={suite}",
                    "-q",
                    "--no-summary",
                    "-o",
                    f"rl_plan={path}",
                    *args.pytest_args,
                ]
            )
        if int(code) != 0 or not path.is_file():
            sys.stderr.write(said.getvalue())
            return pytest_status(int(code)) or 1
        doc = json.loads(path.read_text())
    print(json.dumps(doc, indent=1) if args.format == "json" else "\n".join(plan_lines(doc)))
    return EXIT_OK
