"""The suite against a deployment it was not written with: `transformers serve` (transformers'
own OpenAI-compatible server) serving the reference base from a local path on 127.0.0.1.

With `--rl-engine` left to auto, the preflight finds no hot-load API and judges a plain
OpenAI-compatible server. Every verdict is the server's: what it lacks is unsupported, what is
outside its engine not-applicable, and the two fails are real properties of it, each shown
with the exchange that proves it.
"""

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from pytest_rlrollout.remote.polling import wait_until
from pytest_rlrollout.suite.options import CONFORMANCE

from ..processes import ended

# What transformers 5.x's server gets wrong, by the contract's generic clauses.
EXPECTED_FAILS = {
    "INF-SSE-1": "did not end with data: [DONE]",  # its streams just stop
    "INF-ERR-1": "HTTP 500",  # a negative max_tokens or a string temperature crashes the handler
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def transformers_serve(tmp_path_factory, base_snapshot):
    """`transformers serve` of the reference base, started and stopped here."""
    command = shutil.which("transformers")
    if command is None:
        pytest.skip("transformers serve is not installed (pip install 'transformers[serving]')")
    port = free_port()
    log = (tmp_path_factory.mktemp("transformers-serve") / "serve.log").open("w")
    proc = subprocess.Popen(
        [command, "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", str(base_snapshot)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy():
        assert proc.poll() is None, f"transformers serve exited {proc.returncode}: {Path(log.name).read_text()[-2000:]}"
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, timeout=180, interval=0.25, what="transformers serve answering /health")
        yield url, str(base_snapshot)
    finally:
        ended(proc)
        log.close()


def test_the_suite_judges_transformers_serve_as_an_openai_server(pytester, transformers_serve):
    url, model = transformers_serve
    started = time.monotonic()
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE), "-p", "no:randomly", f"--rl-base-url={url}", f"--rl-model={model}", "--rl-report=r.json"
    )
    took = time.monotonic() - started
    assert took <= 60, f"{took:.0f} s"
    result.stdout.fnmatch_lines(
        ["rlrollout: engine openai (auto: no hot-load API and no engine's own API answers); capabilities:"]
    )
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["engine"]["name"] == "openai"
    got = {k: v["outcome"] for k, v in doc["clauses"].items()}
    assert "error" not in got.values(), {k: v for k, v in got.items() if v == "error"}
    assert {k for k, v in got.items() if v == "fail"} == set(EXPECTED_FAILS), got
    for cid, said in EXPECTED_FAILS.items():
        failed = [t for t in doc["clauses"][cid]["tests"] if t["outcome"] == "fail"]
        for t in failed:
            assert said in t["reason"], t["reason"]
            assert "Traceback" not in t["reason"] and not t["reason"].startswith(("KeyError", "IndexError"))
            assert any("/v1/completions -> " in e for e in t["exchanges"]), t["exchanges"]
    # the hot-load clauses are Fireworks': not-applicable, never a failure or an unjudged guess
    assert {got[c] for c in got if c.split("-")[0] in ("HL", "SWAP", "SESS", "VER", "R3")} == {"not-applicable"}
    assert got["INF-USAGE-1"] == "pass"
    assert got["CACHE-HIT-1"] == got["CACHE-RPT-1"] == "unsupported"  # it reports no cached tokens
    # nothing was judged on the suite's own snapshots
    assert not [c for c in got if c.startswith("SNAP") and got[c] != "not-applicable"]


def test_its_fails_reproduce_outside_the_suite(transformers_serve):
    """The second observation of each fail, as curl would make it (plain httpx, none of the
    suite's client, reader or SSE decoder): the raw stream has no `data: [DONE]`, and a negative
    max_tokens or a string temperature gets a 500 with no JSON error."""
    url, model = transformers_serve
    body = {"model": model, "prompt": "Hello", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        raw = b"".join(r.iter_raw())
    assert r.status_code == 200 and raw.count(b"data: {") >= 1, raw[:300]
    assert b"[DONE]" not in raw, raw[-300:]  # INF-SSE-1: a stream that just stops
    for bad in ({"max_tokens": -1}, {"max_tokens": 1, "temperature": "hot"}):  # INF-ERR-1
        r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "Hello", **bad}, timeout=60)
        assert r.status_code == 500, (bad, r.status_code, r.text[:200])
