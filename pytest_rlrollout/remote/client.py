"""A client for any deployment (the reference one, or a live one at a plain URL): bounded
exchanges, written down as evidence, and completions parsed into what the contract talks about
(`Stream`). What an engine's own endpoints are (Fireworks' hot-load API, vLLM's reload, ...) its
driver knows; this client only sends and reads.

The deployment under test may be hostile or broken, so every exchange is bounded (`Limits`):
its time (a stream included, and a per-test `deadline` on top), the bytes of a body, of an SSE
event and of a stream, and the events of a stream. Past a bound: `LimitExceeded`, naming the
bound and what the deployment did. A transport that fails: `ExchangeFailed`, naming the
request and what broke. The key never shows (see `secret`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, Unpack

import httpx

from pytest_rlrollout.remote.answers import STREAM_PIECE, answered, decoded, events_bound, events_excerpt, read_capped
from pytest_rlrollout.remote.limits import LOCAL_LIMITS, LimitExceeded, Limits
from pytest_rlrollout.remote.options import CompletionOptions
from pytest_rlrollout.remote.sse import SSEDecoder, amount, event_data
from pytest_rlrollout.remote.stream import (
    CONTRACT_READING,
    EXCERPT,
    Exchange,
    Reading,
    Stream,
    json_object,
    parsed_size,
)
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.remote.transport import (
    BODY_ARRIVING,
    EXCHANGE,
    FAILED,
    REASON,
    SLACK,
    STREAM_SENDING,
    Clock,
    ExchangeFailed,
    put_deadline,
    tls_context,
)


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
            timeout=timeout, transport=transport, headers={"Accept-Encoding": "identity"}, verify=tls_context()
        )
        for t in (self.http._transport, *self.http._mounts.values()):  # env proxies get mounts of their own
            put_deadline(t)
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
        before = getattr(EXCHANGE, "held", None)
        EXCHANGE.held = seconds
        try:
            yield
        finally:
            EXCHANGE.held = before

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
    def _exchange(self, method: str, url: str, wait: float | None = None) -> Iterator[Clock]:
        """The clock of one exchange, which the network backend reads for this thread: `wait`
        seconds (a request answered once a load is done) when longer than Limits.exchange. Nested
        in another exchange (a request made from `on_chunk`), it ends no later than the outer one."""
        now = time.monotonic()
        what = f"{method} {httpx.URL(url).path}"
        held = getattr(EXCHANGE, "held", None)
        if held is not None:  # a stream a swap may hold silent: the swap's time on top of its own
            wait = self.limits.exchange + held if wait is None else max(wait, self.limits.exchange + held)
        if wait is not None and wait > self.limits.exchange:
            clock = Clock(what, now, now + wait, f"the swap timeout ({wait:g} s)")
        else:
            clock = Clock(what, now, now + self.limits.exchange, f"Limits.exchange = {self.limits.exchange:g} s")
        if self.deadline is not None and self.deadline < clock.end:
            clock.end, clock.bound = self.deadline, "the test's deadline"
            if clock.end <= now:
                raise LimitExceeded(
                    clock.bound, f"{what} was not sent: the test's time was up {now - clock.end:.1f} s ago"
                )
        outer: Clock | None = getattr(EXCHANGE, "clock", None)
        if outer is not None and outer.end < clock.end:
            clock.end, clock.bound = outer.end, outer.bound
        EXCHANGE.clock = clock
        try:
            yield clock
        finally:
            EXCHANGE.clock = outer

    def _failure(self, e: httpx.HTTPError, clock: Clock) -> Exception:
        """What a transport error means: the exchange's time was up (`LimitExceeded`), or the
        transport failed (`ExchangeFailed` naming the request and what the deployment did)."""
        if isinstance(e, ExchangeFailed):
            return e
        if isinstance(e, httpx.TimeoutException) and clock.left() <= SLACK:
            return clock.over()
        did = next((text for kind, text in FAILED if isinstance(e, kind)), "failed")
        reason = self.target.api_key.excerpt(str(e) or "no detail", REASON)
        failure = ExchangeFailed(f"{clock.what}: the deployment {did} ({type(e).__name__}: {reason})")
        with contextlib.suppress(RuntimeError):  # an error raised before its request was built has none
            failure.request = e.request
        return failure

    def _body(self, r: httpx.Response, clock: Clock) -> bytes:
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
        return answered(r, body, self.target.api_key)

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
        url: str | None = None,
        reading: Reading = CONTRACT_READING,
        **options: Unpack[CompletionOptions],
    ) -> Stream:
        """Send a completion (streaming when body['stream']) and parse what comes back;
        `on_chunk` sees every streamed chunk as it arrives, `on_status` the status as soon as the
        answer's head arrives (a stream's, before its first chunk). What does not parse is kept in
        `Stream.problems`, never raised; a bound passed raises `LimitExceeded`, a failed
        transport `ExchangeFailed`. `url` (default: the completions endpoint) and `reading`
        are a driver's: its engine's endpoint, and where its answers say what."""
        chat, on_chunk, on_status = options.get("chat", False), options.get("on_chunk"), options.get("on_status")
        payload = {"model": self.target.body_model, **body}
        url, sending = url or self.inference_url(chat), self.auth_headers() | (options.get("headers") or {})
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
                read = max(self.timeout, getattr(EXCHANGE, "held", None) or 0.0)
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
        self._note("POST", url, out.status, payload, out.body or events_excerpt(out.events))
        return out

    def _read_stream(
        self,
        r: httpx.Response,
        out: Stream,
        on_chunk: Callable[[dict[str, Any]], None] | None,
        clock: Clock,
        bound: int,
    ) -> None:
        kind = r.headers.get("content-type", "")
        if not kind.strip().lower().startswith("text/event-stream"):
            out.problems.append(f"the stream's content-type is {self._shown(kind, 80)!r}, not text/event-stream")
        decoder = SSEDecoder(self.limits.event, what=clock.what)
        clock.doing, clock.progress = STREAM_SENDING, lambda: f"{len(out.events):,} events"
        held = [0]  # bytes the events kept and their chunks take, as `parsed_size` estimates them
        try:
            for piece in decoded(r, STREAM_PIECE, clock.what):
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
        clock: Clock,
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
