"""The reference deployment under load, measured side by side in one run.

    python benchmarks/bench_deployment.py

The deployment runs as `rlrollout serve` in its own process and the load comes from this one,
so the two cores are split as they would be between a server and its clients.
Prints: streamed tokens/s for one session and aggregate tokens/s at 32 concurrent sessions
(HTTP + SSE included, greedy decoding); signal -> every replica ready for a full, an
incremental (ARC2) and a LoRA snapshot at default timings (median of 5); and how long
`rlrollout serve` takes from launch to its first answered completion.
Targets: >= 1,000 tok/s one session, >= 5,000 tok/s at 32, <= 100 ms to ready, <= 1.5 s to serve.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from pytest_rlrollout.snapshot import build, tiny_moe

PROMPT = list(range(10, 74))
ENV: dict[str, str] = {}


async def stream_tokens(dep, session: str, max_tokens: int, prompt: list[int] = PROMPT, temperature: float = 0) -> int:
    """One streamed completion over a raw socket; counts token entries in the SSE bytes. (A lean
    client: with httpx parsing 32 streams, the load generator would eat the core the server needs.)"""
    body = json.dumps(
        {
            "model": dep.name,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "logprobs": True,
        }
    ).encode()
    host, port = dep.base_url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST /inference/v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {dep.api_key}\r\n"
        f"x-multi-turn-session-id: {session}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    status = (await reader.readline()).split()
    if status[1:2] != [b"200"]:
        raise RuntimeError(f"the deployment answered {b' '.join(status).decode()}")
    n, tail = 0, b""
    while True:
        data = await reader.read(65536)
        if not data:
            break
        window = tail + data
        n += window.count(b'"token_id"') - tail.count(b'"token_id"')
        tail = window[-16:]
        if b"data: [DONE]" in window:
            break
    writer.close()
    return n


async def throughput(dep, sessions: int, max_tokens: int, rounds: int) -> float:
    """Median tokens/s over `rounds` rounds of `sessions` concurrent streams, after one warm-up
    round (first prefills fill the prompt caches; a single round on 2 shared cores is noisy)."""
    await asyncio.gather(*(stream_tokens(dep, f"warm-{i}", 16) for i in range(sessions)))
    rates = []
    for r in range(rounds):
        t = time.perf_counter()
        counts = await asyncio.gather(*(stream_tokens(dep, f"s{i}-{r}", max_tokens) for i in range(sessions)))
        rates.append(sum(counts) / (time.perf_counter() - t))
    return statistics.median(rates)


def ready_latency(dep, bucket: Path, body: dict, lora: bool = False) -> tuple[float, float]:
    """(server-side, client-observed) seconds from the signal to every replica ready. Server-side
    comes from the ledger (signal received, validation included, to the last replica's swap);
    the client polls the status every 5 ms, as an eager trainer would."""
    h = dep.hot_load_headers()
    with httpx.Client(base_url=dep.base_url, timeout=30) as c:
        t = time.perf_counter()
        r = c.post("/hot_load/v1/models/hot_load", json=body, headers=h)
        assert r.status_code == 200, r.text
        while True:
            replicas = c.get("/hot_load/v1/models/hot_load", headers=h).json()["replicas"]
            if lora:
                done = all(any(a["identity"] == body["identity"] for a in x["loaded_adapters"]) for x in replicas)
            else:
                done = all(x["readiness"] and x["current_snapshot_identity"] == body["identity"] for x in replicas)
            if done:
                observed = time.perf_counter() - t
                break
            time.sleep(0.005)
        entry = next(
            e
            for e in c.get(f"/v1/accounts/rlrollout/deployments/{dep.name.rsplit('/', 1)[1]}/ledger", headers=h).json()[
                "entries"
            ]
            if e["identity"] == body["identity"]
        )
        return max(entry["replicas"].values()) - entry["received_at"], observed


class Served:
    """A `rlrollout serve` process and what it printed."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            # no pacing: the benchmark measures the engine, not the conformance pace
            [
                sys.executable,
                "-m",
                "pytest_rlrollout.cli",
                "serve",
                "--token-delay=0",
                "--swap-delay=0",
                "--load-delay=0",
                *args,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        out = ""
        for line in self.proc.stdout:
            out += line
            if line.startswith("serving"):
                break
        self.base_url = re.search(r"base URL:\s+(\S+)", out).group(1)
        self.name = re.search(r"deployment:\s+(\S+)", out).group(1)
        self.model = re.search(r"model:\s+(\S+)", out).group(1)
        self.api_key = "rl-reference-key"
        # the suite's options for it, as `serve` prints them (`rlrollout conformance ...`)
        self.options = re.search(r"conformance: rlrollout conformance (.+)", out).group(1).split()

    def hot_load_headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.api_key}",
            "fireworks-model": self.model,
            "fireworks-deployment": self.name,
        }

    def close(self) -> None:
        _end(self.proc)


def serve_startup() -> float:
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "pytest_rlrollout.cli", "serve"], stdout=subprocess.PIPE, text=True)
    try:
        out = ""
        for line in p.stdout:
            out += line
            if line.startswith("serving"):
                break
        url = re.search(r"base URL:\s+(\S+)", out).group(1)
        r = httpx.post(
            url + "/inference/v1/completions",
            json={"model": "accounts/rlrollout/deployments/reference", "prompt": [1, 2], "max_tokens": 4},
            headers={"Authorization": "Bearer rl-reference-key"},
        )
        assert r.status_code == 200
        return time.perf_counter() - t
    finally:
        _end(p)


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM (serve stops within a second when nothing is in flight), SIGKILL if it did not."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        bucket = Path(d) / "bucket"
        dep = Served("--bucket", str(bucket))
        try:
            one = throughput(dep, 1, 400, 5)
            many = throughput(dep, 32, 128, 5)
            one, many = asyncio.run(one), asyncio.run(many)
            print(f"tokens/s, 1 session:    {one:8.0f}   (target >= 1000: {'met' if one >= 1000 else 'MISSED'})")
            print(
                f"tokens/s, 32 sessions:  {many:8.0f}   (target >= 5000: {'met' if many >= 5000 else 'MISSED'}; {many / one:.1f}x one session)"
            )
            base = bucket / tiny_moe.BASE_IDENTITY
            full, inc, lora = [], [], []
            current = base
            for i in range(5):
                target = build.derive(current, bucket / f"full-{i}", build.perturbed(current, seed=i + 1))
                full.append(ready_latency(dep, bucket, {"identity": f"full-{i}"}))
                nxt = build.derive(target, Path(d) / f"t-{i}", build.perturbed(target, seed=100 + i))
                signal = build.make_incremental(target, nxt, bucket / f"inc-{i}")
                inc.append(ready_latency(dep, bucket, signal))
                build.make_lora(base, bucket / f"lora-{i}", base_model=dep.model, seed=i)
                lora.append(ready_latency(dep, bucket, {"identity": f"lora-{i}"}, lora=True))
                current = nxt
        finally:
            dep.close()
    for label, xs in (("full", full), ("incremental", inc), ("LoRA", lora)):
        server = statistics.median(x[0] for x in xs) * 1000
        client = statistics.median(x[1] for x in xs) * 1000
        print(
            f"signal -> all replicas ready, {label:11} median {server:5.1f} ms in the server, {client:5.1f} ms seen by a "
            f"5 ms poller (worst {max(x[1] for x in xs) * 1000:.1f}); target <= 100 ms: {'met' if max(server, client) <= 100 else 'MISSED'}"
        )
    s = serve_startup()
    print(
        f"rlrollout serve: first completion answered {s:.2f} s after launch (target <= 1.5 s: {'met' if s <= 1.5 else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
