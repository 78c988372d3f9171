"""Replaying a cassette directory from anyone: the loader reads it as data. Only regular files
inside the directory are read, each refused by its size before a byte is read, never waited on;
a cassette of the wrong shape is a `CassetteError` naming the file and the field when it is
loaded, never a KeyError or a wrong verdict later; its content is never shown whole and never
becomes a path. Tested on the loader itself (`read_regular`, `parse`, `Cassette.load`,
`cassette_files`, `digest`, `CassetteTransport`); the suite's use of it is in test_replay.py."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_rlrollout.remote import cassette as cassettes
from pytest_rlrollout.remote.cassette import (
    Cassette,
    CassetteMiss,
    CassetteTransport,
    cassette_files,
    digest,
    request_key,
)
from pytest_rlrollout.remote.cassette_file import MAX_FILE, CassetteError, read_regular, shown_path
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.drivers.fireworks import HotLoadAPI
from pytest_rlrollout.remote.limits import LimitExceeded
from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.remote.transport import ExchangeFailed

from .budget import Budget, heap_returned, older_objects_frozen  # noqa: F401 (fixtures)

KEY = Secret("sk-cassette-test")
SECRET = "CONTENT-THAT-MUST-NOT-SHOW-5d2f"
TARGET = Target(None, "http://replay.invalid", "m", KEY, engine="openai")
MB = 2**20


pytestmark = pytest.mark.usefixtures("heap_returned")


def key_of(method: str, path: str, body: Any = None, **headers: str) -> str:
    content = json.dumps(body).encode() if body is not None else b""
    request = httpx.Request(
        method,
        f"http://replay.invalid{path}",
        content=content,
        headers={"Authorization": f"Bearer {KEY.reveal()}", **headers},
    )
    return request_key(request, KEY)


STATUS = "/hot_load/v1/models/hot_load"
COMPLETIONS = "/v1/completions"
PROMPT = {"model": "m", "prompt": "hi", "stream": True}


def valid() -> dict[str, Any]:
    """A cassette as the recorder writes one: a status, a stream, marks and meta."""
    chunk = json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}], "model": "m@snap"})
    return {
        "interactions": [
            {
                "key": key_of("GET", STATUS, **{"fireworks-model": "m"}),
                "t": 0.01,
                "response": {
                    "status": 200,
                    "headers": {"content-type": "application/json"},
                    "body": json.dumps({"replicas": [{"readiness": True, "current_snapshot_identity": "snap"}]}),
                },
            },
            {
                "key": key_of("POST", COMPLETIONS, PROMPT),
                "t": 0.02,
                "response": {
                    "status": 200,
                    "headers": {"content-type": "text/event-stream"},
                    "events": [{"t": 0.03, "data": f"data: {chunk}\n\n"}, {"t": 0.04, "data": "data: [DONE]\n\n"}],
                },
            },
        ],
        "marks": {"swap": [0.5, 1.5]},
        "meta": {"test": "test_x.py::test_y", "run_id": "abc"},
    }


def written(directory: Path, doc: Any, name: str = "c.json") -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return path


def refused(path: Path, root: Path, *words: str) -> str:
    """The CassetteError loading `path` gives: it names the file, says `words`, shows no more
    than an excerpt, and nothing else is raised."""
    with pytest.raises(CassetteError) as e:
        Cassette.load(path, root=root)
    message = str(e.value)
    shown = shown_path(path, root)
    assert message.startswith(f"{shown}: "), message
    assert all(w in message for w in words), message
    assert SECRET not in message and len(message) < 400 and "\n" not in message, message
    return message


def test_a_valid_cassette_loads_and_replays():
    """The control: what the recorder writes loads, and replays through the client."""
    with Budget("cassettes", "control: a valid cassette", seconds=3, rss_mb=50):
        doc = valid()
        transport = CassetteTransport("replay", KEY, Path("/nonexistent"), Cassette(Path("c.json"), doc))
        with DeploymentClient(TARGET, transport=transport) as c:
            assert HotLoadAPI(c).served_identities() == ["snap"]
            s = c.complete({"prompt": "hi", "stream": True})
            assert s.ok and s.done and s.finish_reason == "stop" and s.versions == ["snap"]
            assert c.mark("swap") == 0.5 and c.mark("swap") == 1.5


# --------------------------------------------------------------------------- the wrong shape


def change(edit: Callable[[dict[str, Any]], Any]) -> bytes:
    doc = copy.deepcopy(valid())
    edit(doc)
    return json.dumps(doc).encode()


def body(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["interactions"][0]["response"]


def events(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["interactions"][1]["response"]


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


SHAPES: dict[str, tuple[bytes, str]] = {
    # case: (the file's bytes, what the message says)
    "an empty file": (b"", "not JSON"),
    "not JSON": (b"{'interactions': []}", "not JSON"),
    "JSON cut short": (json.dumps(valid()).encode()[:-7], "not JSON"),
    "not UTF-8": (b'{"interactions": [], "marks": {}, "meta": {"x": "\xff\xfe"}}', "not UTF-8 (at byte 49)"),
    "a UTF-8 byte-order mark": (b"\xef\xbb\xbf" + json.dumps(valid()).encode(), "not JSON"),
    "a list (a _session.json)": (b"[1, 2]", "the document is an array, not an object"),
    "a string": (b'"cassette"', "the document is a string, not an object"),
    "null": (b"null", "the document is null, not an object"),
    "no meta (a _session.json)": (change(lambda d: d.pop("meta")), "the document has no 'meta'"),
    "no interactions": (change(lambda d: d.pop("interactions")), "the document has no 'interactions'"),
    "an unknown field": (change(lambda d: d.update(extra=1)), "the document has an unknown field 'extra'"),
    "nested 100,000 deep": (b"[" * 100_000 + b"]" * 100_000, "nested deeper than JSON is parsed here"),
    "meta nested 40 deep": (change(lambda d: d.update(meta=deep(40))), "meta nests deeper than 32 levels"),
    "meta nested 900 deep": (change(lambda d: d.update(meta=deep(900))), "meta nests deeper than 32 levels"),
    "meta a list": (change(lambda d: d.update(meta=[1])), "meta is an array, not an object"),
    "interactions an object": (change(lambda d: d.update(interactions={})), "interactions is an object, not an array"),
    "an interaction a number": (change(lambda d: d["interactions"].append(7)), "interactions[2] is an integer"),
    "a missing response": (change(lambda d: d["interactions"][0].pop("response")), "interactions[0] has no 'response'"),
    "a missing key": (change(lambda d: d["interactions"][1].pop("key")), "interactions[1] has no 'key'"),
    "a key that is a list": (
        change(lambda d: d["interactions"][0].update(key=["GET"])),
        "interactions[0].key is an array, not a string",
    ),
    "t a string": (change(lambda d: d["interactions"][0].update(t="0.1")), "interactions[0].t is a string"),
    "t NaN": (json.dumps(valid()).replace('"t": 0.01', '"t": NaN').encode(), "NaN is not a number JSON allows"),
    "t Infinity": (
        json.dumps(valid()).replace('"t": 0.01', '"t": -Infinity').encode(),
        "-Infinity is not a number JSON allows",
    ),
    "t 1e999 (infinite once read)": (
        json.dumps(valid()).replace('"t": 0.01', '"t": 1e999').encode(),
        "interactions[0].t is a number, not a finite number",
    ),
    "a status of 5,000 digits": (
        json.dumps(valid()).replace('"status": 200', '"status": ' + "9" * 5000).encode(),
        "not JSON",
    ),
    "a status that is a string": (
        change(lambda d: body(d).update(status="200")),
        "response.status is not an HTTP status",
    ),
    "a status that is true": (change(lambda d: body(d).update(status=True)), "response.status is not an HTTP status"),
    "a status of 99": (change(lambda d: body(d).update(status=99)), "response.status is not an HTTP status"),
    "a status of 1000": (change(lambda d: body(d).update(status=1000)), "response.status is not an HTTP status"),
    "a status of 200.0": (change(lambda d: body(d).update(status=200.0)), "response.status is not an HTTP status"),
    "a status of 10**30": (change(lambda d: body(d).update(status=10**30)), "response.status is not an HTTP status"),
    "headers a list": (
        change(lambda d: body(d).update(headers=[["a", "b"]])),
        "interactions[0].response.headers is an array, not an object",
    ),
    "a header value that is not ASCII": (
        change(lambda d: body(d)["headers"].update({"x-a": "caf\u00e9"})),
        "headers['x-a'] is not an ASCII string without line breaks",
    ),
    "a header value with a line break": (
        change(lambda d: body(d)["headers"].update({"x-a": "a\r\nSet-Cookie: b"})),
        "headers['x-a'] is not an ASCII string",
    ),
    "a header value that is a number": (
        change(lambda d: body(d)["headers"].update({"x-a": 5})),
        "headers['x-a'] is not an ASCII string",
    ),
    "a header name with a newline": (
        change(lambda d: body(d)["headers"].update({"x\nevil": "1"})),
        "a name that is not an HTTP token: 'x\\nevil'",
    ),
    "a header name with a space": (
        change(lambda d: body(d)["headers"].update({"x evil": "1"})),
        "a name that is not an HTTP token",
    ),
    "an empty header name": (
        change(lambda d: body(d)["headers"].update({"": "1"})),
        "a name that is not an HTTP token",
    ),
    "a body that is a number": (change(lambda d: body(d).update(body=5)), "response.body is an integer, not a string"),
    "a body that is null": (change(lambda d: body(d).update(body=None)), "response.body is null, not a string"),
    "a body that is an object": (
        change(lambda d: body(d).update(body={"replicas": []})),
        "response.body is an object, not a string",
    ),
    "a body with a lone surrogate": (
        json.dumps(valid()).replace('"body": "', '"body": "\\ud800').encode(),
        "body holds a lone surrogate",
    ),
    "both body and events": (change(lambda d: body(d).update(events=[])), "holds both 'body' and 'events'"),
    "neither body nor events": (change(lambda d: body(d).pop("body")), "holds neither 'body' nor 'events'"),
    "an unknown response field": (
        change(lambda d: body(d).update(cookies=[])),
        "response has an unknown field 'cookies'",
    ),
    "events an object": (change(lambda d: events(d).update(events={})), "response.events is an object, not an array"),
    "an event that is a string": (
        change(lambda d: events(d).update(events=["data: x\n\n"])),
        "events[0] is a string, not an object",
    ),
    "an event without data": (change(lambda d: events(d)["events"][0].pop("data")), "events[0] has no 'data'"),
    "an event whose data is a list": (
        change(lambda d: events(d)["events"][1].update(data=["x"])),
        "events[1] is not {t: a finite number, data: a string}",
    ),
    "an event whose t is null": (
        change(lambda d: events(d)["events"][0].update(t=None)),
        "events[0] is not {t: a finite number",
    ),
    "an event with a lone surrogate": (
        json.dumps(valid()).replace('"data": "', '"data": "\\udbff', 1).encode(),
        "data holds a lone surrogate",
    ),
    "marks a list": (change(lambda d: d.update(marks=[1])), "marks is an array, not an object"),
    "a mark of strings": (
        change(lambda d: d["marks"].update(swap=["soon"])),
        "marks['swap'] is not an array of finite numbers",
    ),
    "a mark that is a number": (change(lambda d: d["marks"].update(swap=1.0)), "marks['swap'] is not an array"),
    "a mark of booleans": (change(lambda d: d["marks"].update(swap=[True])), "marks['swap'] is not an array"),
    "JSON that parses to 20 times its size": (
        b'{"interactions": [], "marks": {}, "meta": {"a": [' + b"[]," * (8 * MB) + b"[]]}}",
        "would take about",
    ),
    "content shown only as an excerpt": (
        change(lambda d: body(d).update(status="x" * 100_000)),
        "response.status is not an HTTP status",
    ),
}


@pytest.mark.parametrize("case", SHAPES)
def test_a_cassette_of_the_wrong_shape_is_refused_naming_the_file_and_the_field(tmp_path, case):
    """These were KeyErrors, TypeErrors or wrong verdicts in the middle of a replay; now the load
    says which file and which field, in one line."""
    data, said = SHAPES[case]
    path = written(tmp_path / "cassettes", data, "test_mod/case.json")
    with Budget("cassettes", f"shape: {case}", seconds=3, rss_mb=200):
        refused(path, tmp_path / "cassettes", said)


# --------------------------------------------------------------------------- what is not a file


def outside_file(tmp_path: Path) -> Path:
    target = tmp_path / "outside" / "private.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"interactions": [], "marks": {}, "meta": {"secret": SECRET}}))
    return target


def sparse(path: Path, size: int) -> None:
    with path.open("wb") as f:
        f.truncate(size)


def fifo(path: Path) -> None:
    os.mkfifo(path)


def relative_link_out(directory: Path, tmp_path: Path) -> None:
    outside_file(tmp_path)
    (directory / "c.json").symlink_to(Path("..") / "outside" / "private.json")


def link_loop(directory: Path) -> None:
    (directory / "b.json").symlink_to(directory / "c.json")
    (directory / "c.json").symlink_to(directory / "b.json")


def unix_socket(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


FILES: dict[str, tuple[Callable[[Path, Path], object], str]] = {
    # case: (make the hostile `c.json` in the directory, given the test's tmp_path; what the message says)
    "a link to a file outside": (
        lambda d, t: (d / "c.json").symlink_to(outside_file(t)),
        "a link out of the cassette directory",
    ),
    "a relative link out": (lambda d, t: relative_link_out(d, t), "a link out of the cassette directory"),
    "a link to /etc/passwd": (lambda d, t: (d / "c.json").symlink_to("/etc/passwd"), "a link out"),
    "a link to /dev/zero": (lambda d, t: (d / "c.json").symlink_to("/dev/zero"), "a link out"),
    "a link to /proc/self/environ": (lambda d, t: (d / "c.json").symlink_to("/proc/self/environ"), "a link out"),
    "a dangling link": (lambda d, t: (d / "c.json").symlink_to(d / "nowhere.json"), "cannot be read"),
    "a link to itself": (lambda d, t: (d / "c.json").symlink_to(d / "c.json"), "cannot be read"),
    "a loop of two links": (lambda d, t: link_loop(d), "cannot be read"),
    "a FIFO": (lambda d, t: fifo(d / "c.json"), "a FIFO, not a regular file"),
    "a directory": (lambda d, t: (d / "c.json").mkdir(), "a directory, not a regular file"),
    "a socket": (lambda d, t: unix_socket(d / "c.json"), "cannot be opened"),
    "a 3 GB sparse file": (lambda d, t: sparse(d / "c.json", 3 * 2**30), "3,221,225,472 bytes, more than a cassette"),
    "one byte past the bound": (lambda d, t: sparse(d / "c.json", MAX_FILE + 1), "more than a cassette may hold"),
}


@pytest.mark.parametrize("case", FILES)
def test_what_is_not_a_regular_file_inside_is_refused_at_once(tmp_path, case):
    """A link out was read and its content printed in a traceback; a FIFO blocked the digest
    forever; a 3 GB sparse file was read whole (3.5 GB RSS). Now each is refused, by what it is,
    before a byte is read: by `Cassette.load`, `read_regular` and `digest` alike."""
    make, said = FILES[case]
    directory = tmp_path / "cassettes"
    directory.mkdir()
    made = make(directory, tmp_path)
    path = directory / "c.json"
    try:
        with Budget("cassettes", f"file: {case}", seconds=2, rss_mb=50, inputs=3):
            refused(path, directory, said)
            with pytest.raises(CassetteError, match=said):
                read_regular(path, directory)
            if (directory / "c.json").is_dir() and not (directory / "c.json").is_symlink():
                assert cassette_files(directory) == []  # a directory is walked into, not read
            else:
                with pytest.raises(CassetteError, match=r"^[bc]\.json: "):
                    digest(directory)
    finally:
        if isinstance(made, socket.socket):
            made.close()


def test_a_device_node_is_refused_not_read(tmp_path):
    """A character device inside the directory (made only where the test may make one)."""
    directory = tmp_path / "cassettes"
    directory.mkdir()
    try:
        os.mknod(directory / "c.json", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero: endless zeros
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")
    with Budget("cassettes", "file: a device node (/dev/zero)", seconds=2, rss_mb=50):
        refused(directory / "c.json", directory, "a character device, not a regular file")


@pytest.mark.parametrize("where", ["beside", "in a subdirectory"])
def test_a_link_inside_the_directory_is_read(tmp_path, where):
    """The control: a link to a cassette in the same directory is data like any other."""
    directory = tmp_path / "cassettes"
    target = written(directory, valid(), "real.json" if where == "beside" else "sub/real.json")
    (directory / "c.json").symlink_to(target)
    with Budget("cassettes", f"control: a link {where}", seconds=2, rss_mb=50):
        assert Cassette.load(directory / "c.json", root=directory).meta["run_id"] == "abc"
        assert digest(directory).startswith("sha256:")


def test_a_link_out_never_shows_what_it_points_to(tmp_path):
    """The file a link leads to is named, its content never shown: not in the message, not in
    the exception's chain."""
    directory = tmp_path / "cassettes"
    directory.mkdir()
    (directory / "c.json").symlink_to(outside_file(tmp_path))
    with Budget("cassettes", "file: a link out, its content", seconds=2, rss_mb=50), pytest.raises(CassetteError) as e:
        Cassette.load(directory / "c.json", root=directory)
    assert "private.json" in str(e.value) and SECRET not in str(e.value)
    assert e.value.__cause__ is None and (e.value.__context__ is None or e.value.__suppress_context__)


# --------------------------------------------------------------------------- the directory


@contextlib.contextmanager
def nested(root: Path, levels: int) -> Iterator[Path]:
    """`levels` directories one in another, removed after (both in loops: pathlib's mkdir and
    shutil.rmtree recurse, and pytest's clean-up of its temporary directories would fail)."""
    path = str(root)
    os.mkdir(path)
    for _ in range(levels):
        path += "/d"
        os.mkdir(path)
    try:
        yield Path(path)
    finally:
        for _ in range(levels + 1):
            for name in os.listdir(path):
                if not os.path.isdir(os.path.join(path, name)):
                    os.unlink(os.path.join(path, name))
            os.rmdir(path)
            path = os.path.dirname(path)


def test_a_cassette_nested_1000_directories_deep_is_refused(tmp_path):
    """os.walk recursed, one frame a directory: 1000 levels raised RecursionError."""
    with nested(tmp_path / "cassettes", 1000) as bottom:
        written(bottom, valid())
        with Budget("cassettes", "directory: a cassette 1000 directories deep", seconds=3, rss_mb=50, inputs=2):
            with pytest.raises(CassetteError, match=r"nested deeper than 16 directories"):
                cassette_files(tmp_path / "cassettes")
            with pytest.raises(CassetteError, match=r"nested deeper than 16 directories"):
                digest(tmp_path / "cassettes")


def test_a_cassette_16_directories_deep_is_found(tmp_path):
    with nested(tmp_path / "cassettes", 16) as bottom:
        written(bottom, valid())
        with Budget("cassettes", "control: a cassette 16 directories deep", seconds=2, rss_mb=50):
            assert cassette_files(tmp_path / "cassettes") == [Path("/".join(["d"] * 16)) / "c.json"]


def test_a_directory_of_too_many_files_is_refused_at_the_bound(tmp_path, monkeypatch):
    """The bound on entries, at 2,000 rather than 100,000 so the test makes few files (100,001
    took 5 s to make; the walk is the same)."""
    monkeypatch.setattr(cassettes, "MAX_FILES", 2_000)
    directory = tmp_path / "cassettes"
    directory.mkdir()
    for i in range(2_001):
        (directory / f"{i}.json").touch()
    with (
        Budget("cassettes", "directory: 2,001 files past a bound of 2,000", seconds=3, rss_mb=50),
        pytest.raises(CassetteError, match="more than 2,000 entries"),
    ):
        digest(directory)


def test_links_between_directories_are_never_walked(tmp_path):
    """A link to the directory itself, to its parent (a loop), and one out: the loops are not
    walked, the one out is refused."""
    directory = tmp_path / "cassettes"
    written(directory, valid(), "m/c.json")
    (directory / "m" / "self").symlink_to(directory / "m")
    (directory / "up").symlink_to(directory)
    with Budget("cassettes", "directory: links that loop, and one out", seconds=2, rss_mb=50, inputs=3):
        assert cassette_files(directory) == [Path("m/c.json")]
        (directory / "out").symlink_to(tmp_path)
        with pytest.raises(CassetteError, match="out: a link out of the cassette directory"):
            cassette_files(directory)


NAMES = ["caf\u00e9/\u00fc.json", "\U0001f600.json", " .json", "-rf.json", ".json", "a b/c d.json", "\u202etxt.json"]


def test_names_of_any_kind_digest_and_load(tmp_path):
    """Unicode names, names that are not UTF-8, names with a newline: found, digested, loaded;
    and a message naming a broken one is one printable line."""
    directory = tmp_path / "cassettes"
    for name in NAMES:
        written(directory, valid(), name)
    raw = os.fsencode(directory) + b"/\xff\xfe.json"
    with open(raw, "wb") as f:
        f.write(json.dumps(valid()).encode())
    newline = written(directory, b"not json", "a\nb.json")
    with Budget("cassettes", "directory: names of any kind", seconds=3, rss_mb=50, inputs=len(NAMES) + 2):
        found = cassette_files(directory)
        assert len(found) == len(NAMES) + 2
        first = digest(directory)
        assert first == digest(directory)
        for rel in found:
            if rel.name != "a\nb.json":
                assert Cassette.load(directory / rel, root=directory).meta["run_id"] == "abc"
        message = refused(newline, directory, "not JSON")
        assert message.startswith("a\\nb.json: ") and message.isprintable()
    broken = written(directory, b"[]", "\u00fcber.json")
    refused(broken, directory, "the document is an array")


@pytest.mark.parametrize("name", ["../outside/private.json", "/etc/passwd", "sub/../../outside/private.json"])
def test_a_name_never_leads_out_of_the_directory(tmp_path, name):
    """`CassetteTransport.load` takes a name the plugin builds; even one with '..' or a root
    reads nothing outside."""
    outside_file(tmp_path)
    directory = tmp_path / "cassettes"
    (directory / "sub").mkdir(parents=True)
    transport = CassetteTransport("replay", KEY, directory, Cassette(directory / "_session.json", valid()))
    with (
        Budget("cassettes", f"name: {name}", seconds=2, rss_mb=50),
        pytest.raises(CassetteError, match=r"a link out of the cassette directory|cannot be read") as e,
    ):
        transport.load(name)
    assert SECRET not in str(e.value)


# --------------------------------------------------------------------------- replaying what loaded


def replaying(doc: dict[str, Any], path: Path = Path("c.json")) -> DeploymentClient:
    transport = CassetteTransport("replay", KEY, path.parent, Cassette(path, doc))
    return DeploymentClient(TARGET, transport=transport)


def test_a_request_the_cassette_does_not_hold_is_a_miss_naming_the_file():
    """A request body that differs, a request asked once more than recorded, a wrong key, a mark
    never recorded: `CassetteMiss` naming the cassette, never an answer to another request."""
    transport = CassetteTransport("replay", KEY, Path("."), Cassette(Path("c.json"), valid()))
    other = Target(None, "http://replay.invalid", "m", Secret("sk-another-key"), engine="openai")
    with (
        Budget("cassettes", "replay: misses", seconds=3, rss_mb=50, inputs=4),
        DeploymentClient(TARGET, transport=transport) as c,
        DeploymentClient(other, transport=transport) as wrong_key,
    ):
        with pytest.raises(CassetteMiss, match=r"^c\.json: no recorded answer \(#1\) for ") as miss:
            c.complete({"prompt": "bye", "stream": True})
        assert "bye" in str(miss.value)
        HotLoadAPI(c).status()
        with pytest.raises(CassetteMiss, match=r"^c\.json: no recorded answer \(#2\)"):
            HotLoadAPI(c).status()
        with pytest.raises(CassetteMiss, match='"other"'):
            wrong_key.complete({"prompt": "hi", "stream": True})
        with pytest.raises(CassetteMiss, match="no recorded time #1 for 'never'"):
            c.mark("never")
        assert stream(c).ok  # what the cassette holds is still answered


def replayed(doc: dict[str, Any], call: Callable[[DeploymentClient], Any]) -> Any:
    with replaying(doc) as c:
        try:
            return call(c)
        except (LimitExceeded, ExchangeFailed) as e:
            return e


def stream(c: DeploymentClient) -> Any:
    return c.complete({"prompt": "hi", "stream": True})


REPLAYS: dict[str, tuple[Callable[[dict[str, Any]], Any], Callable[[DeploymentClient], Any], str]] = {
    # case: (what the cassette holds, what the client asks, what comes of it)
    "an event past Limits.event": (
        lambda d: events(d)["events"].insert(0, {"t": 0, "data": "data: " + "x" * (17 * MB)}),
        stream,
        "Limits.event",
    ),
    "more events than Limits.events": (
        lambda d: events(d).update(events=[{"t": 0, "data": "data: {}\n\n"}] * 20_001),
        stream,
        "Limits.events",
    ),
    "a body past Limits.body": (
        lambda d: body(d).update(body="x" * (33 * MB)),
        lambda c: HotLoadAPI(c).status(),
        "Limits.body",
    ),
    "a body that parses to 20 times its size": (
        lambda d: body(d).update(body="[" + "[]," * (8 * MB) + "[]]"),
        lambda c: HotLoadAPI(c).status(),
        "Limits.memory",
    ),
    "a gzip header on a body that is not gzip": (
        lambda d: body(d)["headers"].update({"content-encoding": "gzip"}),
        lambda c: HotLoadAPI(c).status(),
        "does not decode",
    ),
    "a brotli header": (
        lambda d: body(d)["headers"].update({"content-encoding": "br"}),
        lambda c: HotLoadAPI(c).status(),
        "'br'-encoded answer",
    ),
    "an event of bytes that are not UTF-8": (
        lambda d: events(d)["events"].insert(0, {"t": 0, "data": 'data: {"x": "\udcff"}\n\n'}),
        stream,
        "not UTF-8",
    ),
    "a status of 101": (lambda d: body(d).update(status=101), lambda c: HotLoadAPI(c).replicas(), "[]"),
}


@pytest.mark.parametrize("case", REPLAYS)
def test_what_a_cassette_replays_meets_the_clients_bounds(case):
    """A cassette that loads is still held to the client's bounds when it is replayed: it is as
    hostile as a deployment could be."""
    edit, call, said = REPLAYS[case]
    doc = valid()
    edit(doc)
    with Budget("cassettes", f"replay: {case}", seconds=5, rss_mb=250):
        got = replayed(doc, call)
    shown = str(got.problems if hasattr(got, "problems") else got)
    assert said in shown, shown


def test_bytes_that_are_not_utf8_replay_as_they_were_recorded(tmp_path):
    """The recorder keeps them (as escapes), so the replay finds the same fault the live run
    found; before, they were replaced and the replay passed what the live run failed."""
    raw = b'data: {"choices": [{"text": "\xff"}]}\n\ndata: [DONE]\n\n'
    answer = httpx.MockTransport(
        lambda r: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=raw)
    )
    recorded = Cassette(tmp_path / "c.json")
    with Budget("cassettes", "replay: bytes that are not UTF-8, recorded and replayed", seconds=3, rss_mb=50):
        recorder = CassetteTransport("record", KEY, tmp_path, recorded, inner=answer)
        with DeploymentClient(TARGET, transport=recorder) as c:
            live = stream(c)
        recorded.write(KEY)
        with replaying(Cassette.load(tmp_path / "c.json").data, tmp_path / "c.json") as c:
            again = stream(c)
    assert live.problems == again.problems and "not UTF-8" in live.problems[0], (live.problems, again.problems)
    assert live.events == again.events


def test_what_the_recorder_writes_its_loader_takes(tmp_path):
    """A deployment's odd answer (a non-ASCII or control character in a kept header, a status
    past 599) is recorded so that the recording still loads and replays the status."""
    odd = [(b"content-type", b"application/json"), (b"fireworks-backend-host", "h\u00e9".encode() + b"\x01")]
    answer = httpx.MockTransport(lambda r: httpx.Response(999, headers=odd, content=b"{}"))
    recorded = Cassette(tmp_path / "c.json")
    with Budget("cassettes", "record: a non-ASCII header and status 999, then load", seconds=3, rss_mb=50):
        recorder = CassetteTransport("record", KEY, tmp_path, recorded, inner=answer)
        with DeploymentClient(TARGET, transport=recorder) as c:
            live = c.request("GET", "http://x/v1/status")
        recorded.write(KEY)
        with replaying(Cassette.load(tmp_path / "c.json").data, tmp_path / "c.json") as c:
            again = c.request("GET", "http://x/v1/status")
    assert live.status_code == again.status_code == 999
    shown = again.headers["fireworks-backend-host"]
    assert shown.startswith("h\\x") and shown.endswith("\\x01") and shown.isascii(), shown


def test_a_key_json_escapes_is_scrubbed_too(tmp_path):
    key = Secret('sk-"quoted"\\-k\u00e9y')
    answer = httpx.MockTransport(lambda r: httpx.Response(200, json={"echo": key.reveal()}))
    recorded = Cassette(tmp_path / "c.json")
    recorder = CassetteTransport("record", key, tmp_path, recorded, inner=answer)
    with DeploymentClient(Target("accounts/a/deployments/d", "http://x", "m", key), transport=recorder) as c:
        c.request("GET", "http://x/v1/status")
    recorded.write(key)
    text = (tmp_path / "c.json").read_text()
    assert "quoted" not in text and "<scrubbed>" in text, text
