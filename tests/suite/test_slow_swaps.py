"""Slow swaps judged right: a swap whose download takes longer than any stream the suite asks for
is still met by a stream (kept in flight one after another until the status shows it done, or
held across it by the engine's pause), the status is polled at most twice a second under the live
timing profile, a stream a pause holds silent longer than a read timeout is not cut, and a replay
of the run starts the streams the recording started."""

import itertools
import json
import threading
import time

from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.drivers import driver_for
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.snapshot import tiny_moe
from pytest_rlrollout.suite.options import CONFORMANCE

from .test_replay import JUDGED, replay

# A download of 2 s against live-profile streams of 256 tokens at 3 ms a token (0.8 s): no one
# stream outlasts the load; the swap itself (1.5 s, not ready) is seen by three polls 0.5 s apart.
PACE = {"token_delay": 0.003, "swap_delay": 1.5, "load_delay": 2.0}
STATUS_PATHS = ("/hot_load/v1/models/hot_load",)  # GET: the status; POST: a signal


JITTER = 0.05  # seconds: how much closer two reads sent 0.5 s apart may arrive


def test_a_swap_slower_than_any_stream_is_still_met_by_one(pytester, tmp_path):
    """SWAP and VER on the Fireworks dialect with a 2-s download, under the live timing profile
    (recorded): every clause judged, no stream sized to outlast the load, at most two status polls
    a second; the replay of the recording starts the same streams and gives the same verdicts."""
    bucket, cassettes = tmp_path / "bucket", tmp_path / "cassettes"
    modules = [str(CONFORMANCE / m) for m in ("test_swap.py", "test_version.py")]
    with reference_deployment(bucket, **PACE) as dep:
        args = [
            *modules,
            "-p",
            "no:randomly",
            f"--rl-deployment={dep.name}",
            f"--rl-base-url={dep.base_url}",
            f"--rl-model={dep.model}",
            f"--rl-api-key={dep.api_key}",
            "--rl-allow-hot-load",
            f"--rl-bucket-url={bucket}",
            f"--rl-base-snapshot={bucket / tiny_moe.BASE_IDENTITY}",
            f"--rl-record={cassettes}",
            "--rl-report=rec.json",
            "-p",
            "no:cacheprovider",
        ]
        recorded = pytester.runpytest_inprocess(*args)
        assert recorded.ret == 0, "\n".join(recorded.outlines[-30:])
        log, ledger = list(dep.deployment.requests), list(dep.deployment.ledger)
        clock = time.time() - time.monotonic()  # the ledger's times are wall-clock, the log's monotonic
    # while a swap was under way: from its signal until its last replica served it
    swaps = [(e["signalled_at"] - clock, max(e["replicas"].values()) - clock) for e in ledger if e["replicas"]]
    polls = [at for method, path, at in log if method == "GET" and path in STATUS_PATHS]
    during = [[t for t in polls if start <= t <= end] for start, end in swaps]
    doc = json.loads((pytester.path / "rec.json").read_text())
    rec = {k: v["outcome"] for k, v in doc["clauses"].items()}
    assert set(rec.values()) <= JUDGED, {k: c["evidence"] for k, c in doc["clauses"].items() if k not in JUDGED}
    assert rec["SWAP-ASYNC-1"] == rec["SWAP-ASYNC-2"] == rec["SWAP-KV-1"] == rec["VER-STREAM-1"] == "pass", rec
    tests = [t for c in doc["clauses"].values() for t in c["tests"]]
    relayed = [
        t["test"] for t in tests if any("stream 1 ended" in m[1] for m in (t["timeline"] or {}).get("marks", []))
    ]
    assert len(relayed) >= 4, relayed  # the first stream ended before the swap: a later one met it
    gaps = [b - a for each in during for a, b in itertools.pairwise(each)]
    assert len(swaps) >= 10 and len(gaps) > 30 and min(gaps) >= 0.5 - JITTER, sorted(gaps)[:5]  # two a second
    got, _, _ = replay(pytester, cassettes, *modules)
    assert got == rec


def test_a_stream_held_by_a_pause_longer_than_a_read_timeout_is_not_cut(tmp_path):
    """vLLM's load pauses generation (keep) for as long as the reload takes: a stream in flight is
    silent all that time. Held (`DeploymentClient.held`), it waits past the client's read timeout
    and completes; a stream not held is cut by the read timeout, the suite's own bound."""
    with reference_deployment(tmp_path / "bucket", engine="vllm", token_delay=0.005, load_delay=1.5) as dep:
        target = Target(None, dep.base_url, dep.model, dep.api_key, engine="vllm")
        with DeploymentClient(target, timeout=0.5) as client:
            driver = driver_for("vllm", client, bucket=str((tmp_path / "bucket").resolve()))
            driver.load_wait = 10.0  # the reload's own request is answered once it is done
            body = {"prompt": "a b c d", "max_tokens": 60, "ignore_eos": True, "stream": True}
            outcomes: dict[str, object] = {}

            def stream(name: str, hold: float | None) -> None:
                started = threading.Event()
                try:
                    if hold is None:
                        outcomes[name] = driver.complete(body, on_chunk=lambda _: started.set())
                    else:
                        with client.held(hold):
                            outcomes[name] = driver.complete(body, on_chunk=lambda _: started.set())
                except Exception as e:
                    outcomes[name] = e

            threads = [threading.Thread(target=stream, args=a) for a in (("held", 5.0), ("not held", None))]
            for t in threads:
                t.start()
            answer = driver.load({"identity": tiny_moe.BASE_IDENTITY})  # pause (keep), a 1.5-s reload, resume
            for t in threads:
                t.join(timeout=30)
    assert answer.status_code == 200, answer.text
    held, cut = outcomes["held"], outcomes["not held"]
    assert (
        not isinstance(held, Exception) and held.status == 200 and held.done and held.usage["completion_tokens"] == 60
    ), held
    assert isinstance(cut, Exception) and "read timeout" in str(cut), cut
