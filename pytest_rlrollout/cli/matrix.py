"""`rlrollout matrix`: clause x engine from the suite's JSON reports, as Markdown and HTML."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_rlrollout.cli.exits import EXIT_OK, UsageError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mx = sub.add_parser(
        "matrix",
        help="render clause x engine from the suite's reports (--rl-report JSON files)",
        description="One column per report (engine, version, the server flags its answers showed, "
        "date, how it was run); one row per clause, headed by area; totals per column. Reports "
        "judged by different contract versions are refused.",
    )
    mx.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json")
    mx.add_argument(
        "--out", type=Path, metavar="STEM", help="write STEM.md and STEM.html (default: Markdown on stdout)"
    )
    mx.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pytest_rlrollout.suite.matrix import MatrixError, html, load, markdown

    try:  # the reports' evidence linked from where the page is written
        columns = load(args.reports, args.out.parent if args.out is not None else None)
    except MatrixError as e:
        raise UsageError(str(e)) from None
    if args.out is None:
        sys.stdout.write(markdown(columns))
        return EXIT_OK
    for suffix, text in ((".md", markdown(columns)), (".html", html(columns))):
        path = args.out.with_name(args.out.name + suffix)
        path.write_text(text)
        print(f"wrote {path}")
    return EXIT_OK
