"""The counting transport: every exchange written down once its answer is read, with the bytes of
the request and of the answer as HTTP/1.1 sends them, and the replica the answer names."""

import httpx

from pytest_rlrollout.remote.counting import CountingTransport


def answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, headers={"fireworks-backend-host": "replica-1"}, content=b'{"ok": true}')


def test_each_exchange_is_counted_with_its_bytes_each_way_and_its_replica():
    """A POST and a GET through the transport: two exchanges, in order, each with its method, URL
    (no query), status, the replica its answer names, and exactly the bytes of its request line,
    header lines and body, and of its status line, header lines and body; `take` empties it."""
    counted = CountingTransport(httpx.MockTransport(answer))
    with httpx.Client(transport=counted, headers={"Accept-Encoding": "identity"}) as client:
        post = client.post("http://h:1/v1/completions?x=1", content=b"12345", headers={"a": "b"})
        client.get("http://h:1/health")
        first, second = counted.take()
    assert counted.exchanges == []
    assert (first.method, first.url, first.path, first.status, first.replica) == (
        "POST",
        "http://h:1/v1/completions",
        "/v1/completions",
        200,
        "replica-1",
    )
    head = sum(len(k) + len(v) + 4 for k, v in post.request.headers.raw) + 2
    assert first.sent == len("POST /v1/completions?x=1 HTTP/1.1\r\n") + head + 5
    head = sum(len(k) + len(v) + 4 for k, v in post.headers.raw) + 2
    assert first.received == len("HTTP/1.1 200 OK\r\n") + head + len(b'{"ok": true}')
    assert (second.method, second.path) == ("GET", "/health") and second.sent < first.sent
