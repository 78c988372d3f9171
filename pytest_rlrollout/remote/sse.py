"""Server-sent events: one incremental splitter for the client and the cassette recorder.

Lines end with `\\n`, `\\r\\n` or `\\r` (a `\\r` at the end of one read may be followed by the
`\\n` of the same line ending in the next); an event ends at a blank line. Every character is
scanned once, so a long line costs linear time however it is split into reads.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Iterator

_EOL = re.compile(r"\r\n|\r|\n")


class SSEDecoder:
    """`feed(bytes)` returns the events completed so far: each event's lines joined by `\\n`.
    Comment-only events (`: keep-alive`) are skipped; an event without its terminating blank
    line when the stream ends is dropped, as the official SDK drops it."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial: list[str] = []  # pieces of the line being read
        self._lines: list[str] = []  # complete lines of the event being read
        self._after_cr = False  # the last read ended with \r: a leading \n belongs to it

    def feed(self, data: bytes) -> list[str]:
        return self._scan(self._utf8.decode(data))

    def close(self) -> list[str]:
        return self._scan(self._utf8.decode(b"", final=True))

    @property
    def unterminated(self) -> bool:
        """Text was left without its terminating blank line (after `close`: the dropped event)."""
        return bool(self._lines) or bool("".join(self._partial).strip())

    def _scan(self, text: str) -> list[str]:
        events: list[str] = []
        start = 1 if self._after_cr and text.startswith("\n") else 0
        if text:
            self._after_cr = False
        while start < len(text):
            m = _EOL.search(text, start)
            if m is None:
                self._partial.append(text[start:])
                break
            self._partial.append(text[start : m.start()])
            line, self._partial = "".join(self._partial), []
            self._after_cr = m.group() == "\r" and m.end() == len(text)
            start = m.end()
            if line:
                self._lines.append(line)
            elif self._lines:
                if not all(x.startswith(":") for x in self._lines):
                    events.append("\n".join(self._lines))
                self._lines = []
        return events


def sse_events(chunks: Iterable[bytes]) -> Iterator[str]:
    """The events of a whole byte stream, each as soon as its blank line arrives."""
    decoder = SSEDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.close()


def event_data(event: str) -> str:
    """The `data:` field of an event (several data lines joined by newlines)."""
    return "\n".join(line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:"))
