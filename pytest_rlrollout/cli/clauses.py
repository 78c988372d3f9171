"""`rlrollout clauses`: the contract's clause catalogue as text, JSON or the contract document."""

from __future__ import annotations

import argparse
import json
import sys

from pytest_rlrollout.cli.exits import EXIT_OK, UsageError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("clauses", help="list the contract's clauses (--format md: the contract document)")
    c.add_argument("--area", help="only this area (SNAP, HL, SWAP, CACHE, SESS, VER, R3, INF, NUM)")
    c.add_argument("--format", choices=["text", "json", "md"], default="text")
    c.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pytest_rlrollout.contract import catalogue

    cat = catalogue()
    if args.format == "md":
        if args.area:
            raise UsageError("--format md prints the whole contract; drop --area")
        from pytest_rlrollout.suite.docs import contract_markdown

        sys.stdout.write(contract_markdown())
        return EXIT_OK
    area = args.area.upper() if args.area else None
    if area is not None and area not in cat.areas:
        raise UsageError(f"--area {args.area}: no such area (areas: {', '.join(cat.areas)})")
    chosen = [c for c in cat if area is None or c.area == area]
    if args.format == "json":
        print(json.dumps([c.__dict__ for c in chosen], indent=2))
    else:
        for c in chosen:
            print(f"{c.id:24} {c.level:6} {c.rule}")
    return EXIT_OK
