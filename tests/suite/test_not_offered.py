""" "Not offered" is never "wrong": an OpenAI-compatible server that ignores an option the suite
asks for is `unsupported` for it, naming the option, and judged on what it does offer."""

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pytest_rlrollout.suite.options import CONFORMANCE

from ..support import conformance_module

MODEL = "plain-model"


@contextmanager
def plain_server(stream_usage: str, replicas: int = 0) -> Iterator[str]:
    """A small OpenAI-compatible completions server. `stream_usage`: "none" (a stream carries no
    usage, whatever the request asks; its non-streamed answers do), or "off-by-one" (the
    stream's usage counts one token more than it sent). `replicas`: 0, no prompt cache; N, N
    replicas taking requests in turn (no session affinity, no header naming the replica), each
    reporting a prompt it served before as cached."""
    served: list[set[str]] = [set() for _ in range(replicas)]
    turn = iter(range(1 << 30))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _json(self, status: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                return self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path != "/v1/completions":
                return self._json(404, {"error": {"message": f"no route {self.path}"}})
            try:
                req = json.loads(raw)
                n = int(req.get("max_tokens") or 16)
                prompt = len(str(req["prompt"]).split())
            except (ValueError, KeyError, TypeError) as e:
                return self._json(400, {"error": {"message": f"bad request: {e}"}})
            hit = 0
            if replicas:
                seen = served[next(turn) % replicas]
                hit, _ = (prompt if str(req["prompt"]) in seen else 0), seen.add(str(req["prompt"]))
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": n,
                "total_tokens": prompt + n,
                "prompt_tokens_details": {"cached_tokens": hit},
            }
            if not req.get("stream"):
                return self._json(
                    200,
                    {
                        "id": "c",
                        "object": "text_completion",
                        "model": MODEL,
                        "usage": usage,
                        "choices": [{"index": 0, "text": "a " * n, "finish_reason": "length"}],
                    },
                )
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            for i in range(n):
                choice = {"index": 0, "text": "a ", "finish_reason": "length" if i == n - 1 else None}
                self.wfile.write(
                    f"data: {json.dumps({'id': 'c', 'object': 'text_completion', 'choices': [choice]})}\n\n".encode()
                )
            if stream_usage == "off-by-one":
                wrong = {**usage, "completion_tokens": n + 1, "total_tokens": prompt + n + 1}
                self.wfile.write(f"data: {json.dumps({'id': 'c', 'choices': [], 'usage': wrong})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def usage_run(pytester, url: str) -> dict:
    """INF-USAGE-1 and CACHE-RPT-1, the clauses that read a stream's usage, against `url`."""
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE / "test_inference.py"),
        str(CONFORMANCE / "test_cache.py"),
        "-p",
        "no:randomly",
        "-k",
        "test_usage_matches_the_tokens or test_cached_tokens_reported_consistently",
        f"--rl-base-url={url}",
        f"--rl-model={MODEL}",
        "--rl-engine=auto",
        "--rl-report=r.json",
    )
    assert result.ret in (0, 1), "\n".join(result.outlines[-30:])
    return json.loads((pytester.path / "r.json").read_text())


def test_a_stream_without_usage_is_unsupported_and_the_clause_judged_on_the_rest(pytester):
    """A server that streams no usage though asked (`stream_options.include_usage`) while its
    non-streamed answers carry it (cached tokens included): INF-USAGE-1 and CACHE-RPT-1 pass on
    what it offers, and each one's streamed test is `unsupported`, naming the option."""
    with plain_server("none") as url:
        doc = usage_run(pytester, url)
    for cid in ("INF-USAGE-1", "CACHE-RPT-1"):
        clause = doc["clauses"][cid]
        tests = {t["test"].rsplit("[", 1)[-1].rstrip("]"): t for t in clause["tests"]}
        assert clause["outcome"] == "pass", (cid, clause)
        assert tests["non-streamed"]["outcome"] == "pass", (cid, tests)
        assert tests["streamed"]["outcome"] == "unsupported", (cid, tests)
        assert "stream_options.include_usage" in tests["streamed"]["reason"], (cid, tests["streamed"])


def test_a_stream_whose_usage_is_wrong_still_fails(pytester):
    """What the server does offer is judged: a streamed usage that miscounts is the clause's fail."""
    with plain_server("off-by-one") as url:
        doc = usage_run(pytester, url)
    clause = doc["clauses"]["INF-USAGE-1"]
    assert clause["outcome"] == "fail", clause
    failed = [t for t in clause["tests"] if t["outcome"] == "fail"]
    assert [t["test"].rsplit("[", 1)[-1].rstrip("]") for t in failed] == ["streamed"], clause["tests"]
    assert "completion_tokens" in failed[0]["reason"], failed[0]


def test_a_session_without_affinity_is_repeated_until_the_prefix_is_met(pytester):
    """CACHE-HIT-1 against two replicas that take requests in turn and name neither: the session
    header buys no affinity there, so the repeat is sent again until it reaches the replica that
    holds the prefix (a pass on that hit); it is never a fail for landing elsewhere."""
    with plain_server("none", replicas=2) as url:
        result = pytester.runpytest_inprocess(
            str(CONFORMANCE / "test_cache.py"),
            "-p",
            "no:randomly",
            "-k",
            "test_same_session_reuses_a_long_prefix",
            f"--rl-base-url={url}",
            f"--rl-model={MODEL}",
            "--rl-engine=auto",
            "--rl-report=r.json",
        )
    assert result.ret == 0, "\n".join(result.outlines[-30:])
    clause = json.loads((pytester.path / "r.json").read_text())["clauses"]["CACHE-HIT-1"]
    assert clause["outcome"] == "pass", clause


class _Stream:
    status, done, body = 200, True, b""

    def __init__(self, finish: str, usage: dict | None) -> None:
        self.finish_reason, self.usage = finish, usage


class _Crossing:
    error = None

    def __init__(self, tokens: int, finish: str, usage: dict | None) -> None:
        self.entries, self.stream = [{}] * tokens, _Stream(finish, usage)


def test_a_stream_across_a_swap_without_usage_is_counted_by_max_tokens():
    """SWAP-ASYNC-1/SYNC-1/KV-1 count a restart by usage; a stream without it (the option not
    offered) is counted by max_tokens (asked with ignore_eos): exactly as many passes, more fails,
    and one that stopped early cannot be counted (inconclusive), never a fail."""
    judge = conformance_module(CONFORMANCE / "test_swap.py", "_not_offered_test_swap").judge_completion
    seen = []
    judge(_Crossing(8, "length", None), lambda n, what: seen.append(n), asked=8)
    assert seen == [8]
    with pytest.raises(AssertionError, match="no usage"):
        judge(_Crossing(12, "length", None), lambda *_: None, asked=8)
    with pytest.raises(pytest.skip.Exception, match=r"^inconclusive: .*stream_options\.include_usage"):
        judge(_Crossing(5, "stop", None), lambda *_: None, asked=8)
    with pytest.raises(AssertionError, match="usage says 9"):
        judge(_Crossing(8, "length", {"completion_tokens": 9}), lambda *_: None, asked=8)
