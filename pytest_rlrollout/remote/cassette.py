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

Cassettes are data, never paths: a cassette directory may come from anyone. Only regular files
inside the directory are read (links are resolved and must stay inside; a FIFO or a device is
refused before a byte is read), each at most `MAX_FILE` bytes, and every cassette is checked
against the shape the recorder writes when it is loaded: anything else is a `CassetteError`
naming the file and what is wrong, never a KeyError or a wrong verdict later. Nothing here builds
a path from a cassette's content.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from pytest_rlrollout.remote.answers import read_capped
from pytest_rlrollout.remote.cassette_file import CassetteError, parse, printable_path, read_regular, shown_path
from pytest_rlrollout.remote.limits import LOCAL_LIMITS, Limits
from pytest_rlrollout.remote.secret import Redacted, Secret
from pytest_rlrollout.remote.sse import SSEDecoder
from pytest_rlrollout.remote.transport import bounded_transport

SCRUBBED = "<scrubbed>"
MATCHED_HEADERS = (
    "x-multi-turn-session-id",
    "x-session-affinity",
    "x-prompt-cache-isolation-key",
    "x-fireworks-hot-load-drain-timeout",
    "fireworks-model",
    "fireworks-deployment",
)
VOLATILE_BODY_FIELDS = ("request_id", "user", "metadata")  # differ between runs, change no answer
KEPT_RESPONSE_HEADERS = (
    "content-type",
    "retry-after",
    "fireworks-backend-host",
    "fireworks-cached-prompt-tokens",
    "fireworks-server-time-to-first-token",
    "fireworks-prompt-tokens",
)

MAX_FILES = 100_000  # entries (files and directories) in one cassette directory
MAX_DIRS = 16  # directories a cassette may sit under (the recorder writes one: its test module's)
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")  # what httpx can send back as a header (ASCII, no line breaks)


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
    module = re.sub(r"[^A-Za-z0-9_.-]+", "_", module).lstrip(".")[:80] or "_"  # never '..' or a separator
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", rest)[:80]
    return f"{module}/{safe}-{hashlib.sha1(pid.encode()).hexdigest()[:8]}.json"


# --------------------------------------------------------------------------- matching


def _auth_class(headers: httpx.Headers, key: Secret) -> str:
    # Redacted: the header holds the key, and this frame's locals may be shown
    auth = Redacted(headers.get("authorization", ""))
    given = Redacted(auth[7:] if auth.lower().startswith("bearer ") else headers.get("x-api-key", ""))
    return "key" if key.matches(given) else "none" if not given else "other"


def request_key(request: httpx.Request, key: Secret) -> str:
    body = request.content.decode("utf-8", "replace") if request.content else ""
    with contextlib.suppress(ValueError, RecursionError):
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
        key.redact(body, SCRUBBED),
    ]
    return _scrub(json.dumps(doc, sort_keys=True), key)


def _scrub(text: str, key: Secret) -> str:
    """`text` without the key, as it is and as JSON escapes it (a key with non-ASCII characters,
    quotes or backslashes is written escaped)."""
    text = key.redact(text, SCRUBBED)
    if key:
        for ascii_only in (True, False):
            escaped = json.dumps(key.reveal(), ensure_ascii=ascii_only)[1:-1]
            text = text.replace(escaped, SCRUBBED) if escaped != key.reveal() else text
    return text


def _ascii(value: str) -> str:
    """A header value as printable ASCII (what the loader takes and httpx sends back)."""
    return value if _HEADER_VALUE.fullmatch(value) else value.encode("unicode_escape").decode("ascii")


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
    def load(cls, path: Path, root: Path | None = None) -> Cassette:
        """A cassette read as data: a regular file inside `root` (by default its own directory;
        pass the cassette directory, so that a link out of it is refused too) of at most
        `MAX_FILE` bytes, of a cassette's shape. `CassetteError` naming the file otherwise."""
        path = Path(path)
        root = path.parent if root is None else Path(root)
        return cls(path, parse(read_regular(path, root), shown_path(path, root)))

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
                raise CassetteMiss(
                    f"{printable_path(Path(self.path.name))}: no recorded answer (#{i + 1}) for {key[:300]}"
                )
            self._cursor[key] += 1
            return entries[i]

    def record_mark(self, name: str, value: float) -> None:
        with self._lock:
            self.data["marks"].setdefault(name, []).append(value)

    def replay_mark(self, name: str) -> float:
        with self._lock:
            values, i = self.data["marks"].get(name, []), self._mark_cursor[name]
            if i >= len(values):
                raise CassetteMiss(f"{printable_path(Path(self.path.name))}: no recorded time #{i + 1} for {name!r}")
            self._mark_cursor[name] += 1
            return values[i]

    def replay_decision(self, name: str) -> bool:
        """Whether the recording took `name` (a decision it made on the live clock, such as
        starting one more stream)."""
        with self._lock:
            return name in self.data["marks"]

    def write(self, key: Secret) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = _scrub(json.dumps(self.data, indent=1, sort_keys=True), key)  # scrubbed before it is held
        self.path.write_text(text + "\n")


class _RecordedStream(httpx.SyncByteStream):
    """Passes a streamed body through chunk by chunk, writing down each SSE event and its offset
    (split by the same decoder the client uses, so any legal framing records event by event,
    and an event past `Limits.event` is refused here as it is there). Bytes that are not UTF-8
    are kept as escapes (`surrogateescape`), so replay sends the same bytes and the client
    finds the same fault."""

    def __init__(self, inner: httpx.SyncByteStream, entry: dict[str, Any], t0: float, decoder: SSEDecoder):
        self.inner, self.entry, self.t0, self.decoder = inner, entry, t0, decoder

    def __iter__(self):
        events = self.entry["response"]["events"]

        def write(completed: list[str]) -> None:
            t = round(time.monotonic() - self.t0, 6)
            events.extend({"t": t, "data": event + "\n\n"} for event in completed)

        for chunk in self.inner:
            write(self.decoder.feed(chunk))
            yield chunk
        write(self.decoder.close())

    def close(self) -> None:
        self.inner.close()


def _bytes(text: str) -> bytes:
    """A recorded body or event as the deployment sent it (bytes that were not UTF-8 included)."""
    return text.encode("utf-8", "surrogateescape")


class _ReplayedStream(httpx.SyncByteStream):
    def __init__(self, events: list[dict[str, Any]]):
        self.events = events

    def __iter__(self):
        for e in self.events:
            yield _bytes(e["data"])


class CassetteTransport(httpx.BaseTransport):
    """`mode` 'record': forward to the network and write down; 'replay': answer from cassettes
    and never open a socket. The current cassette is switched per test by the plugin; `session`
    holds what happens outside tests. Recording reads a body to at most `limits.body` bytes and
    an SSE event to `limits.event` bytes, as the client does (its forwarding transport ends
    every read by the client's deadline)."""

    def __init__(
        self,
        mode: str,
        api_key: Secret,
        directory: Path,
        session: Cassette,
        *,
        record_mode: str = "rewrite",
        inner: httpx.BaseTransport | None = None,
        limits: Limits = LOCAL_LIMITS,
    ):
        self.mode, self.api_key, self.directory, self.session = mode, Secret(api_key), directory, session
        self.record_mode = record_mode  # rewrite | once
        self.limits = limits
        self.inner = inner if inner is not None else (bounded_transport() if mode == "record" else None)
        self.use(session)

    def use(self, cassette: Cassette) -> None:
        self.cassette, self.t0 = cassette, time.monotonic()

    def load(self, name: str) -> Cassette:
        """The cassette `name` (a path relative to the directory, as `cassette_name` gives it),
        read as data from inside the directory."""
        return Cassette.load(self.directory / name, root=self.directory)

    def mark(self, name: str) -> float:
        if self.mode == "replay":
            return self.cassette.replay_mark(name)
        value = round(time.monotonic() - self.t0, 6)
        self.cassette.record_mark(name, value)
        return value

    def decide(self, name: str, live: bool) -> bool:
        if self.mode == "replay":
            return self.cassette.replay_decision(name)
        if live:
            self.cassette.record_mark(name, round(time.monotonic() - self.t0, 6))
        return live

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = request_key(request, self.api_key)
        if self.mode == "replay":
            entry = self.cassette.next_for(key)
            r = entry["response"]
            stream = _ReplayedStream(r["events"]) if "events" in r else httpx.ByteStream(_bytes(r["body"]))
            return httpx.Response(r["status"], headers=r["headers"], stream=stream, request=request)
        request.read()
        request.headers["accept-encoding"] = "identity"  # bodies are stored as text
        start = time.monotonic()
        if self.inner is None:  # set for every recording: a replay never forwards
            raise RuntimeError("a recording CassetteTransport has no transport to forward to")
        response = self.inner.handle_request(request)
        what = f"{request.method} {request.url.path}"
        headers = {  # as the loader takes them: a value that is not printable ASCII kept as escapes
            k: _ascii(_scrub(v, self.api_key))
            for k, v in response.headers.items()
            if k.lower() in KEPT_RESPONSE_HEADERS
        }
        entry = {
            "key": key,
            "t": round(start - self.t0, 6),
            "response": {"status": response.status_code, "headers": headers},
        }
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            entry["response"]["events"] = []
            self.cassette.add(entry)
            decoder = SSEDecoder(self.limits.event, what=what, errors="surrogateescape")
            if not isinstance(response.stream, httpx.SyncByteStream):  # the forwarding transport is a sync one
                raise TypeError(f"{what}: the forwarding transport answered with an async stream")
            recorded = _RecordedStream(response.stream, entry, self.t0, decoder)
            return httpx.Response(response.status_code, headers=response.headers, stream=recorded, request=request)
        try:
            body = read_capped(response, self.limits.body, what)
        finally:
            response.close()
        entry["response"]["body"] = _scrub(body.decode("utf-8", "surrogateescape"), self.api_key)
        self.cassette.add(entry)  # once whole: a body cut short is never written down as an answer
        passed: Any = response.headers
        if response.headers.get("content-encoding", "identity").strip().lower() != "identity":  # decoded here
            passed = [(k, v) for k, v in response.headers.multi_items() if k.lower() != "content-encoding"]
        return httpx.Response(response.status_code, headers=passed, stream=httpx.ByteStream(body), request=request)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def cassette_files(directory: Path) -> list[Path]:
    """Every `*.json` under `directory`, relative to it, in a stable order; found without
    following links into other directories (a link that leads out: `CassetteError`; one that
    stays inside leads to files found where they are). Walked without recursion, at most
    `MAX_DIRS` directories deep and `MAX_FILES` entries in all (`CassetteError` past either)."""
    directory = Path(directory)
    inside = directory.resolve()
    found: list[Path] = []
    entries = 0
    todo: list[tuple[Path, int]] = [(directory, 0)]
    while todo:
        top, depth = todo.pop()
        try:
            listing = os.scandir(top)
        except OSError as e:
            raise CassetteError(f"{shown_path(top, directory)}: cannot be listed ({e.strerror})") from None
        with listing:
            for entry in listing:
                entries += 1
                if entries > MAX_FILES:
                    raise CassetteError(f"{printable_path(directory)}: more than {MAX_FILES:,} entries")
                path = Path(entry.path)
                if _walks_into(entry, path, directory, inside):
                    if depth >= MAX_DIRS:
                        raise CassetteError(f"{shown_path(path, directory)}: nested deeper than {MAX_DIRS} directories")
                    todo.append((path, depth + 1))
                elif entry.name.endswith(".json"):
                    found.append(path.relative_to(directory))
    return sorted(found)


def _walks_into(entry: os.DirEntry, path: Path, directory: Path, inside: Path) -> bool:
    """`entry` is a directory to walk; a link to a directory is never walked, and one that
    leads out of the cassette directory is a `CassetteError`."""
    if not entry.is_symlink():
        return entry.is_dir(follow_symlinks=False)
    try:
        linked_dir = entry.is_dir(follow_symlinks=True)
    except OSError:  # a loop of links: not a directory; reading it says what it is
        return False
    if linked_dir and not path.resolve().is_relative_to(inside):
        raise CassetteError(
            f"{shown_path(path, directory)}: a link out of the cassette directory {printable_path(directory)}"
        )
    return False


def digest(directory: Path) -> str:
    """sha256 over every cassette's name and bytes: which recording a replay ran. Reads only
    regular files inside the directory, each at most `MAX_FILE` bytes (`CassetteError` else)."""
    h = hashlib.sha256()
    for rel in cassette_files(directory):
        h.update(os.fsencode(rel.as_posix()))  # a name that is not UTF-8 included
        h.update(read_regular(Path(directory) / rel, directory))
    return "sha256:" + h.hexdigest()
