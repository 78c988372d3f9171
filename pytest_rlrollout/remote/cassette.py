"""Record and replay of conformance runs at the HTTP transport of `DeploymentClient`.

One cassette (JSON, read with `json`: no pickle, no YAML tags) per test, plus `_session.json` for
what the session fixtures exchanged. A recorded streaming response is kept as one entry per SSE
event with its time offset, and the recorder hands each event to the client as it arrives, so a
swap can still happen in the middle of a stream being recorded (vcrpy would drain the stream
first). Replay yields the same events as separate chunks.

Matching is on method, path, query, the request headers that change what a deployment does
(session, affinity, isolation, drain timeout, model/deployment headers, and whether the API key
was right, missing or wrong) and the canonical JSON body; identical requests (status polls) are
answered in recorded order. Hosts, ports and absolute paths never take part.

Secrets: `Authorization` and `X-Api-Key` are never written, and any occurrence of the API key
in a stored header or body is replaced before writing.

Tests take times through `mark(name)`: live, the monotonic clock; recording, the same value also
written down; replaying, the recorded value, so timing-dependent verdicts are made on the
recorded timeline.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.remote.sse import SSEDecoder

SCRUBBED = "<scrubbed>"
MATCHED_HEADERS = ("x-multi-turn-session-id", "x-session-affinity", "x-prompt-cache-isolation-key",
                   "x-fireworks-hot-load-drain-timeout", "fireworks-model", "fireworks-deployment")  # fmt: skip
VOLATILE_BODY_FIELDS = ("request_id", "user", "metadata")  # differ between runs, change no answer
KEPT_RESPONSE_HEADERS = ("content-type", "retry-after", "fireworks-backend-host", "fireworks-cached-prompt-tokens",
                         "fireworks-server-time-to-first-token", "fireworks-prompt-tokens")  # fmt: skip


class CassetteMiss(Exception):
    """Replay met a request the cassette does not hold."""


def portable_id(nodeid: str) -> str:
    """A test's node id without the directory it was collected from (rootdirs differ)."""
    path, _, rest = nodeid.partition("::")
    return f"{Path(path).stem}::{rest}"


def cassette_name(nodeid: str) -> str:
    """A file name for a test: readable, and unique through a short hash of its portable id."""
    pid = portable_id(nodeid)
    module, _, rest = pid.partition("::")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", rest)[:80]
    return f"{module}/{safe}-{hashlib.sha1(pid.encode()).hexdigest()[:8]}.json"


def _auth_class(headers: httpx.Headers, key: Secret) -> str:
    auth = headers.get("authorization", "")
    given = auth[7:] if auth.lower().startswith("bearer ") else headers.get("x-api-key", "")
    return "key" if given == key.reveal() else "none" if not given else "other"


def request_key(request: httpx.Request, key: Secret) -> str:
    body = request.content.decode("utf-8", "replace") if request.content else ""
    with contextlib.suppress(ValueError):
        doc = json.loads(body)
        if isinstance(doc, dict):
            doc = {k: v for k, v in doc.items() if k not in VOLATILE_BODY_FIELDS}
        body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    headers = {h: request.headers[h] for h in MATCHED_HEADERS if h in request.headers}
    doc = [
        request.method,
        request.url.path,
        request.url.query.decode(),
        headers,
        _auth_class(request.headers, key),
        body,
    ]
    return _scrub(json.dumps(doc, sort_keys=True), key)


def _scrub(text: str, key: Secret) -> str:
    return text.replace(key.reveal(), SCRUBBED) if key else text


class Cassette:
    """The interactions and marks of one test (or of the session fixtures)."""

    def __init__(self, path: Path, data: dict[str, Any] | None = None):
        self.path = path
        self.data = data or {"interactions": [], "marks": {}, "meta": {}}
        self._lock = threading.Lock()
        self._cursor: dict[str, int] = defaultdict(int)
        self._mark_cursor: dict[str, int] = defaultdict(int)
        self._by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for entry in self.data["interactions"]:
            self._by_key[entry["key"]].append(entry)

    @classmethod
    def load(cls, path: Path) -> Cassette:
        return cls(path, json.loads(path.read_text()))

    @property
    def meta(self) -> dict[str, Any]:
        return self.data["meta"]

    def add(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.data["interactions"].append(entry)

    def next_for(self, key: str) -> dict[str, Any]:
        with self._lock:
            entries, i = self._by_key.get(key, []), self._cursor[key]
            if i >= len(entries):
                raise CassetteMiss(f"{self.path.name}: no recorded answer (#{i + 1}) for {key[:300]}")
            self._cursor[key] += 1
            return entries[i]

    def record_mark(self, name: str, value: float) -> None:
        with self._lock:
            self.data["marks"].setdefault(name, []).append(value)

    def replay_mark(self, name: str) -> float:
        with self._lock:
            values, i = self.data["marks"].get(name, []), self._mark_cursor[name]
            if i >= len(values):
                raise CassetteMiss(f"{self.path.name}: no recorded time #{i + 1} for {name!r}")
            self._mark_cursor[name] += 1
            return values[i]

    def write(self, key: Secret) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.data, indent=1, sort_keys=True)
        self.path.write_text(_scrub(text, key) + "\n")


class _RecordedStream(httpx.SyncByteStream):
    """Passes a streamed body through chunk by chunk, writing down each SSE event and its offset
    (split by the same decoder the client uses, so any legal framing records event by event)."""

    def __init__(self, inner: httpx.SyncByteStream, entry: dict[str, Any], t0: float):
        self.inner, self.entry, self.t0 = inner, entry, t0

    def __iter__(self):
        events = self.entry["response"]["events"]
        decoder = SSEDecoder()

        def write(completed: list[str]) -> None:
            t = round(time.monotonic() - self.t0, 6)
            events.extend({"t": t, "data": event + "\n\n"} for event in completed)

        for chunk in self.inner:
            write(decoder.feed(chunk))
            yield chunk
        write(decoder.close())

    def close(self) -> None:
        self.inner.close()


class _ReplayedStream(httpx.SyncByteStream):
    def __init__(self, events: list[dict[str, Any]]):
        self.events = events

    def __iter__(self):
        for e in self.events:
            yield e["data"].encode()


class CassetteTransport(httpx.BaseTransport):
    """`mode` 'record': forward to the network and write down; 'replay': answer from cassettes
    and never open a socket. The current cassette is switched per test by the plugin; `session`
    holds what happens outside tests."""

    def __init__(
        self,
        mode: str,
        api_key: Secret,
        directory: Path,
        session: Cassette,
        *,
        record_mode: str = "rewrite",
        inner: httpx.BaseTransport | None = None,
    ):
        self.mode, self.api_key, self.directory, self.session = mode, api_key, directory, session
        self.record_mode = record_mode  # rewrite | once
        self.inner = inner if inner is not None else (httpx.HTTPTransport() if mode == "record" else None)
        self.use(session)

    def use(self, cassette: Cassette) -> None:
        self.cassette, self.t0 = cassette, time.monotonic()

    def mark(self, name: str) -> float:
        if self.mode == "replay":
            return self.cassette.replay_mark(name)
        value = round(time.monotonic() - self.t0, 6)
        self.cassette.record_mark(name, value)
        return value

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = request_key(request, self.api_key)
        if self.mode == "replay":
            entry = self.cassette.next_for(key)
            r = entry["response"]
            stream = _ReplayedStream(r["events"]) if "events" in r else httpx.ByteStream(r["body"].encode())
            return httpx.Response(r["status"], headers=r["headers"], stream=stream, request=request)
        request.read()
        request.headers["accept-encoding"] = "identity"  # bodies are stored as text
        start = time.monotonic()
        response = self.inner.handle_request(request)
        headers = {
            k: _scrub(v, self.api_key) for k, v in response.headers.items() if k.lower() in KEPT_RESPONSE_HEADERS
        }
        entry = {
            "key": key,
            "t": round(start - self.t0, 6),
            "response": {"status": response.status_code, "headers": headers},
        }
        self.cassette.add(entry)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            entry["response"]["events"] = []
            stream = _RecordedStream(response.stream, entry, self.t0)
            return httpx.Response(response.status_code, headers=response.headers, stream=stream, request=request)
        body = response.read()
        entry["response"]["body"] = _scrub(body.decode("utf-8", "replace"), self.api_key)
        return httpx.Response(response.status_code, headers=response.headers, content=body, request=request)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def digest(directory: Path) -> str:
    """sha256 over every cassette's name and bytes: which recording a replay ran."""
    h = hashlib.sha256()
    for p in sorted(directory.rglob("*.json")):
        h.update(p.relative_to(directory).as_posix().encode())
        h.update(p.read_bytes())
    return "sha256:" + h.hexdigest()
