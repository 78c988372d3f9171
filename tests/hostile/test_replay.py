"""Replaying a cassette directory from someone else: its values are data, never paths. A broken or
hostile recording ends the run before any test with one line (exit 4), or makes the tests whose
cassettes are broken `error`s naming the cassette; it is never a verdict on a deployment, never a
traceback, and nothing is written outside the run's temporary directory."""

import json
import os
import shutil
import uuid

import pytest

from pytest_rlrollout.suite.options import CONFORMANCE
from pytest_rlrollout.suite.recorded_session import SHIPPED_CASSETTES as SHIPPED

from .budget import Budget


@pytest.fixture
def recording(pytester):
    """A copy of the shipped ASYNC recording to spoil."""
    copy = pytester.path / "recording"
    shutil.copytree(SHIPPED / "reference", copy)
    return copy


def spoil_meta(recording, **changes):
    path = recording / "_session.json"
    doc = json.loads(path.read_text())
    doc["meta"].update(changes)
    path.write_text(json.dumps(doc))


def replay(pytester, recording, *args):
    return pytester.runpytest_inprocess(
        str(CONFORMANCE / "test_session.py"), f"--rl-replay={recording}", "-p", "no:randomly", *args
    )


def one_usage_error(result, *words):
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines[-20:] + result.errlines
    errors = [line for line in result.errlines if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("ERROR: --rl-replay"), result.errlines
    assert all(w in errors[0] for w in words), errors[0]
    assert "Traceback" not in "\n".join(result.outlines + result.errlines)


@pytest.mark.parametrize("prefix", ["x/../../../../{outside}/ESCAPED", "/{outside}/ESCAPED", "..", "a\x00b", "é" * 70])
def test_a_traversal_run_id_writes_nothing_outside(pytester, recording, tmp_path_factory, prefix):
    outside = tmp_path_factory.getbasetemp().parent / f"outside-{uuid.uuid4().hex}"
    spoil_meta(recording, run_id=prefix.format(outside=str(outside).lstrip("/")))
    with Budget("cassettes", f"run_id {prefix[:20]!r}", seconds=10, rss_mb=150):
        result = replay(pytester, recording)
    one_usage_error(result, "meta.run_id is not allowed")
    assert not outside.exists()
    assert not any(p.name == "ESCAPED" for p in tmp_path_factory.getbasetemp().parent.rglob("ESCAPED"))


JUNK_META = {"run_id": 5, "deployment": [], "model": None}
JUNK_DISCOVERY = {
    "run_id": "abc",
    "deployment": "accounts/a/deployments/d",
    "model": "m",
    "discovery": {"capabilities": 1},
}
SESSIONS = {
    "a list": "[1, 2]",
    "no meta": json.dumps({"interactions": [], "marks": {}}),
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "meta of wrong types": json.dumps({"interactions": [], "marks": {}, "meta": JUNK_META}),
    "a discovery of junk": json.dumps({"interactions": [], "marks": {}, "meta": JUNK_DISCOVERY}),
    "not UTF-8": b"\xff\xfe{}",
}


@pytest.mark.parametrize(
    "start",
    [
        {"identity": "base", "logprobs": [["a"]]},
        {"identity": "", "logprobs": []},
        {"identity": "base", "logprobs": [[0.0] * 5000]},
        [1.0],
        {"logprobs": []},
    ],
)
def test_a_recorded_start_fingerprint_of_junk_is_one_usage_error(pytester, recording, start):
    discovery = json.loads((recording / "_session.json").read_text())["meta"]["discovery"]
    spoil_meta(recording, discovery={**discovery, "start": start})
    result = replay(pytester, recording)
    one_usage_error(result, "meta.discovery is not allowed")


@pytest.mark.parametrize("case", sorted(SESSIONS))
def test_a_broken_session_is_one_usage_error(pytester, recording, case):
    content = SESSIONS[case]
    path = recording / "_session.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with Budget("cassettes", f"_session.json: {case}", seconds=10, rss_mb=150):
        result = replay(pytester, recording)
    one_usage_error(result, "_session.json")


def test_a_session_that_is_a_directory_a_fifo_or_a_link_out(pytester, recording, tmp_path):
    secret = tmp_path / "outside.json"
    secret.write_text(json.dumps({"interactions": [], "marks": {}, "meta": {"token": "do-not-print-me"}}))
    session = recording / "_session.json"
    for make in (lambda: session.mkdir(), lambda: os.mkfifo(session), lambda: session.symlink_to(secret)):
        if session.is_dir() and not session.is_symlink():
            session.rmdir()
        elif session.exists() or session.is_symlink():
            session.unlink()
        make()
        with Budget("cassettes", f"_session.json as {session.lstat().st_mode:o}", seconds=10, rss_mb=150):
            result = replay(pytester, recording)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.errlines
        assert "do-not-print-me" not in "\n".join(result.outlines + result.errlines)


def test_a_huge_sparse_session_is_refused_unread(pytester, recording):
    session = recording / "_session.json"
    with open(session, "r+b") as f:
        f.truncate(3 * 2**30)  # 3 GB, nearly all hole
    with Budget("cassettes", "3 GB sparse _session.json", seconds=10, rss_mb=150):
        result = replay(pytester, recording)
    one_usage_error(result, "_session.json")


def test_a_broken_test_cassette_is_an_error_naming_it_not_a_finding(pytester, recording):
    cassette = next((recording / "test_session").glob("test_same_session_same_replica*.json"))
    doc = json.loads(cassette.read_text())
    doc["interactions"][0]["response"]["status"] = "two hundred"
    cassette.write_text(json.dumps(doc))
    with Budget("cassettes", "a cassette answer of the wrong type", seconds=20, rss_mb=150):
        result = replay(pytester, recording, "--rl-report=r.json")
    clauses = json.loads((pytester.path / "r.json").read_text())["clauses"]
    assert clauses["SESS-1"]["outcome"] == "error", clauses["SESS-1"]
    assert cassette.name in clauses["SESS-1"]["evidence"]
    assert clauses["SESS-2"]["outcome"] == "pass"  # the other cassettes still replay
    assert "Traceback" not in "\n".join(result.outlines)
