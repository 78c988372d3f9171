"""What crosses the wire, counted where the client sends it: an httpx transport that passes every
exchange through and writes down its request, its answer's status and the bytes each way.

What a tool says it sent is not evidence of what it sent; this is (the weight-sync check's cost is
proven with it, and its benchmark weighs a call with it). Bytes are the HTTP/1.1 message as sent
and received: the request line, the status line, every header line and the body, without the
framing of a chunked body."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from pytest_rlrollout.remote.stream import REPLICA_HEADER
from pytest_rlrollout.remote.transport import bounded_transport


@dataclass(frozen=True)
class Crossed:
    """One exchange as it crossed the wire."""

    method: str
    url: str  # scheme://host:port/path, no query
    status: int
    replica: str | None  # the replica the answer names (the contract's header), where it names one
    sent: int  # bytes of the request
    received: int  # bytes of the answer (its body as far as it was read)

    @property
    def path(self) -> str:
        return httpx.URL(self.url).path


def _head(headers: httpx.Headers) -> int:
    return sum(len(k) + len(v) + 4 for k, v in headers.raw) + 2  # "k: v" CRLF each, then CRLF


class _Counted(httpx.SyncByteStream):
    """An answer's body passed through, its bytes counted; written down when it is closed."""

    def __init__(self, inner: httpx.SyncByteStream, done: Crossed, log: CountingTransport):
        self.inner, self.done, self.log, self.received = inner, done, log, 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.received += len(chunk)
            yield chunk

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            d = self.done
            self.log.add(Crossed(d.method, d.url, d.status, d.replica, d.sent, d.received + self.received))


class CountingTransport(httpx.BaseTransport):
    """Forwards to `inner` (default: the deadline-bounded transport a `DeploymentClient` uses) and
    keeps every exchange in `exchanges`, in the order their answers ended; `take()` hands them over
    and starts afresh. Safe to share between threads."""

    def __init__(self, inner: httpx.BaseTransport | None = None):
        self.inner = inner if inner is not None else bounded_transport()
        self._log: list[Crossed] = []
        self._lock = threading.Lock()

    def add(self, crossed: Crossed) -> None:
        with self._lock:
            self._log.append(crossed)

    @property
    def exchanges(self) -> list[Crossed]:
        with self._lock:
            return list(self._log)

    def take(self) -> list[Crossed]:
        """The exchanges so far, and none kept."""
        with self._lock:
            out, self._log = self._log, []
        return out

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        line = len(request.method) + len(request.url.raw_path) + len(" HTTP/1.1\r\n") + 1
        sent = line + _head(request.headers) + len(body)
        response = self.inner.handle_request(request)
        url = str(request.url.copy_with(query=None))
        received = len(f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n") + _head(response.headers)
        done = Crossed(request.method, url, response.status_code, response.headers.get(REPLICA_HEADER), sent, received)
        if not isinstance(response.stream, httpx.SyncByteStream):  # a sync transport answers with a sync stream
            raise TypeError(
                f"{request.method} {request.url.path}: the forwarding transport answered with an async stream"
            )
        counted = _Counted(response.stream, done, self)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=counted,
            extensions=response.extensions,
            request=request,
        )

    def close(self) -> None:
        self.inner.close()
