"""`rlrollout conformance`: the installed conformance suite run by pytest, and its `--help`, which
lists the plugin's options and ini keys."""

from __future__ import annotations

import argparse

from pytest_rlrollout.cli.exits import pytest_status
from pytest_rlrollout.cli.stopping import interrupting


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cf = sub.add_parser(
        "conformance",
        help="run the installed conformance suite (any pytest option, e.g. --rl-deployment=..., -n 2)",
        description="Runs the conformance tests installed with the package. Module names (hot_load, swap, "
        "cache, ...) select modules; every other argument goes to pytest.",
    )
    cf.add_argument("pytest_args", nargs=argparse.REMAINDER)
    cf.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import pytest

    from pytest_rlrollout.suite.options import CONFORMANCE as suite

    modules = {p.stem.removeprefix("test_"): p for p in suite.glob("test_*.py")}
    chosen = [
        str(modules[a.removeprefix("test_").removesuffix(".py")])
        for a in args.pytest_args
        if a.removeprefix("test_").removesuffix(".py") in modules
    ]
    rest = [a for a in args.pytest_args if a.removeprefix("test_").removesuffix(".py") not in modules]
    with interrupting():  # SIGTERM ends the run through its teardown, as Ctrl-C does
        code = pytest.main([*(chosen or [str(suite)]), "-p", "no:cacheprovider", f"--rootdir={suite}", *rest])
    return pytest_status(int(code))


def conformance_help() -> str:
    """`rlrollout conformance --help`: the usage, the plugin's options and its ini keys, from the
    one table of settings the plugin registers (`suite.settings.SETTINGS`)."""
    from pytest_rlrollout.suite.options import CONFORMANCE
    from pytest_rlrollout.suite.settings import SETTINGS, option_arguments

    modules = ", ".join(sorted(p.stem.removeprefix("test_") for p in CONFORMANCE.glob("test_*.py")))
    description = (
        "Runs the conformance suite installed with the package, by default against the bundled reference "
        f"deployment. MODULE selects modules ({modules}); every other argument goes to pytest unchanged "
        "(-n 2, -k EXPR, -x, ...: `pytest --help` lists pytest's own options)."
    )
    p = argparse.ArgumentParser(
        prog="rlrollout conformance",
        usage="rlrollout conformance [MODULE ...] [--rl-OPTION ...] [-o KEY=VALUE ...] [pytest options]",
        description=description,
        add_help=False,
    )
    options = p.add_argument_group("RL-rollout deployment contract")
    for setting in (s for s in SETTINGS if s.option):
        names, kwargs = option_arguments(setting)
        options.add_argument(*names, **kwargs)
    keys = [s for s in SETTINGS if s.ini]
    width = max(len(s.key) for s in keys)
    lines = [f"  {s.key:{width}}  {s.help}" for s in keys]
    return (
        p.format_help()
        + "\nini keys (pytest.ini, [tool.pytest.ini_options], or -o KEY=VALUE for one run; an option beats its key):\n"
        + "\n".join(lines)
        + "\n"
    )
