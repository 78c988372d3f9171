"""Reading a deployment's answers under caps: a body decoded piece by piece (a compressed one
never inflates past the cap at once), at most so many bytes, and the events a stream may take."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from pytest_rlrollout.remote.limits import LimitExceeded, Limits
from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.remote.sse import amount
from pytest_rlrollout.remote.stream import EXCERPT
from pytest_rlrollout.remote.transport import ExchangeFailed

# bytes of a stream decoded at a time: a compressed stream never inflates more at once, and the
# clock is read between pieces (a piece of a million blank lines would keep it waiting)
STREAM_PIECE = 64 * 1024


def decoded(r: httpx.Response, most: int, what: str) -> Iterator[bytes]:
    """The answer's body, decoded, piece by piece as it arrives (a transport that answered from
    memory: in one piece); an inflated piece is at most `most` bytes. The client asks for identity; gzip and deflate are still
    decoded, piece by piece, so a small compressed answer never expands past the caller's cap
    at once; httpx's own decoders would inflate a whole read, whatever it grows to."""
    if r.is_stream_consumed:  # a transport answered from memory (a mock): the body is read already
        yield r.content
        return
    encoding = r.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        yield from r.iter_raw()  # as it arrives: iter_raw(n) would hold pieces back until n bytes came
        return
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise ExchangeFailed(
            f"{what}: the deployment sent a {encoding[:40]!r}-encoded answer, though the client "
            "asked for identity (and decodes gzip and deflate only)"
        )
    inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)  # a gzip or zlib header, either
    try:
        for raw in r.iter_raw():
            data = raw
            while data:
                piece = inflate.decompress(data, most)
                data = inflate.unconsumed_tail
                if piece:
                    yield piece
        if rest := inflate.flush(most):
            yield rest
    except zlib.error as e:
        raise ExchangeFailed(f"{what}: the deployment's {encoding} answer does not decode ({e})") from None


def read_capped(r: httpx.Response, cap: int, what: str, tick: Callable[[int], None] | None = None) -> bytes:
    """An answer's body, decoded, of at most `cap` bytes (`LimitExceeded` past it: a body that
    announces more is refused before a byte is read); `tick` sees each piece's size."""
    bound = f"Limits.body = {amount(cap)}"
    declared = r.headers.get("content-length", "").strip()
    if declared.isascii() and declared.isdigit() and int(declared) > cap:
        raise LimitExceeded(
            bound,
            f"{what}: the answer announces a body of {int(declared):,} bytes (HTTP {r.status_code}, Content-Length)",
        )
    got = bytearray()
    for piece in decoded(r, cap + 1, what):
        got += piece
        if len(got) > cap:
            raise LimitExceeded(bound, f"{what}: the answer's body (HTTP {r.status_code}) passed {cap:,} bytes")
        if tick is not None:
            tick(len(piece))
    return bytes(got)


def answered(r: httpx.Response, body: bytes, key: Secret) -> httpx.Response:
    """A response holding `body` (what `.text` and `.json()` read), the key replaced in it and in
    the headers (a deployment that echoes it back never gets it shown in a verdict's message).
    A decoded body drops its content-encoding, which would have it decoded twice."""
    decoded = r.headers.get("content-encoding", "identity").strip().lower() != "identity"
    dropped = ("content-encoding", "content-length") if decoded else ("content-length",)  # the length changes
    # raw bytes: a header that is not ASCII (httpx decodes it as Latin-1) is passed on as it came
    headers = [(k, key.redact_bytes(v)) for k, v in r.headers.raw if k.decode("latin-1").lower() not in dropped]
    out = httpx.Response(
        r.status_code, headers=headers, content=key.redact_bytes(body), request=r.request, extensions=r.extensions
    )
    with contextlib.suppress(RuntimeError):  # set once the response was closed
        out.elapsed = r.elapsed
    return out


def events_bound(limits: Limits, payload: Any) -> int:
    """The events a stream may take: `limits.events`, or, for a request asking for more tokens
    than that, twice the tokens asked for (a chunk a token, and room for chunks without one), so
    that no stream the suite asked for runs into a bound of its own."""
    asked = 0
    if isinstance(payload, dict):
        sampling = given if isinstance(given := payload.get("sampling_params"), dict) else {}
        for value in (payload.get("max_tokens"), payload.get("max_completion_tokens"), sampling.get("max_tokens")):
            if isinstance(value, int) and not isinstance(value, bool):
                asked = max(asked, value)
    return max(limits.events, 2 * asked + 64)


def events_excerpt(events: list[str]) -> str:
    """The first events, joined, no longer than evidence needs (a stream may hold MBs)."""
    shown: list[str] = []
    for e in events:
        shown.append(e[: 4 * EXCERPT])
        if sum(map(len, shown)) > 2 * EXCERPT:
            break
    return "\n\n".join(shown)
