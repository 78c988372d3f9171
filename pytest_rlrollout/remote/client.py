"""A client for any hot-load deployment (the reference one, or a live one at a plain URL): the
hot-load control API, status waits with per-replica progress, the ledger, capability discovery,
and completions parsed into what the contract talks about (`Stream`).

The deployment under test may be hostile or broken, so every exchange is bounded (`Limits`):
its time (a stream included, and a per-test `deadline` on top), the bytes of a body, of an SSE
event and of a stream, and the events of a stream. Past a bound: `LimitExceeded`, naming the
bound and what the deployment did. A transport that fails: `ExchangeFailed`, naming the
request and what broke. The key never shows (see `secret`).
"""

from __future__ import annotations

import collections
import contextlib
import enum
import functools
import json
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx

from pytest_rlrollout.engines import DEFAULT, Engine, spec
from pytest_rlrollout.remote.limits import LOCAL_LIMITS, LimitExceeded, Limits
from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.remote.sse import SSEDecoder, amount, event_data
from pytest_rlrollout.remote.stream import (
    CONTRACT_READING,
    EXCERPT,
    Exchange,
    Reading,
    Stream,
    as_object,
    json_object,
    parsed_size,
)

BUSY_STAGES = ("pending", "downloading", "loading", "swapping", "draining")
FIRST_POLL = 0.01  # waits poll at once, then back off to their interval
SLACK = 0.05  # seconds: a read timeout this close to the exchange's end is the end
WRITE_PIECE = 64 * 1024  # bytes sent per write, each bounded by the time left
# bytes of a stream decoded at a time: a compressed stream never inflates more at once, and the
# clock is read between pieces (a piece of a million blank lines would keep it waiting)
STREAM_PIECE = 64 * 1024
# what was under way when an exchange's time was up, as its message says it
NO_ANSWER, REQUEST_REFUSED = "no answer came", "the deployment took no more of the request"
BODY_ARRIVING, STREAM_SENDING = "the answer's body was still arriving", "the stream was still sending"
REASON = 300  # characters of a transport error's own message kept in ours


@dataclass(frozen=True)
class Target:
    """Where a deployment is and what it is called. The key is a `Secret`: it never shows.

    A Fireworks hot-load deployment has a name (accounts/<a>/deployments/<d>), which is also the
    `model` of its inference requests; a plain OpenAI-compatible server needs none and is asked
    for `model` by name."""

    deployment: str | None  # accounts/<a>/deployments/<d>
    base_url: str  # the API base (control plane and hot-load API)
    model: str  # the model the deployment serves, for fireworks-model
    api_key: Secret = field(repr=False)
    inference_url: str = ""  # as given; empty: see `inference_base`
    engine: Engine = DEFAULT
    # a control plane of its own (CoreWeave's hot-load API), with a key of its own; empty: the base URL and key
    control_url: str = ""
    control_key: Secret | None = field(default=None, repr=False)
    # the engines of a fleet with no gateway, which the suite fans out to itself (rl_fleet_urls);
    # base_url is then the first of them
    members: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if spec(self.engine).names == "path" and not _is_deployment_name(self.deployment):
            raise ValueError(f"{self.deployment!r} is not accounts/<account>/deployments/<deployment>")
        if not isinstance(self.api_key, Secret):
            object.__setattr__(self, "api_key", Secret(self.api_key))
        if self.control_key is not None and not isinstance(self.control_key, Secret):
            object.__setattr__(self, "control_key", Secret(self.control_key))

    @property
    def inference_base(self) -> str:
        """Where /v1/completions lives: as given, else base URL + /inference (Fireworks) or the
        base URL itself (an OpenAI-compatible server)."""
        base = self.base_url.rstrip("/")
        return (self.inference_url or base + spec(self.engine).inference_prefix).rstrip("/")

    @property
    def control_base(self) -> str:
        """Where the control plane lives: as given, else the base URL."""
        return (self.control_url or self.base_url).rstrip("/")

    @property
    def name(self) -> str:
        """What to call the deployment in reports: its name, else the model at its URL."""
        return self.deployment or f"{self.model} at {self.base_url}"

    @property
    def by_name(self) -> bool:
        """Whether requests name the deployment (Fireworks: its name is the inference `model` and
        a header); a CoreWeave deployment's UUID names it on the hot-load API only."""
        return spec(self.engine).model_is_name and self.deployment is not None

    @property
    def body_model(self) -> str:
        """The `model` of an inference request: the deployment's name on Fireworks (what the
        official SDK sends), the served model's name on an OpenAI-compatible server."""
        return self.deployment if self.by_name and self.deployment else self.model

    @property
    def account(self) -> str:
        return self._parts[1]

    @property
    def deployment_id(self) -> str:
        return self._parts[3]

    @property
    def _parts(self) -> list[str]:
        if self.deployment is None:
            raise ValueError(f"{self.name} has no deployment name (an {self.engine} server)")
        return self.deployment.split("/")


def _is_deployment_name(name: str | None) -> bool:
    parts = (name or "").split("/")
    return len(parts) == 4 and parts[0] == "accounts" and parts[2] == "deployments" and all(parts)


class WaitEnd(enum.Enum):
    """How a wait for a snapshot ended; verdicts branch on this, never on the message's words."""

    SERVED = "served"  # every replica serves it
    UNREADABLE = "unreadable"  # the status answered 200 but its replicas cannot be read (HL-GET-1)
    FAILED = "failed"  # a replica reported stage 'error' for it
    STALLED = "stalled"  # some replicas serve it and none is loading any more (a rollout that stopped)
    TIMED_OUT = "timed out"  # not served everywhere by the deadline


@dataclass(frozen=True)
class Waited:
    """How a wait for a snapshot ended (`end`), after how long, the replicas as last read, and
    what to tell a person when it was not served (`error`)."""

    end: WaitEnd
    seconds: float
    replicas: list[dict[str, Any]]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.end is WaitEnd.SERVED


class ExchangeFailed(httpx.TransportError):
    """The transport failed: the deployment could not be reached, broke the connection, or
    answered with something that is not HTTP (malformed or oversized headers, broken chunks).
    The message names the request, what the deployment did and the transport's own error.
    An `httpx.TransportError`, so `except httpx.HTTPError` still catches it."""


@dataclass
class _Clock:
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


_EXCHANGE = threading.local()  # .clock: the exchange this thread is in (the network backend reads it)


def _left(timeout: float | None, late: type[Exception]) -> float | None:
    """`timeout` cut to the time the current exchange has left; `late` once none is left."""
    clock: _Clock | None = getattr(_EXCHANGE, "clock", None)
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
            clock: _Clock | None = getattr(_EXCHANGE, "clock", None)
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


def _bound(transport: httpx.BaseTransport | None) -> None:
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
    _bound(transport)
    return transport


_FAILED = (  # what the deployment did, by the transport's error (the first that matches)
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


def _decoded(r: httpx.Response, most: int, what: str) -> Iterator[bytes]:
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
    for piece in _decoded(r, cap + 1, what):
        got += piece
        if len(got) > cap:
            raise LimitExceeded(bound, f"{what}: the answer's body (HTTP {r.status_code}) passed {cap:,} bytes")
        if tick is not None:
            tick(len(piece))
    return bytes(got)


def _answered(r: httpx.Response, body: bytes, key: Secret) -> httpx.Response:
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
        sampling = payload.get("sampling_params") if isinstance(payload.get("sampling_params"), dict) else {}
        for value in (payload.get("max_tokens"), payload.get("max_completion_tokens"), sampling.get("max_tokens")):
            if isinstance(value, int) and not isinstance(value, bool):
                asked = max(asked, value)
    return max(limits.events, 2 * asked + 64)


def _events_excerpt(events: list[str]) -> str:
    """The first events, joined, no longer than evidence needs (a stream may hold MBs)."""
    shown: list[str] = []
    for e in events:
        shown.append(e[: 4 * EXCERPT])
        if sum(map(len, shown)) > 2 * EXCERPT:
            break
    return "\n\n".join(shown)


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR as the
    process started with), made once per process: making one loads the CA bundle, 70 ms of CPU,
    and every conformance run opens a client (the mutation matrix opens hundreds)."""
    return httpx.create_ssl_context()


class DeploymentClient:
    """The deployment's APIs, every exchange within `limits` (LOCAL_LIMITS by default).

    `deadline` (a `time.monotonic()` value, or None) ends every exchange by then as well: the
    per-test deadline the suite sets; an exchange gets min(`limits.exchange`, the time left).
    `timeout` is httpx's per-read timeout."""

    def __init__(
        self,
        target: Target,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        limits: Limits = LOCAL_LIMITS,
    ):
        self.target, self.transport, self.timeout, self.limits = target, transport, timeout, limits
        self.deadline: float | None = None
        # identity: a compressed answer is never inflated by httpx (see `_decoded`)
        self.http = httpx.Client(
            timeout=timeout, transport=transport, headers={"Accept-Encoding": "identity"}, verify=_tls()
        )
        for t in (self.http._transport, *self.http._mounts.values()):  # env proxies get mounts of their own
            _bound(t)
        # what was asked and answered, newest last: the evidence a failed verdict shows
        self.exchanges: collections.deque[Exchange] = collections.deque(maxlen=32)

    @contextlib.contextmanager
    def scoped(self, deadline: float | None) -> Iterator[collections.deque[Exchange]]:
        """One test's use of the client: exchanges of its own (its evidence) and its deadline; the
        client's are put back after it."""
        before = self.exchanges, self.deadline
        self.exchanges, self.deadline = collections.deque(maxlen=before[0].maxlen), deadline
        try:
            yield self.exchanges
        finally:
            self.exchanges, self.deadline = before

    @contextlib.contextmanager
    def held(self, seconds: float) -> Iterator[None]:
        """Exchanges this thread makes meanwhile may be held silent for up to `seconds` (a stream
        a swap pauses: vLLM's pause keeps it for as long as the reload takes): each read may wait
        that long, and the exchange may take that much longer. Slow is not wrong; a bound of the
        suite's sized for an answer that is not held would cut such a stream for the swap's time."""
        before = getattr(_EXCHANGE, "held", None)
        _EXCHANGE.held = seconds
        try:
            yield
        finally:
            _EXCHANGE.held = before

    def mark(self, name: str) -> float:
        """The time now (monotonic seconds); when recording or replaying, on the cassette's
        timeline, so verdicts about timing are the same in replay."""
        mark = getattr(self.transport, "mark", None)
        return mark(name) if mark is not None else time.monotonic()

    def decide(self, name: str, live: bool) -> bool:
        """`live`, a decision made on the live clock (one more stream while a swap is under
        way); when recording, written down under `name` (each name once), and when replaying,
        what the recording decided: the replay sends what the recording sent."""
        decide = getattr(self.transport, "decide", None)
        return decide(name, live) if decide is not None else live

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> DeploymentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------- bounded exchanges

    @contextlib.contextmanager
    def _exchange(self, method: str, url: str, wait: float | None = None) -> Iterator[_Clock]:
        """The clock of one exchange, which the network backend reads for this thread: `wait`
        seconds (a request answered once a load is done) when longer than Limits.exchange. Nested
        in another exchange (a request made from `on_chunk`), it ends no later than the outer one."""
        now = time.monotonic()
        what = f"{method} {httpx.URL(url).path}"
        held = getattr(_EXCHANGE, "held", None)
        if held is not None:  # a stream a swap may hold silent: the swap's time on top of its own
            wait = self.limits.exchange + held if wait is None else max(wait, self.limits.exchange + held)
        if wait is not None and wait > self.limits.exchange:
            clock = _Clock(what, now, now + wait, f"the swap timeout ({wait:g} s)")
        else:
            clock = _Clock(what, now, now + self.limits.exchange, f"Limits.exchange = {self.limits.exchange:g} s")
        if self.deadline is not None and self.deadline < clock.end:
            clock.end, clock.bound = self.deadline, "the test's deadline"
            if clock.end <= now:
                raise LimitExceeded(
                    clock.bound, f"{what} was not sent: the test's time was up {now - clock.end:.1f} s ago"
                )
        outer: _Clock | None = getattr(_EXCHANGE, "clock", None)
        if outer is not None and outer.end < clock.end:
            clock.end, clock.bound = outer.end, outer.bound
        _EXCHANGE.clock = clock
        try:
            yield clock
        finally:
            _EXCHANGE.clock = outer

    def _failure(self, e: httpx.HTTPError, clock: _Clock) -> Exception:
        """What a transport error means: the exchange's time was up (`LimitExceeded`), or the
        transport failed (`ExchangeFailed` naming the request and what the deployment did)."""
        if isinstance(e, ExchangeFailed):
            return e
        if isinstance(e, httpx.TimeoutException) and clock.left() <= SLACK:
            return clock.over()
        did = next((text for kind, text in _FAILED if isinstance(e, kind)), "failed")
        reason = self.target.api_key.excerpt(str(e) or "no detail", REASON)
        failure = ExchangeFailed(f"{clock.what}: the deployment {did} ({type(e).__name__}: {reason})")
        with contextlib.suppress(RuntimeError):  # an error raised before its request was built has none
            failure.request = e.request
        return failure

    def _body(self, r: httpx.Response, clock: _Clock) -> bytes:
        """The answer's body, at most `limits.body` bytes, within the exchange's time, and no
        heavier once parsed than `limits.memory` (weighed before anyone parses it)."""
        clock.doing = BODY_ARRIVING
        body = read_capped(r, self.limits.body, clock.what, clock.tick)
        if (weight := parsed_size(body)) > self.limits.memory:
            raise LimitExceeded(
                f"Limits.memory = {amount(self.limits.memory)}",
                f"{clock.what}: the answer's body (HTTP {r.status_code}, {len(body):,} bytes) would "
                f"take about {weight / 2**20:,.0f} MiB in memory once parsed",
            )
        return body

    def request(self, method: str, url: str, *, wait: float | None = None, **kwargs: Any) -> httpx.Response:
        """Send a request and read the answer, writing the exchange down (secrets left out). The
        body is read to at most `limits.body` bytes, the whole exchange within its time:
        `LimitExceeded` past either, `ExchangeFailed` when the transport fails. `wait`: seconds
        the answer may legitimately take in silence (a load answered when it is done: the swap
        timeout), when longer than the read timeout and Limits.exchange."""
        sent = kwargs.get("content") or kwargs.get("json")
        read = self.timeout if wait is None else max(self.timeout, wait)
        with self._exchange(method, url, wait) as clock:
            try:
                with self.http.stream(method, url, **{"timeout": clock.timeout(read), **kwargs}) as r:
                    body = self._body(r, clock)
            except httpx.HTTPError as e:
                failure = self._failure(e, clock)
                self._note(method, url, type(e).__name__, sent, str(failure))
                raise failure from None  # httpx's frames hold the request's raw headers: not shown
            except LimitExceeded as e:
                self._note(method, url, type(e).__name__, sent, str(e))
                raise
        self._note(method, url, r.status_code, sent, body)
        return _answered(r, body, self.target.api_key)

    def _shown(self, text: str, n: int = EXCERPT) -> str:
        """The first `n` characters of what the deployment sent, as evidence: a deployment that
        echoes the key back never gets it shown."""
        return self.target.api_key.excerpt(text, n)

    def _note(self, method: str, url: str, status: int | str, body: Any, answer: str | bytes) -> None:
        if isinstance(body, bytes):
            sent = body[: 4 * EXCERPT].decode("utf-8", "replace")
        else:
            sent = json.dumps(body) if body else ""
        if isinstance(answer, bytes):
            answer = answer[: 4 * EXCERPT].decode("utf-8", "replace")
        self.exchanges.append(Exchange.of(method, httpx.URL(url).path, status, sent, answer, self.target.api_key))

    # ----------------------------------------------------------------------- control

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header; its value (`Redacted`) never shows in a repr or a report."""
        return {"Authorization": self.target.api_key.bearer()} if self.target.api_key else {}

    def control_headers(self) -> dict[str, str]:
        """The control plane's Authorization header: its own key where it has one."""
        key = self.target.control_key
        return {"Authorization": key.bearer()} if key else self.auth_headers()

    def hot_load_headers(self) -> dict[str, str]:
        names = {"fireworks-model": self.target.model}
        if self.target.deployment:
            names["fireworks-deployment"] = self.target.deployment
        return self.auth_headers() | names

    def _hot_load_url(self, suffix: str = "") -> str:
        return self.target.base_url.rstrip("/") + "/hot_load/v1/models/hot_load" + suffix

    def hot_load(self, body: Any, *, headers: dict[str, str] | None = None) -> httpx.Response:
        """POST a signal (any body: tests send malformed ones on purpose)."""
        h = self.hot_load_headers() | {"Content-Type": "application/json"} | (headers or {})
        return self.request("POST", self._hot_load_url(), content=json.dumps(body).encode(), headers=h)

    def status(self, *, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.request("GET", self._hot_load_url(), headers=self.hot_load_headers() | (headers or {}))

    def hint(self, identity: str, file: str) -> httpx.Response:
        body = {"identity": identity, "file": file}
        return self.request("POST", self._hot_load_url("/hint"), json=body, headers=self.hot_load_headers())

    def _deployment_url(self) -> str:
        t = self.target
        return f"{t.base_url.rstrip('/')}/v1/accounts/{t.account}/deployments/{t.deployment_id}"

    def resource(self) -> dict[str, Any]:
        """The deployment resource (GET /v1/accounts/<a>/deployments/<d>), {} when unavailable."""
        r = self.request("GET", self._deployment_url(), headers=self.auth_headers())
        doc = json_object(r) if r.status_code == 200 else None
        return doc or {}

    def ledger(self) -> httpx.Response:
        return self.request("GET", self._deployment_url() + "/ledger", headers=self.auth_headers())

    def reset_ledger(self) -> httpx.Response:
        return self.request("DELETE", self._deployment_url() + "/ledger", headers=self.auth_headers())

    def replicas(self) -> list[dict[str, Any]]:
        """The status's replicas; [] when the status cannot be read."""
        r = self.status()
        doc = json_object(r) if r.status_code == 200 else None
        replicas = (doc or {}).get("replicas")
        return [x for x in replicas if isinstance(x, dict)] if isinstance(replicas, list) else []

    def served_identities(self) -> list[str | None]:
        """current_snapshot_identity of every replica."""
        return [r.get("current_snapshot_identity") for r in self.replicas()]

    # ----------------------------------------------------------------------- inference

    def inference_url(self, chat: bool = False) -> str:
        return self.target.inference_base + ("/v1/chat/completions" if chat else "/v1/completions")

    def post_inference(self, content: bytes, *, chat: bool = False) -> httpx.Response:
        """POST raw bytes to the completions endpoint (for malformed requests), on a connection
        of its own: a server that drops a connection after an error must not be blamed for
        the next request's reset."""
        headers = self.auth_headers() | {"Content-Type": "application/json", "Connection": "close"}
        return self.request("POST", self.inference_url(chat), content=content, headers=headers)

    def complete(
        self,
        body: dict[str, Any],
        *,
        chat: bool = False,
        headers: dict[str, str] | None = None,
        on_chunk: Callable[[dict[str, Any]], None] | None = None,
        on_status: Callable[[int], None] | None = None,
        url: str | None = None,
        reading: Reading = CONTRACT_READING,
    ) -> Stream:
        """Send a completion (streaming when body['stream']) and parse what comes back;
        `on_chunk` sees every streamed chunk as it arrives, `on_status` the status as soon as the
        answer's head arrives (a stream's, before its first chunk). What does not parse is kept in
        `Stream.problems`, never raised; a bound passed raises `LimitExceeded`, a failed
        transport `ExchangeFailed`. `url` (default: the completions endpoint) and `reading`
        are a driver's: its engine's endpoint, and where its answers say what."""
        payload = {"model": self.target.body_model, **body}
        url, sending = url or self.inference_url(chat), self.auth_headers() | (headers or {})
        if not payload.get("stream"):
            r = self.request("POST", url, json=payload, headers=sending)
            out = Stream(r.status_code, {k.lower(): v for k, v in r.headers.items()}, body=r.text, reading=reading)
            if on_status is not None:
                on_status(r.status_code)
            if r.status_code == 200:
                doc = json_object(r)
                if doc is None:
                    out.problems.append(f"the 200 answer is not a JSON object: {self._shown(r.text)!r}")
                else:
                    out.chunks.append(reading.chunk(doc, out.chunks))
            return out
        out = Stream(0, {}, reading=reading)
        with self._exchange("POST", url) as clock:
            try:
                read = max(self.timeout, getattr(_EXCHANGE, "held", None) or 0.0)
                with self.http.stream("POST", url, json=payload, headers=sending, timeout=clock.timeout(read)) as r:
                    key = self.target.api_key  # echoed back, never shown
                    out.status, out.headers = r.status_code, {k.lower(): key.redact(v) for k, v in r.headers.items()}
                    if on_status is not None:
                        on_status(r.status_code)
                    if r.status_code != 200:
                        out.body = key.redact(self._body(r, clock).decode("utf-8", "replace"))
                    else:
                        self._read_stream(r, out, on_chunk, clock, events_bound(self.limits, payload))
            except httpx.HTTPError as e:
                failure = self._failure(e, clock)
                self._note("POST", url, type(e).__name__, payload, str(failure))
                raise failure from None  # httpx's frames hold the request's raw headers: not shown
            except LimitExceeded as e:
                self._note("POST", url, type(e).__name__, payload, str(e))
                raise
        self._note("POST", url, out.status, payload, out.body or _events_excerpt(out.events))
        return out

    def _read_stream(
        self,
        r: httpx.Response,
        out: Stream,
        on_chunk: Callable[[dict[str, Any]], None] | None,
        clock: _Clock,
        bound: int,
    ) -> None:
        kind = r.headers.get("content-type", "")
        if not kind.strip().lower().startswith("text/event-stream"):
            out.problems.append(f"the stream's content-type is {self._shown(kind, 80)!r}, not text/event-stream")
        decoder = SSEDecoder(self.limits.event, what=clock.what)
        clock.doing, clock.progress = STREAM_SENDING, lambda: f"{len(out.events):,} events"
        held = [0]  # bytes the events kept and their chunks take, as `parsed_size` estimates them
        try:
            for piece in _decoded(r, STREAM_PIECE, clock.what):
                for event in decoder.feed(piece):
                    if self._take(out, event, on_chunk, clock, held, bound):
                        return
                clock.tick(len(piece))
            for event in decoder.close():
                self._take(out, event, on_chunk, clock, held, bound)
            out.unterminated = decoder.unterminated
        finally:
            if decoder.invalid:
                out.problems.append(f"{decoder.invalid} events held bytes that are not UTF-8 (read as U+FFFD)")

    def _take(
        self,
        out: Stream,
        event: str,
        on_chunk: Callable[[dict[str, Any]], None] | None,
        clock: _Clock,
        held: list[int],
        bound: int,
    ) -> bool:
        """Add one event to `out`; True once the stream is done. A stream is kept whole (the
        verdicts read every event), so its events (`bound`) and their bytes are bounded."""
        if len(out.events) >= bound:
            raise LimitExceeded(
                f"Limits.events = {bound:,} (or twice the tokens asked for)",
                f"{clock.what}: the stream passed {bound:,} events without data: [DONE]",
            )
        held[0] += parsed_size(event)  # weighed before it is parsed
        if held[0] > self.limits.memory:
            raise LimitExceeded(
                f"Limits.memory = {amount(self.limits.memory)}",
                f"{clock.what}: the stream's events would take about {held[0] / 2**20:,.0f} MiB in "
                f"memory once parsed ({len(out.events) + 1:,} events, none of them data: [DONE])",
            )
        event = self.target.api_key.redact(event)  # echoed back, never shown
        out.events.append(event)
        data = event_data(event)
        if data.strip() == "[DONE]":
            out.done = True
            return True
        if not data:
            return False
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            chunk = None
        if not isinstance(chunk, dict):
            out.problems.append(f"event {len(out.events)} is not a JSON object: {self._shown(data)!r}")
            return False
        chunk = out.reading.chunk(chunk, out.chunks)
        out.chunks.append(chunk)
        if on_chunk is not None:
            on_chunk(chunk)
        return False


def loading_state(replica: dict[str, Any]) -> dict[str, Any]:
    """A replica's `loading_state`, {} when the deployment sent something other than an object."""
    return as_object(replica.get("loading_state"))


def busy(replica: dict[str, Any]) -> bool:
    """The replica is loading or swapping a snapshot."""
    stage = loading_state(replica).get("stage")
    return isinstance(stage, str) and stage in BUSY_STAGES


def serves(replica: dict[str, Any], identity: str, lora: bool = False) -> bool:
    """The replica is ready and serves `identity` (LoRA: lists it as a loaded adapter)."""
    if not replica.get("readiness"):
        return False
    if lora:
        adapters = replica.get("loaded_adapters")
        return isinstance(adapters, list) and any(
            as_object(a).get("identity") == identity and as_object(a).get("status") == "loaded" for a in adapters
        )
    return replica.get("current_snapshot_identity") == identity
