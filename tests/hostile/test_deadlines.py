"""The suite against a deployment that never finishes a stream: each test that streams ends by
its deadline (`rl_test_timeout`) or its exchange's (`rl_exchange_timeout`), fails naming the
bound and what the deployment did, and the run goes on to the next test."""

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pytest_rlrollout.remote.discovery import PROBE_IDS, PROBE_TEXT
from pytest_rlrollout.suite.options import CONFORMANCE

from .budget import Budget

MODEL = "hostile-model"


def chunk(text: str) -> bytes:
    doc = {
        "id": "c",
        "object": "text_completion",
        "model": MODEL,
        "choices": [{"index": 0, "text": text, "finish_reason": None}],
    }
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class Hostile(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that answers the preflight's probes properly and then never
    ends a stream: `endless` sends a chunk every 5 ms, `trickle` one byte every 50 ms."""

    protocol_version = "HTTP/1.1"
    mode = "endless"
    stop: threading.Event

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        probe = body.get("prompt") in (PROBE_TEXT, PROBE_IDS)
        if not body.get("stream"):
            answer = json.dumps(
                {
                    "id": "c",
                    "object": "text_completion",
                    "model": MODEL,
                    "choices": [{"index": 0, "text": " a", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )
            self._send(200, "application/json", answer.encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            if probe:
                self.wfile.write(chunk(" a") + b"data: [DONE]\n\n")
                return
            while not self.stop.is_set():
                if self.mode == "endless":
                    self.wfile.write(chunk(" a"))
                    self.stop.wait(0.005)
                else:
                    for byte in chunk(" a"):
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        if self.stop.wait(0.05):
                            return
        except (BrokenPipeError, ConnectionResetError):
            return  # the client gave up: what the suite should do

    def do_GET(self) -> None:
        self._send(404, "application/json", b'{"error": "no hot-load API here"}')

    def _send(self, status: int, kind: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(params=["endless", "trickle"])
def hostile(request) -> Iterator[str]:
    stop = threading.Event()
    handler = type("Handler", (Hostile,), {"mode": request.param, "stop": stop})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    stop.set()
    server.shutdown()
    server.server_close()
    thread.join()


def run(pytester, url: str, *args: str):
    return pytester.runpytest_inprocess(
        str(CONFORMANCE / "test_inference.py"),
        "-k",
        "test_streams_are_well_formed_sse or test_usage_matches",
        "-p",
        "no:randomly",
        f"--rl-base-url={url}",
        f"--rl-model={MODEL}",
        "--rl-report=r.json",
        *args,
    )


@pytest.mark.parametrize(
    ("options", "bound"),
    [
        (
            (
                "-o",
                "rl_test_timeout=1.5",
            ),
            "the test's deadline",
        ),
        (
            (
                "-o",
                "rl_exchange_timeout=1",
            ),
            "Limits.exchange = 1 s",
        ),
    ],
)
def test_a_stream_that_never_ends_fails_by_its_bound(pytester, hostile, options, bound):
    t0 = time.monotonic()
    with Budget("suite", f"a stream that never ends, {options[0]}", seconds=30, rss_mb=200):
        result = run(pytester, hostile, *options)
    elapsed = time.monotonic() - t0
    report = json.loads((pytester.path / "r.json").read_text())
    verdict = report["clauses"]["INF-SSE-1"]
    assert verdict["outcome"] == "fail", verdict
    assert bound in verdict["evidence"], verdict["evidence"]
    assert "the stream was still sending" in verdict["evidence"], verdict["evidence"]
    # two streaming tests, each ended by the bound (well under what an endless stream would take)
    assert elapsed < 20, elapsed
    assert "Traceback" not in "\n".join(result.outlines)
