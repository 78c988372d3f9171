"""Server-sent events: one incremental splitter for the client and the cassette recorder.

Lines end with `\\n`, `\\r\\n` or `\\r` (a `\\r` at the end of one read may be followed by the
`\\n` of the same line ending in the next); an event ends at a blank line. The splitter works
on bytes (no byte of a UTF-8 sequence is a line end) and decodes an event once it is whole:
every byte is scanned once and a line's pieces are joined once, so a long line costs linear
time however it is split into reads, and a line that arrives a byte at a time holds one object
per `BLOCK` pieces, not one per byte. With `max_event`, an event that grows past it is refused
as soon as the read that takes it past arrives, so neither time nor memory follows the sender.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from pytest_rlrollout.remote.limits import LimitExceeded, MiB

_EOL = re.compile(rb"(\r\n|\r|\n)")  # captured: a line's size counts its own line end
BLOCK = 1024  # pieces held before they are joined into one


def amount(n: int) -> str:
    """A byte count as the bounds are written: `16 MiB`, `1,000 bytes`."""
    return f"{n / MiB:g} MiB" if n >= MiB and n % (MiB // 4) == 0 else f"{n:,} bytes"


class _Pieces:
    """Byte strings joined by `sep` once they are all in. Every `BLOCK` pieces are joined into
    one block first, so a pointer per piece is all a piece costs (a byte-long piece is a cached
    object), and each byte is copied twice at most."""

    def __init__(self, sep: bytes = b""):
        self.sep = sep
        self.blocks: list[bytes] = []
        self.pieces: list[bytes] = []

    def add(self, piece: bytes) -> None:
        self.pieces.append(piece)
        if len(self.pieces) >= BLOCK:
            self.blocks.append(self.sep.join(self.pieces))
            self.pieces = []

    def extend(self, pieces: list[bytes]) -> None:
        self.pieces += pieces
        if len(self.pieces) >= BLOCK:
            self.blocks.append(self.sep.join(self.pieces))
            self.pieces = []

    def take(self) -> bytes:
        whole = self.sep.join(self.blocks + self.pieces) if self.blocks else self.sep.join(self.pieces)
        self.blocks, self.pieces = [], []
        return whole

    def __bool__(self) -> bool:
        return bool(self.blocks or self.pieces)

    def blank(self) -> bool:
        return not any(p.strip() for p in self.blocks + self.pieces)


class SSEDecoder:
    """`feed(bytes)` returns the events completed so far: each event's lines joined by `\\n`.
    Comment-only events (`: keep-alive`) are skipped; an event without its terminating blank
    line when the stream ends is dropped, as the official SDK drops it. An event (its lines,
    comments included) longer than `max_event` bytes raises `LimitExceeded`.

    An event that is not UTF-8 is decoded with `errors` (U+FFFD by default; the recorder keeps
    the bytes with `surrogateescape`) and counted in `invalid`: the stream is broken, and the
    client says so rather than letting a verdict read replacement characters as text."""

    def __init__(self, max_event: int | None = None, *, what: str = "", errors: str = "replace") -> None:
        self.max_event, self.what, self.errors = max_event, what, errors  # what: the request, named in a refusal
        self.invalid = 0  # events that held bytes that are not UTF-8
        self._line = _Pieces()  # the line being read
        self._event = _Pieces(b"\n")  # complete lines of the event being read
        self._fields = False  # a line of the event is not a comment
        self._size = 0  # bytes of the event being read, line ends included
        self._after_cr = False  # the last read ended with \r: a leading \n belongs to it

    def feed(self, data: bytes) -> list[str]:
        return self._scan(bytes(data))

    def close(self) -> list[str]:
        return []  # an event is only ever completed by its blank line

    @property
    def unterminated(self) -> bool:
        """Text was left without its terminating blank line (after `close`: the dropped event)."""
        return bool(self._event) or not self._line.blank()

    def _grow(self, n: int) -> None:
        self._size += n
        if self.max_event is not None and self._size > self.max_event:
            pending, self._line, self._event = self._size, _Pieces(), _Pieces(b"\n")  # what was held goes at once
            raise LimitExceeded(
                f"Limits.event = {amount(self.max_event)}",
                f"{self.what + ': ' if self.what else ''}an SSE event passed {self.max_event:,} bytes "
                f"without its blank line ({pending:,} bytes held when it was refused)",
            )

    def _text(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.invalid += 1
            return raw.decode("utf-8", self.errors)

    def _scan(self, data: bytes) -> list[str]:
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]
            if self._size:  # the \r ended a line of the event being read (not its blank line): \r\n is its end
                self._grow(1)
        elif not data:
            return []
        self._after_cr = data.endswith(b"\r")
        parts = _EOL.split(data)  # split in C: a read of many short lines costs one call
        lines, ends, rest = parts[0:-1:2], parts[1::2], parts[-1]
        events: list[str] = []
        if lines:
            first = len(lines[0])  # the bytes of this read in the first line (the rest were counted)
            if self._line:
                self._line.add(lines[0])
                lines[0] = self._line.take()
            if b"" not in lines:  # no event ends in this read: its lines go in at once
                self._grow(len(data) - len(rest))
                self._event.extend(lines)
                self._fields = self._fields or not all(line.startswith(b":") for line in lines)
            else:
                for i, (line, end) in enumerate(zip(lines, ends, strict=True)):
                    events += self._line_ended(line, (len(line) if i else first) + len(end))
        if rest:
            self._grow(len(rest))
            self._line.add(rest)
        return events

    def _line_ended(self, line: bytes, size: int) -> list[str]:
        """Take a whole line (`size` bytes of this read, its line end included); a blank one ends the
        event: [the event] unless it held only comments."""
        self._grow(size if line else 1)  # an event ends at its blank line's first byte, whatever follows
        if line:
            self._event.add(line)
            self._fields = self._fields or not line.startswith(b":")
            return []
        raw, fields = self._event.take(), self._fields
        self._fields, self._size = False, 0
        return [self._text(raw)] if fields else []


def sse_events(chunks: Iterable[bytes], max_event: int | None = None) -> Iterator[str]:
    """The events of a whole byte stream, each as soon as its blank line arrives."""
    decoder = SSEDecoder(max_event)
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.close()


def event_data(event: str) -> str:
    """The `data:` field of an event (several data lines joined by newlines)."""
    return "\n".join(line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:"))
