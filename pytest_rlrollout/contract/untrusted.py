"""Untrusted names in messages: what the validator and the cassette loader say about a file
they refuse to read, and how they print a name an exporter or a recording chose."""

from __future__ import annotations

import stat

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symlink"),
)


def kind_of(mode: int) -> str:
    """What a non-regular file is, for messages."""
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def printable(text: str) -> str:
    """`text` with every character a terminal would act on, or that could pass for another line
    (controls, escapes, line and paragraph separators, bidi overrides, lone surrogates from
    undecodable file names), shown as a Python escape such as \\n, \\x1b or \\udcff."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
