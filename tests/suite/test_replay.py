"""Record and replay: the shipped cassettes replay offline with no socket opened, tampering with a
recorded answer fails that clause, recording leaves no key behind and does not change what the
tests observe, and nothing machine-specific takes part in matching."""

import json
import shutil
from pathlib import Path

import pytest

from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.remote.cassette import Cassette, digest
from pytest_rlrollout.snapshot import tiny_moe
from pytest_rlrollout.suite.options import CONFORMANCE
from pytest_rlrollout.suite.recorded_session import SHIPPED_CASSETTES as SHIPPED

from ..support import FAST_POLLS
from .offline import NO_SOCKET

JUDGED = {"pass", "not-applicable"}


def replay(pytester, cassettes: Path, *args: str):
    pytester.makepyfile(nosocket=NO_SOCKET)
    pytester.syspathinsert()
    result = pytester.runpytest_inprocess(
        "-p", "nosocket", *args, f"--rl-replay={cassettes}", "--rl-report=r.json", "-p", "no:cacheprovider"
    )
    result.stdout.fnmatch_lines(["*wall time*", "sockets opened: 0"])
    doc = json.loads((pytester.path / "r.json").read_text())
    return {k: v["outcome"] for k, v in doc["clauses"].items()}, doc, result


def test_shipped_sync_cassettes_replay_offline(pytester):
    """The shipped `reference` cassettes are replayed offline the same way, from the installed
    wheel, by test_wheel_in_a_fresh_venv_runs_the_suite (test_live_runs.py)."""
    name = "reference-sync"
    copy = pytester.path / "elsewhere" / name  # another path than where they were recorded
    shutil.copytree(SHIPPED / name, copy)
    got, doc, result = replay(pytester, copy, str(CONFORMANCE))
    assert result.ret == 0
    assert {k: v for k, v in got.items() if v not in JUDGED} == {}
    p = doc["provenance"]
    assert p["mode"] == "replay" and p["cassettes"] == digest(copy) and p["deployment"].startswith("accounts/")


def _tamper(cassettes: Path, module: str, test: str, edit) -> None:
    """Apply `edit(response)` to the first recorded response of `test` it changes."""
    path = next((cassettes / module).glob(f"{test}*.json"))
    doc = json.loads(path.read_text())
    for entry in doc["interactions"]:
        if edit(entry["response"]):
            path.write_text(json.dumps(doc))
            return
    raise AssertionError(f"nothing to tamper with in {path.name}")


def _short_matrix(response) -> bool:
    import base64

    for event in response.get("events", []):
        if "routing_matrix" not in event["data"]:
            continue
        chunk = json.loads(event["data"][6:])
        for e in chunk["choices"][0]["logprobs"]["content"]:
            e["routing_matrix"] = base64.b64encode(base64.b64decode(e["routing_matrix"])[:-1]).decode()
        event["data"] = "data: " + json.dumps(chunk) + "\n\n"
        return True
    return False


def _drop_version(response) -> bool:
    for event in response.get("events", []):
        if '"model"' in event["data"] and "@" in event["data"]:
            chunk = json.loads(event["data"][6:])
            chunk["model"] = chunk["model"].partition("@")[0]
            event["data"] = "data: " + json.dumps(chunk) + "\n\n"
            return True
    return False


def _change_cached(response) -> bool:
    body = json.loads(response.get("body") or "{}")
    details = (body.get("usage") or {}).get("prompt_tokens_details")
    if not details or not details.get("cached_tokens"):
        return False
    details["cached_tokens"] += 1
    response["body"] = json.dumps(body)
    return True


@pytest.mark.parametrize(
    ("clause", "module", "test", "edit"),
    [
        ("R3-SHAPE-1", "test_r3", "test_matrices_hold_l_times_k_bytes", _short_matrix),
        ("VER-STREAM-1", "test_version", "test_streamed_chunks_carry_the_served_identity_completions", _drop_version),
        ("CACHE-RPT-1", "test_cache", "test_cached_tokens_reported_consistently_non-streamed", _change_cached),
    ],
)
def test_tampered_cassette_fails_its_clause(pytester, clause, module, test, edit):
    copy = pytester.path / "tampered"
    shutil.copytree(SHIPPED / "reference", copy)
    _tamper(copy, module, test, edit)
    got, _, _ = replay(pytester, copy, str(CONFORMANCE / f"{module}.py"))
    assert got[clause] == "fail", got
    assert {k for k, v in got.items() if v == "fail"} == {clause}, got


def test_recording_a_live_run_keeps_no_key_and_replays(pytester, tmp_path):
    """Record the swap module (mid-stream swaps) against a server with a secret key, then replay."""
    secret = "sk-live-0123456789abcdef"
    bucket = tmp_path / "bucket"
    cassettes = tmp_path / "cassettes"
    # swaps of 0.3 s: SWAP-ASYNC-4 needs two 0.05-s polls inside one, on a loaded CI machine too
    with reference_deployment(bucket, api_key=secret, token_delay=0.003, swap_delay=0.3, load_delay=0.03) as dep:
        args = [str(CONFORMANCE / m) for m in ("test_swap.py", "test_version.py", "test_cache.py")]
        args += [
            f"--rl-deployment={dep.name}",
            f"--rl-base-url={dep.base_url}",
            f"--rl-model={dep.model}",
            f"--rl-api-key={secret}",
            "--rl-allow-hot-load",
            f"--rl-bucket-url={bucket}",
            f"--rl-base-snapshot={bucket / tiny_moe.BASE_IDENTITY}",
            "-o",
            "rl_transition=ASYNC",
            f"--rl-record={cassettes}",
            "--rl-report=rec.json",
            "-p",
            "no:cacheprovider",
            *FAST_POLLS,
        ]
        recorded = pytester.runpytest_inprocess(*args)
        assert recorded.ret == 0, "\n".join(recorded.outlines[-30:])
    rec = {k: v["outcome"] for k, v in json.loads((pytester.path / "rec.json").read_text())["clauses"].items()}
    assert set(rec.values()) <= JUDGED, rec  # swaps in the middle of recorded streams were observed
    for path in [*cassettes.rglob("*.json"), *SHIPPED.rglob("*.json")]:
        text = path.read_text()
        assert secret not in text and "rl-reference-key" not in text, path
        assert '"authorization"' not in text.lower() and '"x-api-key"' not in text.lower(), path
        for entry in json.loads(text)["interactions"]:
            assert dep.base_url not in entry["key"] and "127.0.0.1" not in entry["key"], entry["key"][:200]
    got, _, _ = replay(pytester, cassettes, *args[:3])
    assert got == rec


def test_cassettes_load_as_plain_json(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"interactions": [], "marks": {}, "meta": {"x": "!!python/object:os.system"}}')
    assert Cassette.load(path).meta == {"x": "!!python/object:os.system"}  # data, never a constructor
