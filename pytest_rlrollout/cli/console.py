"""Writing to the terminal: text whatever the stream's encoding, and progress counts."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO


def print_text(text: str, stream: TextIO) -> None:
    """`text` on `stream`, a character its encoding lacks (an ASCII terminal, a name in é) shown
    as its escape rather than failing the command."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding), file=stream)


def progress(what: str) -> Callable[[int, int], None]:
    """`what i/n` on stderr: rewritten in place on a terminal, a line each otherwise (a log)."""
    tty = sys.stderr.isatty()

    def show(i: int, n: int) -> None:
        if tty:
            print(f"\r{what} {i}/{n}", end="\n" if i == n else "", file=sys.stderr, flush=True)
        else:
            print(f"{what} {i}/{n}", file=sys.stderr, flush=True)

    return show
