"""`rlrollout conformance`: the installed conformance suite run by pytest, and its `--help`, which
lists the plugin's own `--rl-*` options."""

from __future__ import annotations

import argparse
from typing import Any


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
    chosen = [str(modules[a.removeprefix("test_").removesuffix(".py")]) for a in args.pytest_args
              if a.removeprefix("test_").removesuffix(".py") in modules]  # fmt: skip
    rest = [a for a in args.pytest_args if a.removeprefix("test_").removesuffix(".py") not in modules]
    return int(pytest.main([*(chosen or [str(suite)]), "-p", "no:cacheprovider", f"--rootdir={suite}", *rest]))


class _OptionTable:
    """Stands in for pytest's Parser when `add_options` runs, and puts each option it registers on
    an argparse parser instead: the `--rl-*` help comes from the plugin's one table of options."""

    def __init__(self, parser: argparse.ArgumentParser):
        self._parser = parser
        self._groups: dict[str, Any] = {}
        self.ini: list[tuple[str, str]] = []

    def getgroup(self, name: str, description: str = "", after: str | None = None) -> _OptionTable._Group:
        if name not in self._groups:
            self._groups[name] = self._parser.add_argument_group(description or name)
        return _OptionTable._Group(self._groups[name])

    def addoption(self, *opts: str, **attrs: Any) -> None:
        self.getgroup("custom options").addoption(*opts, **attrs)

    def addini(self, name: str, help: str, *args: Any, **kwargs: Any) -> None:
        self.ini.append((name, help))

    class _Group:
        def __init__(self, group: Any):
            self._group = group

        def addoption(self, *opts: str, **attrs: Any) -> None:
            self._group.add_argument(*opts, **attrs)


def conformance_help() -> str:
    """`rlrollout conformance --help`: the usage and every `--rl-*` option the plugin registers."""
    from pytest_rlrollout.suite.options import CONFORMANCE, add_options

    modules = ", ".join(sorted(p.stem.removeprefix("test_") for p in CONFORMANCE.glob("test_*.py")))
    description = (
        "Runs the conformance suite installed with the package, by default against the bundled reference "
        f"deployment. MODULE selects modules ({modules}); every other argument goes to pytest unchanged "
        "(-n 2, -k EXPR, -x, ...: `pytest --help` lists pytest's own options)."
    )
    p = argparse.ArgumentParser(
        prog="rlrollout conformance",
        usage="rlrollout conformance [MODULE ...] [--rl-OPTION ...] [pytest options]",
        description=description,
        add_help=False,
    )
    table = _OptionTable(p)
    add_options(table)  # type: ignore[arg-type]  # duck-typed: getgroup/addoption/addini
    text = p.format_help()
    if table.ini:
        width = max(len(name) for name, _ in table.ini)
        lines = [f"  {name:{width}}  {help_}" for name, help_ in table.ini]
        text += "\nini-file settings (pytest.ini, [tool.pytest.ini_options]):\n" + "\n".join(lines) + "\n"
    return text
