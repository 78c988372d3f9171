"""The deadline-bounded transport: every connect, read and write of an exchange ends by the
exchange's end (`Clock`), and a transport that fails is `ExchangeFailed`, naming what broke.

httpx's read timeout starts afresh with each read, so a server sending a byte a second would
never meet it; the network backend here cuts every read and write to the time the exchange
the calling thread is in has left."""

from __future__ import annotations

import functools
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from pytest_rlrollout.remote.limits import LimitExceeded

SLACK = 0.05  # seconds: a read timeout this close to the exchange's end is the end
WRITE_PIECE = 64 * 1024  # bytes sent per write, each bounded by the time left
# what was under way when an exchange's time was up, as its message says it
NO_ANSWER, REQUEST_REFUSED = "no answer came", "the deployment took no more of the request"
BODY_ARRIVING, STREAM_SENDING = "the answer's body was still arriving", "the stream was still sending"
REASON = 300  # characters of a transport error's own message kept in ours


class ExchangeFailed(httpx.TransportError):
    """The transport failed: the deployment could not be reached, broke the connection, or
    answered with something that is not HTTP (malformed or oversized headers, broken chunks).
    The message names the request, what the deployment did and the transport's own error.
    An `httpx.TransportError`, so `except httpx.HTTPError` still catches it."""


@dataclass
class Clock:
    """The time one exchange may take (monotonic `end`, set by `bound`) and what it got so far,
    for the message when the time is up."""

    what: str  # "POST /inference/v1/completions"
    start: float
    end: float
    bound: str
    doing: str = NO_ANSWER  # what was under way, as the message says it
    received: int = 0  # bytes of the answer's body so far
    last: float = 0.0  # when the last bytes arrived
    progress: Callable[[], str] = lambda: ""

    def left(self) -> float:
        return self.end - time.monotonic()

    def timeout(self, read: float | None) -> httpx.Timeout:
        """httpx's timeouts for this exchange: none longer than the time left (the network
        backend bounds each read again by what is left when it starts)."""
        left = max(self.left(), 0.001)
        return httpx.Timeout(left if read is None else min(read, left))

    def tick(self, n: int) -> None:
        """`n` more bytes arrived; past the end: `LimitExceeded`."""
        self.received += n
        self.last = time.monotonic()
        if self.last >= self.end:
            raise self.over()

    def over(self) -> LimitExceeded:
        now = time.monotonic()
        detail = ", ".join(x for x in (self.progress(), f"{self.received:,} bytes" if self.received else "") if x)
        if self.last and now - self.last >= 1:
            detail += f"; nothing arrived in the last {now - self.last:.0f} s"
        elif not self.last and self.doing in (BODY_ARRIVING, STREAM_SENDING):
            detail += "; no byte of the body arrived"
        return LimitExceeded(
            self.bound,
            f"{self.what}: {self.doing} after {self.end - self.start:.3g} s" + (f": {detail}" if detail else ""),
            silent=self.doing == NO_ANSWER,
        )


EXCHANGE = threading.local()  # .clock: the exchange this thread is in (the network backend reads it)


def _left(timeout: float | None, late: type[Exception]) -> float | None:
    """`timeout` cut to the time the current exchange has left; `late` once none is left."""
    clock: Clock | None = getattr(EXCHANGE, "clock", None)
    if clock is None:
        return timeout
    left = clock.left()
    if left <= 0:
        raise late("the exchange's time is up")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the current exchange's end. httpx's read
    timeout starts afresh with each read, so a server sending a byte a second would never meet
    it; cut to the time left, a trickle or a silence ends at the end."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            for i in range(0, len(buffer), WRITE_PIECE):  # a peer that reads slowly meets the end too
                self._inner.write(buffer[i : i + WRITE_PIECE], _left(timeout, httpcore.WriteTimeout))
        except httpcore.WriteTimeout:
            clock: Clock | None = getattr(EXCHANGE, "clock", None)
            if clock is not None:  # what the message says the deployment did
                clock.doing = REQUEST_REFUSED
            raise

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        return _DeadlineStream(
            self._inner.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout))
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend):
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def put_deadline(transport: httpx.BaseTransport | None) -> None:
    """Put the deadline under an httpx transport's connections. httpx offers no public way to
    give its transport a network backend: this reaches into its httpcore pool, and leaves any
    other transport alone (its answer is still checked against the clock between reads)."""
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if isinstance(backend, httpcore.NetworkBackend) and not isinstance(backend, _DeadlineBackend):
        pool._network_backend = _DeadlineBackend(backend)  # type: ignore[union-attr]


def bounded_transport() -> httpx.HTTPTransport:
    """An HTTP transport whose connects, reads and writes end by the end of the exchange the
    calling thread is in (`DeploymentClient` sets it; the recorder forwards through this)."""
    transport = httpx.HTTPTransport()
    put_deadline(transport)
    return transport


FAILED = (  # what the deployment did, by the transport's error (the first that matches)
    (httpx.ConnectTimeout, "could not be reached within the connect timeout"),
    (httpx.ConnectError, "could not be reached"),
    (httpx.ReadTimeout, "sent nothing for a whole read timeout"),
    (httpx.WriteTimeout, "took nothing of the request for a whole write timeout"),
    (httpx.PoolTimeout, "left no connection free within the pool timeout"),
    (httpx.RemoteProtocolError, "answered with broken HTTP (malformed or oversized headers or chunks, or cut short)"),
    (httpx.LocalProtocolError, "could not be sent the request as HTTP"),
    (httpx.ReadError, "broke the connection while answering"),
    (httpx.WriteError, "broke the connection while the request was sent"),
    (httpx.DecodingError, "sent a body whose content-encoding does not decode"),
    (httpx.TooManyRedirects, "redirected too many times"),
)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR as the
    process started with), made once per process: making one loads the CA bundle, 70 ms of CPU,
    and every conformance run opens a client (the mutation matrix opens hundreds)."""
    return httpx.create_ssl_context()
