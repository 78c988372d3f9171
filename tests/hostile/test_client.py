"""The client against a hostile deployment: a server on loopback, in this process, that keeps a
stream going, trickles, goes silent, sends bodies of hundreds of MB or a compressed bomb, or
answers with something that is not HTTP. Every exchange ends within its bounds, in time and in
memory, as `LimitExceeded` naming the bound and what the deployment did, or `ExchangeFailed`
naming the request and what broke, or a `Stream` whose `problems` say what did not parse:
never another exception, never a hang, never the key."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import zlib
from collections.abc import Callable

import pytest

from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.drivers import FireworksDriver
from pytest_rlrollout.remote.drivers.fireworks import HotLoadAPI
from pytest_rlrollout.remote.limits import LIVE_LIMITS, LimitExceeded, Limits
from pytest_rlrollout.remote.sse import SSEDecoder
from pytest_rlrollout.remote.stream import Stream
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.remote.transport import ExchangeFailed

from .budget import Budget, heap_returned, older_objects_frozen  # noqa: F401 (fixtures)

KEY = "sk-hostile-5f1c0e2a9b7d4c3e"
MB = 2**20
Behaviour = Callable[[socket.socket, threading.Event], None]


pytestmark = pytest.mark.usefixtures("heap_returned")


# --------------------------------------------------------------------------- a hostile deployment


class HostileDeployment:
    """A server on loopback that reads each request (its head, and its body by Content-Length;
    with `reads=False` nothing at all) and then does what `behave(conn, stop)` does; `stop` is
    set when the test is done, and every connection is shut down then, so no thread outlives
    the test."""

    def __init__(self, behave: Behaviour, *, reads: bool = True):
        self.behave, self.reads = behave, reads
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.conns: list[socket.socket] = []
        self.threads: list[threading.Thread] = []

    def __enter__(self) -> str:
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self.listener.close()
        self.acceptor.join(5)
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for t in self.threads:
            t.join(5)
        assert not any(t.is_alive() for t in [self.acceptor, *self.threads]), "a hostile handler outlived its test"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.reads and not self._read_request(conn):
                return
            self.behave(conn, self.stop)
        except OSError:  # the client went away: what a hostile server is left with
            pass
        finally:
            conn.close()

    @staticmethod
    def _read_request(conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            got = conn.recv(65536)
            if not got:
                return False
            data += got
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")), 0
        )
        while len(body) < length:
            got = conn.recv(65536)
            if not got:
                return False
            body += got
        return True


def head(status: str = "200 OK", *fields: str) -> bytes:
    return (f"HTTP/1.1 {status}\r\n" + "".join(f"{f}\r\n" for f in fields) + "\r\n").encode()


SSE = ("content-type: text/event-stream",)
CHUNKED = ("transfer-encoding: chunked",)
CLOSE = ("connection: close",)  # the body runs to the end of the connection


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sends(*parts: bytes, then_wait: bool = True) -> Behaviour:
    """Send `parts`, then keep the connection open (silent) until the test is done."""

    def behave(conn: socket.socket, stop: threading.Event) -> None:
        for part in parts:
            conn.sendall(part)
        if then_wait:
            stop.wait()

    return behave


def endless(first: bytes, piece: bytes) -> Behaviour:
    """Send `first`, then `piece` as fast as the client takes it, for as long as it does."""

    def behave(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(first)
        while not stop.is_set():
            conn.sendall(piece)

    return behave


def trickle(first: bytes, byte: bytes, every: float) -> Behaviour:
    """Send `first`, then one byte every `every` seconds (the server's pace, not a wait)."""

    def behave(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(first)
        while not stop.wait(every):
            conn.sendall(byte)

    return behave


def body_of(size: int, *, framing: str, status: str = "200 OK") -> Behaviour:
    """An answer of `size` bytes of JSON-ish text: announced by Content-Length, chunked, or to
    the end of the connection."""
    piece = b"x" * 65536
    framed = chunk(piece) if framing == "chunked" else piece
    extra = {"length": (f"content-length: {size}",), "chunked": CHUNKED, "close": CLOSE}[framing]

    def behave(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head(status, "content-type: application/json", *extra))
        for _ in range(size // len(piece)):
            if stop.is_set():
                return
            conn.sendall(framed)

    return behave


def client(url: str, limits: Limits) -> DeploymentClient:
    return DeploymentClient(Target(None, url, "m", KEY, engine="openai"), limits=limits)


def stream(c: DeploymentClient) -> Stream:
    return c.complete({"prompt": "hi", "max_tokens": 4, "stream": True})


def ask(behave: Behaviour, call: Callable[[DeploymentClient], object], limits: Limits, *, reads: bool = True):
    """What `call` gave or raised against a deployment that does `behave`; the key shows in
    neither, nor in the exchanges written down."""
    with HostileDeployment(behave, reads=reads) as url, client(url, limits) as c:
        try:
            got: object = call(c)
        except (LimitExceeded, ExchangeFailed) as e:
            got = e
        shown = repr(got) + str(got) + "\n".join(e.text() for e in c.exchanges)
    assert KEY not in shown
    return got


# --------------------------------------------------------------------------- time


QUICK = Limits(exchange=1.0, events=10**9, memory=2**40)  # only time ends these
SSE_HEAD = head("200 OK", *SSE, *CHUNKED)
CHUNK = b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n'

TIME_CASES: dict[str, tuple[Behaviour, Callable[[DeploymentClient], object], str, bool]] = {
    # case: (the deployment, what the client asks, what the message says it did, the server reads)
    "an endless fast stream": (endless(SSE_HEAD, chunk(CHUNK * 200)), stream, "the stream was still sending", True),
    "an endless stream of keep-alive comments": (
        endless(SSE_HEAD, chunk(b": keep-alive\n\n" * 200)),
        stream,
        "the stream was still sending",
        True,
    ),
    "an endless stream of blank lines": (
        endless(SSE_HEAD, chunk(b"\n" * 65536)),
        stream,
        "the stream was still sending",
        True,
    ),
    "a stream of one byte every 0.2 s": (
        trickle(head("200 OK", *SSE, *CLOSE), b":", 0.2),
        stream,
        "the stream was still sending",
        True,
    ),
    "a status body of one byte every 0.2 s": (
        trickle(head("200 OK", *CLOSE), b" ", 0.2),
        lambda c: HotLoadAPI(c).status(),
        "the answer's body was still arriving",
        True,
    ),
    "silence after the headers": (sends(SSE_HEAD), stream, "no byte of the body arrived", True),
    "a status that is silent after its headers": (
        sends(head("200 OK", "content-length: 10")),
        lambda c: HotLoadAPI(c).status(),
        "no byte of the body arrived",
        True,
    ),
    "no answer at all": (sends(), stream, "no answer came", True),
    "headers one byte every 0.1 s": (trickle(b"", b"H", 0.1), lambda c: HotLoadAPI(c).status(), "no answer came", True),
    "100 Continue, then nothing": (
        sends(head("100 Continue")),
        lambda c: HotLoadAPI(c).status(),
        "no answer came",
        True,
    ),
    "a request never read": (
        sends(),
        lambda c: c.post_inference(b" " * (32 * MB)),
        "the deployment took no more of the request",
        False,
    ),
}


@pytest.mark.parametrize("case", TIME_CASES)
def test_an_exchange_ends_at_limits_exchange(case):
    """Before the bound, a test ran for as long as the server kept sending (or kept quiet)."""
    behave, call, did, reads = TIME_CASES[case]
    with Budget("client", f"time: {case}", seconds=3, rss_mb=200) as budget:
        got = ask(behave, call, QUICK, reads=reads)
    assert isinstance(got, LimitExceeded), got
    assert got.bound == "Limits.exchange = 1 s" and did in str(got), str(got)
    assert got.silent == (did == "no answer came"), got  # nothing of the answer came: slow (the suite's), not wrong
    assert budget.elapsed >= 0.9  # ended by the bound, not by something else


def test_the_tests_deadline_ends_an_endless_stream():
    """The per-test deadline (`client.deadline`, set by the suite) ends exchanges before
    Limits.exchange does, and one that would start after it is never sent."""
    with (
        Budget("client", "time: the test's deadline", seconds=5, rss_mb=200, inputs=3),
        HostileDeployment(endless(SSE_HEAD, chunk(b": keep-alive\n\n" * 200))) as url,
        client(url, LIVE_LIMITS) as c,
    ):
        c.deadline = time.monotonic() + 1.0
        # the exchange starts a moment after the deadline is set: 1 s, or 0.99x s under load
        with pytest.raises(LimitExceeded, match=r"the stream was still sending after (1|0\.99\d) s") as first:
            stream(c)
        assert first.value.bound == "the test's deadline"
        with pytest.raises(LimitExceeded, match="was not sent: the test's time was up") as second:
            HotLoadAPI(c).status()
        assert second.value.bound == "the test's deadline"
        c.deadline = time.monotonic() + 0.5
        with pytest.raises(LimitExceeded, match=r"after 0\.(5|49\d) s"):
            stream(c)


# --------------------------------------------------------------------------- memory


LIMITS = Limits(exchange=30.0)  # LIVE_LIMITS but for the time: a failing bound must not hold the run
ZEROS = 2**30  # what the compressed bombs inflate to


def repeated(data: bytes, times: int, wbits: int) -> bytes:
    """A gzip (wbits 31) or zlib (15) stream of `data` repeated `times` times, compressing `data`
    twice: after a full flush the compressor starts afresh, so every later block compresses to
    the same bytes as the second; the trailer's checksum and size are those of the whole."""
    z = zlib.compressobj(9, zlib.DEFLATED, wbits, 9, zlib.Z_RLE)
    first = z.compress(data) + z.flush(zlib.Z_FULL_FLUSH)
    block = z.compress(data) + z.flush(zlib.Z_FULL_FLUSH)
    end = z.flush()  # the final empty block, then the trailer of two blocks: replaced
    if wbits == 31:  # gzip: CRC-32 and size, little-endian
        crc = 0
        for _ in range(times):
            crc = zlib.crc32(data, crc)
        trailer = crc.to_bytes(4, "little") + (len(data) * times % 2**32).to_bytes(4, "little")
    else:  # zlib: Adler-32, big-endian
        adler = 1
        for _ in range(times):
            adler = zlib.adler32(data, adler)
        trailer = adler.to_bytes(4, "big")
    return first + block * (times - 1) + end[: -len(trailer)] + trailer


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """gzip and zlib streams of a GiB of zeros, and a gzip stream of 256 MiB of blank SSE lines
    (made once, outside any budget; compressing each block, 10 s per xdist worker, was the
    slowest set-up of the run)."""
    return {
        "gzip": repeated(bytes(16 * MB), ZEROS // (16 * MB), 31),
        "deflate": repeated(bytes(16 * MB), ZEROS // (16 * MB), 15),
        "gzip-sse": repeated(b"data: {}\n\n" * (MB // 10), 256 // 10 * 10, 31),
    }


def compressed(bombs: dict[str, bytes], name: str, *fields: str) -> Behaviour:
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        encoding = name.split("-")[0]
        data = bombs[name]
        conn.sendall(head("200 OK", *fields, f"content-encoding: {encoding}", f"content-length: {len(data)}") + data)
        stop.wait()

    return behave


ASTRAL = "\U0001f600".encode() * (MB // 4)
MEMORY_CASES: dict[str, tuple[Callable[[dict[str, bytes]], Behaviour], Callable[[DeploymentClient], object], str]] = {
    # case: (the deployment, given the bombs; what the client asks; the bound it meets)
    "a fast endless stream of small chunks": (
        lambda b: endless(SSE_HEAD, chunk(CHUNK * 1000)),
        stream,
        "Limits.events",
    ),
    "a fast endless stream of 1 MB chunks": (
        lambda b: endless(SSE_HEAD, chunk(b'data: {"t": "' + b"x" * MB + b'"}\n\n')),
        stream,
        "Limits.memory",
    ),
    "a fast endless stream of 4-byte characters": (
        lambda b: endless(SSE_HEAD, chunk(b'data: {"t": "' + ASTRAL + b'"}\n\n')),
        stream,
        "Limits.memory",
    ),
    "a fast endless stream of escaped astral characters": (
        lambda b: endless(SSE_HEAD, chunk(b'data: {"t": "' + b"a" * MB + b'\\ud83d\\ude00"}\n\n')),
        stream,
        "Limits.memory",
    ),
    "a fast endless stream of JSON that parses to 20x its size": (
        lambda b: endless(SSE_HEAD, chunk(b'data: {"t": [' + b"[]," * (MB // 3) + b"[]]}\n\n")),
        stream,
        "Limits.memory",
    ),
    "a fast endless stream of floats": (
        lambda b: endless(SSE_HEAD, chunk(b'data: {"t": [' + b"0.0," * (MB // 4) + b"0.0]}\n\n")),
        stream,
        "Limits.memory",
    ),
    "an endless line": (lambda b: endless(SSE_HEAD, chunk(b"x" * 65536)), stream, "Limits.event"),
    "an endless event of short lines": (
        lambda b: endless(SSE_HEAD, chunk("€\n".encode() * 16384)),
        stream,
        "Limits.event",
    ),
    "an endless event of comments": (lambda b: endless(SSE_HEAD, chunk(b":\n" * 32768)), stream, "Limits.event"),
    "an endless stream without chunked framing": (
        lambda b: endless(head("200 OK", *SSE, *CLOSE), b"x" * 65536),
        stream,
        "Limits.event",
    ),
    "a 200 MB body with its Content-Length": (
        lambda b: body_of(200 * MB, framing="length"),
        lambda c: HotLoadAPI(c).status(),
        "Limits.body",
    ),
    "a 200 MB body to the end of the connection": (
        lambda b: body_of(200 * MB, framing="close"),
        lambda c: HotLoadAPI(c).status(),
        "Limits.body",
    ),
    "a 200 MB chunked body": (
        lambda b: body_of(200 * MB, framing="chunked"),
        lambda c: HotLoadAPI(c).status(),
        "Limits.body",
    ),
    "a 130 MB status (replicas)": (
        lambda b: body_of(130 * MB, framing="chunked"),
        lambda c: HotLoadAPI(c).replicas(),
        "Limits.body",
    ),
    "a 200 MB non-streamed completion": (
        lambda b: body_of(200 * MB, framing="close"),
        lambda c: c.complete({"prompt": "hi"}),
        "Limits.body",
    ),
    "a 200 MB error answer to a stream": (
        lambda b: body_of(200 * MB, framing="chunked", status="500 Oops"),
        stream,
        "Limits.body",
    ),
    "a 200 MB hot-load answer": (
        lambda b: body_of(200 * MB, framing="close"),
        lambda c: HotLoadAPI(c).hot_load({}),
        "Limits.body",
    ),
    "a gzip bomb (a GiB of zeros) as a status": (
        lambda b: compressed(b, "gzip"),
        lambda c: HotLoadAPI(c).status(),
        "Limits.body",
    ),
    "a deflate bomb (a GiB of zeros) as a status": (
        lambda b: compressed(b, "deflate"),
        lambda c: HotLoadAPI(c).status(),
        "Limits.body",
    ),
    "a gzip bomb (a GiB of zeros) as a stream": (lambda b: compressed(b, "gzip", *SSE), stream, "Limits.event"),
    "a gzip bomb of events as a stream": (lambda b: compressed(b, "gzip-sse", *SSE), stream, "Limits.events"),
    "a status of JSON that parses to 20x its size": (
        lambda b: sends(head("200 OK", *CLOSE) + b'{"replicas": [' + b"[]," * (10 * MB) + b"[]]}", then_wait=False),
        lambda c: HotLoadAPI(c).replicas(),
        "Limits.memory",
    ),
}


@pytest.mark.parametrize("case", MEMORY_CASES)
def test_memory_stays_bounded(case, bombs):
    """Before the caps, a fast endless stream grew the client to 11.7 GB, a 200 MB body took
    1.3 GB and a 130 MB status 2 GB; now RSS grows by less than 200 MB, whatever is sent."""
    make, call, bound = MEMORY_CASES[case]
    behave = make(bombs)
    with Budget("client", f"memory: {case}", seconds=10, rss_mb=200):
        got = ask(behave, call, LIMITS)
    assert isinstance(got, LimitExceeded), got
    assert got.bound.startswith(bound), str(got)


# --------------------------------------------------------------------------- one long line


def test_a_64_mb_line_is_refused_at_limits_event_in_time():
    """Splitting SSE used to be quadratic in a line's length: a 64 MB line took 75 s."""
    line = b"data: " + b"x" * (64 * MB) + b"\n\n"
    with Budget("client", "sse: a 64 MB line at Limits.event", seconds=2, rss_mb=100):
        d = SSEDecoder(LIVE_LIMITS.event)
        with pytest.raises(LimitExceeded, match="an SSE event passed 16,777,216 bytes") as refused:
            for i in range(0, len(line), 65536):
                d.feed(line[i : i + 65536])
    assert refused.value.bound == "Limits.event = 16 MiB"


def test_a_64_mb_line_is_split_in_linear_time_without_a_bound():
    line = b"data: " + b"x" * (64 * MB) + b"\n\n"
    with Budget("client", "sse: a 64 MB line, no bound", seconds=2, rss_mb=300):  # the line, its pieces, the event
        d = SSEDecoder()
        events = [e for i in range(0, len(line), 65536) for e in d.feed(line[i : i + 65536])]
    assert len(events) == 1 and len(events[0]) == 64 * MB + 6


def test_a_64_mb_line_from_a_deployment_is_refused_at_limits_event():
    line = chunk(b"data: " + b"x" * (64 * MB) + b"\n\n")
    with Budget("client", "sse: a 64 MB line from a deployment", seconds=5, rss_mb=200):
        got = ask(sends(SSE_HEAD, line, then_wait=True), stream, LIMITS)
    assert isinstance(got, LimitExceeded) and got.bound == "Limits.event = 16 MiB", got


def split_seconds(size: int, read: int) -> float:
    """The fastest of three splits of a `size`-byte line fed `read` bytes at a time."""
    line = b"data: " + b"x" * size + b"\n\n"
    pieces = [line[i : i + read] for i in range(0, len(line), read)]
    best = float("inf")
    for _ in range(3):
        d = SSEDecoder()
        t0 = time.perf_counter()
        events = [e for p in pieces for e in d.feed(p)]
        best = min(best, time.perf_counter() - t0)
        assert len(events) == 1 and len(events[0]) == size + 6
    return best


@pytest.mark.parametrize(("read", "small", "large"), [(1, 2**17, 2**20), (4096, 2**21, 2**24)])
def test_splitting_a_line_costs_time_in_proportion_to_its_length(read, small, large):
    """8 times the line, about 8 times the time, however it is split into reads (quadratic
    splitting would take 64 times)."""
    with Budget(
        "client", f"sse: lines of {small:,} and {large:,} bytes in {read}-byte reads", seconds=12, rss_mb=200, inputs=2
    ):
        ratio = split_seconds(large, read) / split_seconds(small, read)
    assert ratio < 24, ratio


def test_a_line_read_a_byte_at_a_time_holds_no_object_per_byte():
    """Each byte of a line read a byte at a time used to be a string of its own (some 50 bytes
    each); the pieces are joined every `BLOCK`."""
    euro = "€".encode()
    with Budget("client", "sse: a 3 MB line of 3-byte characters, a byte at a time", seconds=10, rss_mb=40):
        d = SSEDecoder()
        for _ in range(MB):
            for b in euro:
                d.feed(bytes((b,)))
        events = d.feed(b"\n\n")
    assert events == ["€" * MB]


# --------------------------------------------------------------------------- broken HTTP and broken streams


def cut_after(*parts: bytes) -> Behaviour:
    """Send `parts`, then close the connection."""
    return sends(*parts, then_wait=False)


def reset_after(*parts: bytes) -> Behaviour:
    """Send `parts`, then reset the connection (RST, not FIN)."""

    def behave(conn: socket.socket, stop: threading.Event) -> None:
        for part in parts:
            conn.sendall(part)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    return behave


BROKEN: dict[str, tuple[Behaviour, Callable[[DeploymentClient], object], str]] = {
    # case: (the deployment, what the client asks, what the message says)
    "a malformed chunk size": (cut_after(SSE_HEAD, b"zz\r\ndata: x\n\n\r\n"), stream, "broken HTTP"),
    "a chunk longer than announced": (cut_after(SSE_HEAD, b"2\r\ndata: x\n\n\r\n"), stream, "broken HTTP"),
    "a chunk cut short": (cut_after(SSE_HEAD, b"ff\r\ndata: {"), stream, "broken HTTP"),
    "a stream cut mid-event": (cut_after(SSE_HEAD, chunk(CHUNK), chunk(b'data: {"choi')), stream, "broken HTTP"),
    "a body shorter than its Content-Length": (
        cut_after(head("200 OK", "content-length: 100"), b"{}"),
        lambda c: HotLoadAPI(c).status(),
        "broken HTTP",
    ),
    "a garbage status line": (cut_after(b"HELLO THERE\r\n\r\n"), lambda c: HotLoadAPI(c).status(), "broken HTTP"),
    "binary garbage": (cut_after(bytes(range(256)) * 4), lambda c: HotLoadAPI(c).status(), "broken HTTP"),
    "HTTP/0.9 (a body without a head)": (
        cut_after(b'{"replicas": []}'),
        lambda c: HotLoadAPI(c).status(),
        "broken HTTP",
    ),
    "a status code of letters": (
        cut_after(b"HTTP/1.1 2OO OK\r\ncontent-length: 0\r\n\r\n"),
        lambda c: HotLoadAPI(c).status(),
        "broken HTTP",
    ),
    "a header line of 200 KB": (
        cut_after(head("200 OK", "x-junk: " + "a" * 200_000, "content-length: 0")),
        lambda c: HotLoadAPI(c).status(),
        "broken HTTP",
    ),
    "20,000 headers": (
        cut_after(head("200 OK", *[f"x-{i}: y" for i in range(20_000)], "content-length: 0")),
        lambda c: HotLoadAPI(c).status(),
        "broken HTTP",
    ),
    "an endless head": (
        endless(b"HTTP/1.1 200 OK\r\nx-junk: ", b"a" * 65536),
        lambda c: HotLoadAPI(c).status(),
        "broken HTTP",
    ),
    "a header without a colon": (
        cut_after(head("200 OK", "no colon here", "content-length: 0")),
        lambda c: HotLoadAPI(c).status(),
        "broken HTTP",
    ),
    "a header name with a space": (
        cut_after(head("200 OK", "bad name: x", "content-length: 0")),
        lambda c: HotLoadAPI(c).status(),
        "broken HTTP",
    ),
    "two different Content-Lengths": (
        cut_after(head("200 OK", "content-length: 2", "content-length: 5"), b"{}"),
        lambda c: HotLoadAPI(c).status(),
        "broken HTTP",
    ),
    "a Content-Length that is no number": (
        cut_after(head("200 OK", "content-length: lots"), b"{}"),
        lambda c: HotLoadAPI(c).status(),
        "broken HTTP",
    ),
    "a connection closed before any answer": (cut_after(), lambda c: HotLoadAPI(c).status(), "broken HTTP"),
    "a connection reset before any answer": (reset_after(), lambda c: HotLoadAPI(c).status(), "broke the connection"),
    "a connection reset mid-stream": (reset_after(SSE_HEAD, chunk(CHUNK)), stream, "broke the connection"),
    "a brotli answer": (
        cut_after(head("200 OK", "content-encoding: br", "content-length: 2"), b"{}"),
        lambda c: HotLoadAPI(c).status(),
        "'br'-encoded answer",
    ),
    "a gzip answer that is not gzip": (
        cut_after(head("200 OK", "content-encoding: gzip", "content-length: 9"), b"not gzip!"),
        lambda c: HotLoadAPI(c).status(),
        "does not decode",
    ),
    "a stream gzip-encoded twice": (
        cut_after(head("200 OK", *SSE, "content-encoding: gzip, gzip", *CLOSE), b"x"),
        stream,
        "'gzip, gzip'-encoded answer",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_broken_http_is_exchange_failed_naming_the_request(case):
    """These ended as `fail` with httpx's traceback as evidence; now one line naming the request
    and what the deployment did."""
    behave, call, said = BROKEN[case]
    with Budget("client", f"broken: {case}", seconds=3, rss_mb=100):
        got = ask(behave, call, LIMITS)
    assert isinstance(got, ExchangeFailed), got
    message = str(got)
    assert message.startswith(("GET /hot_load/v1/models/hot_load: ", "POST /v1/completions: ")), message
    assert said in message and "Traceback" not in message and len(message) < 700, message


def events_of(*events: bytes, tail: bytes = b"data: [DONE]\n\n") -> Behaviour:
    return cut_after(head("200 OK", *SSE, *CLOSE), *events, tail)


DEEP = b"[" * 100_000 + b"]" * 100_000
PROBLEMS: dict[str, tuple[Behaviour, str]] = {
    # case: (the deployment, what Stream.problems says)
    "a stream of text/html": (
        cut_after(head("200 OK", "content-type: text/html", *CLOSE), CHUNK, b"data: [DONE]\n\n"),
        "content-type is 'text/html'",
    ),
    "a stream without a content-type": (
        cut_after(head("200 OK", *CLOSE), CHUNK, b"data: [DONE]\n\n"),
        "content-type is ''",
    ),
    "data that is not JSON": (events_of(b"data: <html>oops</html>\n\n"), "is not a JSON object"),
    "data that is a JSON array": (events_of(b"data: [1, 2]\n\n"), "is not a JSON object"),
    "data that is a JSON string": (events_of(b'data: "x"\n\n'), "is not a JSON object"),
    "data that is NaN": (events_of(b"data: NaN\n\n"), "is not a JSON object"),
    "JSON nested 100,000 deep": (events_of(b'data: {"choices": ' + DEEP + b"}\n\n"), "is not a JSON object"),
    "an object nested 100,000 deep": (
        events_of(b"data: " + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n\n"),
        "is not a JSON object",
    ),
    "bytes that are not UTF-8": (events_of(b'data: {"choices": [{"text": "\xff\xfe\xc3"}]}\n\n'), "not UTF-8"),
    "an overlong UTF-8 encoding": (events_of(b'data: {"choices": [{"text": "\xc0\xaf"}]}\n\n'), "not UTF-8"),
    "a UTF-8 surrogate": (events_of(b'data: {"choices": [{"text": "\xed\xa0\x80"}]}\n\n'), "not UTF-8"),
}


@pytest.mark.parametrize("case", PROBLEMS)
def test_a_stream_that_does_not_parse_is_a_problem_not_an_exception(case):
    behave, said = PROBLEMS[case]
    with Budget("client", f"stream: {case}", seconds=3, rss_mb=100):
        got = ask(behave, stream, LIMITS)
    assert isinstance(got, Stream) and got.status == 200, got
    assert not got.ok and any(said in p for p in got.problems), got.problems
    assert got.done  # what followed the broken event was still read


ODD_BUT_LEGAL: dict[str, Behaviour] = {
    "CR line endings": cut_after(head("200 OK", *SSE, *CLOSE), CHUNK.replace(b"\n", b"\r") * 3, b"data: [DONE]\r\r"),
    "CRLF line endings": cut_after(
        head("200 OK", *SSE, *CLOSE), CHUNK.replace(b"\n", b"\r\n") * 3, b"data: [DONE]\r\n\r\n"
    ),
    "CR and LF split across reads": cut_after(
        head("200 OK", *SSE, *CHUNKED),
        *[chunk(CHUNK.replace(b"\n", b"\r")[:-1]), chunk(b"\r"), chunk(b"\n")] * 3,
        chunk(b"data: [DONE]\r\n\r\n"),
        b"0\r\n\r\n",
    ),
    "a stream a byte per chunk": cut_after(
        SSE_HEAD, *[chunk(bytes((b,))) for b in CHUNK * 3 + b"data: [DONE]\n\n"], b"0\r\n\r\n"
    ),
    "comments between events": cut_after(
        head("200 OK", *SSE, *CLOSE), (b": ping\n\n" + CHUNK) * 3, b"data: [DONE]\n\n"
    ),
    "a data field split over lines": cut_after(
        head("200 OK", *SSE, *CLOSE),
        b'data: {"choices": [{"index": 0,\ndata:  "text": "x"}]}\n\n' * 3,
        b"data: [DONE]\n\n",
    ),
}


def test_a_header_of_100_kb_is_still_http():
    """httpx takes a head of up to 100 KiB: a big header is no failure (a bigger head is, above)."""
    answer = cut_after(head("200 OK", "x-junk: " + "a" * 100_000, "content-length: 2"), b"{}")
    with Budget("client", "legal: a header of 100 KB", seconds=3, rss_mb=50):
        got = ask(answer, lambda c: HotLoadAPI(c).status(), LIMITS)
    assert got.status_code == 200 and len(got.headers["x-junk"]) == 100_000, got


@pytest.mark.parametrize("case", ODD_BUT_LEGAL)
def test_odd_but_legal_framing_parses(case):
    with Budget("client", f"legal: {case}", seconds=3, rss_mb=50):
        got = ask(ODD_BUT_LEGAL[case], stream, LIMITS)
    assert isinstance(got, Stream) and got.ok and got.done, (got, getattr(got, "problems", None))
    assert [c["choices"][0]["text"] for c in got.chunks] == ["x"] * 3


def test_a_stream_cut_mid_event_at_the_end_of_its_connection_is_unterminated():
    """A stream whose body ends with the connection (no chunked framing) and stops mid-event:
    the events before are kept, the last is dropped and said to be unterminated."""
    with Budget("client", "stream: cut mid-event at the end of the connection", seconds=3, rss_mb=50):
        got = ask(events_of(CHUNK, tail=b'data: {"choi'), stream, LIMITS)
    assert isinstance(got, Stream) and len(got.chunks) == 1 and got.unterminated and not got.done, got


STATUSES: dict[str, bytes] = {
    "not JSON": b"<html>502 Bad Gateway</html>",
    "nested 100,000 deep": b'{"replicas": ' + DEEP + b"}",
    "a list": b"[1, 2, 3]",
    "replicas a string": b'{"replicas": "all of them"}',
    "replicas of the wrong types": b'{"replicas": [1, "x", null, [], {"loading_state": "busy", "readiness": true,'
    b' "loaded_adapters": 7}, {"loading_state": {"stage": ["error"]}, "loaded_adapters": ["x", 1]}]}',
    "not UTF-8": b'{"replicas": [{"current_snapshot_identity": "\xff\xfe"}]}',
}


@pytest.mark.parametrize("case", STATUSES)
def test_a_status_of_the_wrong_shape_reads_as_no_replicas_never_raises(case):
    body = STATUSES[case]
    answer = cut_after(head("200 OK", "content-type: application/json", f"content-length: {len(body)}"), body)
    with Budget("client", f"status: {case}", seconds=5, rss_mb=50, inputs=3):
        replicas = ask(answer, lambda c: HotLoadAPI(c).replicas(), LIMITS)
        waited = ask(answer, lambda c: FireworksDriver(c).wait("snap", timeout=0.2, poll=0.05), LIMITS)
        lora = ask(answer, lambda c: FireworksDriver(c).wait("snap", timeout=0.2, poll=0.05, lora=True), LIMITS)
    assert isinstance(replicas, list) and all(isinstance(r, dict) for r in replicas), replicas
    assert not waited.ok and not lora.ok, (waited, lora)


def test_a_non_streamed_completion_that_does_not_parse_is_a_problem():
    cases = [b"<html>oops</html>", DEEP, b"[1]", b'"x"', b"\xff\xfe"]
    with Budget("client", "completion: bodies that are not JSON objects", seconds=5, rss_mb=50, inputs=len(cases)):
        got = [
            ask(
                cut_after(head("200 OK", f"content-length: {len(b)}"), b), lambda c: c.complete({"prompt": "x"}), LIMITS
            )
            for b in cases
        ]
    assert all(isinstance(s, Stream) and s.status == 200 and not s.ok for s in got), got
    assert all("is not a JSON object" in s.problems[0] for s in got), [s.problems for s in got]


def test_odd_chunks_never_raise_from_a_streams_accessors():
    """Chunks of the wrong shape (choices an integer, usage details a list) read as empty."""
    events = [
        b'data: {"choices": 5, "usage": {"prompt_tokens_details": [1]}}\n\n',
        b'data: {"choices": [{"logprobs": {"content": 3}}, 7], "model": 9}\n\n',
        b'data: {"choices": "abc", "perf_metrics": []}\n\n',
    ]
    with Budget("client", "stream: chunks of the wrong shape", seconds=3, rss_mb=50, inputs=len(events)):
        got = ask(events_of(*events), stream, LIMITS)
    assert isinstance(got, Stream) and got.ok, got
    assert got.choices() == [{"logprobs": {"content": 3}}] and got.entries == [] and got.finish_reason is None
    assert got.cached_tokens() == {"usage": None, "header": None, "perf_metrics": None}
    assert got.versions == [None, None, None] and got.final == got.chunks[-1]
    assert json.dumps(got.chunks)  # what a report would write
