"""`rlrollout soak`: the soak (rollouts on Locust across many swaps, every turn judged) run by
pytest, against the deployment the suite's options name (the bundled reference by default).

The soak's own settings have options of their own here; every other argument goes to pytest, as
with `rlrollout conformance` (--rl-deployment=..., --rl-report=..., -o KEY=VALUE)."""

from __future__ import annotations

import argparse
import importlib.util
import sys

from pytest_rlrollout.cli.exits import EXIT_OK, UsageError, pytest_status
from pytest_rlrollout.cli.stopping import interrupting

# option -> (the ini key it sets, its type, what it is)
OPTIONS = {
    "--seconds": ("rl_soak_seconds", float, "the soak ends after this long (default 600)"),
    "--swaps": ("rl_soak_swaps", int, "... or after this many swaps and `--every` seconds more (default 20)"),
    "--every": ("rl_soak_every", float, "seconds of load before each swap (default 20)"),
    "--users": ("rl_soak_users", int, "rollouts in flight at once, each a session (default 64)"),
    "--workers": ("rl_soak_workers", int, "Locust worker processes on this machine (default 0: one process)"),
    "--remote-workers": (
        "rl_soak_remote_workers",
        int,
        "Locust workers from other machines the master also waits for; it prints the command they run (default 0)",
    ),
    "--turns": ("rl_soak_turns", int, "turns of each rollout (default 4)"),
    "--max-tokens": ("rl_soak_max_tokens", int, "tokens each turn generates at most (default 32)"),
    "--full-every": (
        "rl_soak_full_every",
        int,
        "every n-th swap loads a full snapshot, the others an ARC2 delta (default 5; 0: never)",
    ),
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sk = sub.add_parser(
        "soak", help="soak a deployment: rollouts on Locust across many swaps, judged throughout", add_help=False
    )
    sk.add_argument("pytest_args", nargs=argparse.REMAINDER)
    sk.set_defaults(run=run)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlrollout soak",
        usage="rlrollout soak [--seconds S] [--swaps N] [--every S] [--users N] [--workers N] [--rl-OPTION ...] "
        "[pytest options]",
        description="Simulated agentic rollouts (multi-turn sessions, growing prefixes, streamed with logprobs) "
        "run as Locust users while a trainer swaps snapshots in through the deployment's driver; every turn and "
        "every swap is judged against the contract's clauses, and the verdicts, figures and pictures go to the "
        "suite's report (--rl-report=FILE.json). The deployment options are the conformance suite's "
        "(`rlrollout conformance --help`); by default the bundled reference deployment. Needs the `soak` extra "
        "(pip install 'pytest-rlrollout[soak]').",
        add_help=False,
    )
    for flag, (_, kind, what) in OPTIONS.items():
        p.add_argument(flag, type=kind, help=what)
    p.add_argument(
        "--resets",
        nargs="+",
        choices=["all", "new_session", "none"],
        help="each swap's reset_prompt_cache, in turn (default: all)",
    )
    return p


def soak_help() -> str:
    return _parser().format_help()


def run(args: argparse.Namespace) -> int:
    if args.pytest_args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(soak_help())
        return EXIT_OK
    ours, rest = _parser().parse_known_args(args.pytest_args)
    if importlib.util.find_spec("locust") is None:
        raise UsageError("the soak runs on Locust, which is not installed: pip install 'pytest-rlrollout[soak]'")
    overrides = [
        f"{OPTIONS[flag][0]}={value}"
        for flag in OPTIONS
        if (value := getattr(ours, flag[2:].replace("-", "_"))) is not None
    ]
    if ours.resets:
        overrides.append(f"rl_soak_resets={' '.join(ours.resets)}")
    import pytest

    from pytest_rlrollout.suite.options import CONFORMANCE

    ini = [a for o in overrides for a in ("-o", o)]
    suite = str(CONFORMANCE / "test_soak.py")
    # SIGTERM ends the soak through its teardown, as Ctrl-C does: Locust's processes stopped
    with interrupting():
        code = pytest.main(
            [suite, "-p", "no:cacheprovider", f"--rootdir={CONFORMANCE}", "-o", "rl_soak=true", *ini, *rest]
        )
    return pytest_status(int(code))
