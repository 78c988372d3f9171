"""The recorder writes down what the client saw, event by event, and replays the same events."""

import json

import httpx
import pytest

from pytest_rlrollout.contract.schemas import is_valid
from pytest_rlrollout.remote.cassette import Cassette, CassetteMiss, CassetteTransport
from pytest_rlrollout.remote.cassette_file import shape_problem
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.shipped import shipped

KEY = Secret("sk-recorded-secret")
CHUNKS = [{"model": "m@s1", "choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in ("a", "b")]


def crlf_stream(request: httpx.Request) -> httpx.Response:
    """A legal SSE stream framed with CRLF, delivered in reads that split the line endings."""
    body = "".join(f"data: {json.dumps(c)}\r\n\r\n" for c in CHUNKS) + "data: [DONE]\r\n\r\n"
    raw = body.encode()
    reads = [raw[i : i + 7] for i in range(0, len(raw), 7)]
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=httpx.ByteStream(b"".join(reads)))


def client(transport) -> DeploymentClient:
    return DeploymentClient(Target("accounts/a/deployments/d", "http://x", "m", KEY), transport=transport)


def test_a_crlf_stream_records_event_by_event_and_replays_the_same(tmp_path):
    cassette = Cassette(tmp_path / "c.json")
    recorder = CassetteTransport("record", KEY, tmp_path, cassette, inner=httpx.MockTransport(crlf_stream))
    body = {"prompt": [1, 2], "max_tokens": 2, "stream": True}
    recorded = client(recorder).complete(body)
    assert recorded.done and [c["choices"][0]["text"] for c in recorded.chunks] == ["a", "b"]
    cassette.write(KEY)
    entry = json.loads((tmp_path / "c.json").read_text())["interactions"][0]
    assert len(entry["response"]["events"]) == 3  # two chunks and [DONE], not one blob
    assert KEY.reveal() not in (tmp_path / "c.json").read_text()

    replayer = CassetteTransport("replay", KEY, tmp_path, Cassette.load(tmp_path / "c.json"))
    replayed = client(replayer).complete(body)
    assert replayed.events == recorded.events and replayed.chunks == recorded.chunks and replayed.done
    with pytest.raises(CassetteMiss, match="no recorded answer"):
        client(replayer).complete(body)  # each recorded answer is given once


def test_every_shipped_cassette_is_of_the_shape_the_schema_describes():
    """schemas/cassette.schema.json is the shape the recorder writes: every shipped recording
    has it, and the loader finds nothing wrong in any (what the schema cannot say included)."""
    files = sorted(shipped("cassettes").rglob("*.json"))
    assert len(files) > 100
    for path in files:
        doc = json.loads(path.read_text())
        assert is_valid("cassette", doc), path
        assert shape_problem(doc) is None, path
