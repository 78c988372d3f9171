"""`rlrollout diagnose`: where a gap between the trainer's logprobs and the deployment's comes
from. Given what the trainer believes the deployment serves (`--snapshot DIR`, scored here, or its
own numbers, `--expected FILE`), each cause is measured on its own: the weights per replica, the
prompt cache, batching, the decode path; what remains is the numerics of the served precision.

It takes the conformance command's deployment options and reaches the deployment as a conformance
run does (the bundled reference deployment when none is named; a live one; a recording): a pytest
session runs the shipped module `conformance/diagnose.py`, which no conformance run collects, with
this command's plugin (`suite.diagnosing`), which brings the diagnosis back here. It prints the
table, writes `--json PATH` and, with `--rl-report`, the report's diagnosis section and picture.
Exit 0: no cause but numerics past its threshold; 1: a cause other than numerics crosses its
threshold (each named); 2: a usage error, or the deployment could not be diagnosed."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import NoReturn

from pytest_rlrollout.cli.exits import EXIT_FINDINGS, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UsageError, pytest_status
from pytest_rlrollout.cli.stopping import interrupting

PROG = "rlrollout diagnose"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "diagnose",
        help="where a gap between the trainer's logprobs and the deployment's comes from: weights (per replica), "
        "prompt cache, batching, decode path or numerics (takes `conformance`'s deployment options)",
        description="Measures the gap between what the trainer believes the deployment serves and what it serves, "
        "and attributes it: the weights (every replica scores the canary fresh, uncached and alone: which replica "
        "differs, and what its label says), the prompt cache (the canary continued through the shared cache "
        "against the same under an unused isolation key), batching (alone against beside concurrent streams), the decode "
        "path (logprobs reported while decoding against the echo of the same tokens), and what remains (numerics "
        "of the served precision, never blamed). It sends only completions (the canary's prefix stays in the shared prompt cache). The deployment options are "
        "`rlrollout conformance`'s (--rl-deployment, --rl-base-url, --rl-engine, --rl-fleet-urls, "
        "--rl-served-dtype, -o KEY=VALUE, ...; by default the bundled reference deployment); --rl-report=FILE.json "
        "writes the report with a diagnosis section and its picture. Exit 0: nothing past its threshold but "
        "numerics; 1: a cause crosses its threshold; 2: usage error, or the deployment could not be diagnosed.",
    )
    _own_options(p)
    p.add_argument("pytest_args", nargs=argparse.REMAINDER)
    p.set_defaults(run=run)


def _own_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--snapshot",
        type=Path,
        metavar="DIR",
        help="the snapshot the trainer believes is served: the canary is scored here by a local forward pass of it "
        "(float32, the run's rl_scorer)",
    )
    p.add_argument(
        "--expected",
        type=Path,
        metavar="FILE",
        help='the trainer\'s own logprobs of its canary, as `Expected.write` writes them ("format": '
        '"rlrollout-expected/1", "tokens", "logprobs", "label")',
    )
    p.add_argument(
        "--json", type=Path, metavar="PATH", help="also write the diagnosis here (schemas/diagnosis.schema.json)"
    )


class _Own(argparse.ArgumentParser):
    """The command's own options: what is wrong with them is a usage error, said once."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def parse(argv: list[str]) -> argparse.Namespace:
    """Its own options (--snapshot, --expected, --json) wherever they are; everything else goes to
    pytest untouched (argparse would claim -o, -q, ...)."""
    own = _Own(prog=PROG, add_help=False)
    _own_options(own)
    args, rest = own.parse_known_args(argv)
    args.pytest_args = rest
    return args


def run(args: argparse.Namespace) -> int:
    import pytest

    from pytest_rlrollout.runs.diagnose import DiagnoseError, Expected
    from pytest_rlrollout.suite.diagnosing import MODULE, Diagnosing
    from pytest_rlrollout.suite.options import CONFORMANCE

    if args.snapshot is None and args.expected is None:
        raise UsageError(
            "what does the trainer believe is served? give --snapshot DIR (scored here) or --expected FILE "
            "(its own logprobs of the canary)"
        )
    if args.snapshot is not None and args.expected is not None:
        raise UsageError("give --snapshot DIR or --expected FILE, not both: the trainer's numbers come from one")
    if any(a in ("-n", "--numprocesses") or a.startswith(("-n", "--numprocesses=")) for a in args.pytest_args):
        raise UsageError("rlrollout diagnose runs in one process: drop -n")
    expected = None
    if args.expected is not None:
        try:
            expected = Expected.from_file(args.expected)
        except DiagnoseError as e:
            raise UsageError(f"--expected {e}") from None
    elif not args.snapshot.is_dir():
        raise UsageError(f"--snapshot {args.snapshot}: not a directory")
    elif not (args.snapshot / "config.json").is_file():
        raise UsageError(f"--snapshot {args.snapshot}: no config.json, not a snapshot directory")

    plugin = Diagnosing(snapshot=args.snapshot, expected=expected, tell=lambda line: print(line, file=sys.stderr))
    session = [
        str(CONFORMANCE / MODULE),
        "-p",
        "no:cacheprovider",
        f"--rootdir={CONFORMANCE}",
        "-q",
        "--capture=no",  # what the diagnosis measures, said as it begins (on stderr)
        *args.pytest_args,
    ]
    said = io.StringIO()
    with interrupting(), contextlib.redirect_stdout(said):  # pytest's lines: shown when there is no diagnosis
        code = pytest_status(int(pytest.main(session, plugins=[plugin])))
    if code == EXIT_INTERRUPTED:
        return code
    diagnosis = plugin.diagnosis
    if diagnosis is None:
        if plugin.error is None:
            sys.stderr.write(said.getvalue())
        why = plugin.error or f"the session ended before a diagnosis (pytest exited {code}: its output is above)"
        print(f"{PROG}: error: {why}", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(diagnosis.lines()))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(diagnosis.as_dict(), indent=1) + "\n")
    if plugin.report is not None:
        from pytest_rlrollout.suite.report.files import paths

        print("report: " + ", ".join(map(str, paths(plugin.report))))
    return EXIT_FINDINGS if diagnosis.blamed else EXIT_OK
