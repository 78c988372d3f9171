"""Well-behaved streams while hostile requests hit the same replicas, measured side by side in one run.

    python benchmarks/bench_hostile.py

The deployment runs as `rlrollout serve` in its own process; the load comes from this one. 64
streamed completions (the victims) run first alone, then while 8 hostile clients send, as fast as
they are answered and with the victims' session keys (so to the same replicas): oversized bodies
(declared and chunked), out-of-range sampling parameters, a 1 MB text prompt, a prompt that
tokenizes past the context, conversations of 30,000 messages and of 4096 empty ones, JSON nested
100,000 deep, invalid UTF-8, and requests at the very edge of the parameter ranges (served, in the
victims' batches). Rounds alternate, unloaded then loaded, after one warm-up round.
Prints the victims' p99 gap between token chunks unloaded and loaded and their ratio, how many
victims ended early (must be none), and how the hostile requests were answered (never a 5xx).
Target: loaded p99 gap < 10x unloaded.
"""

from __future__ import annotations

import asyncio
import collections
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_deployment import Served

VICTIMS, HOSTILE_CLIENTS, MAX_TOKENS, ROUNDS = 64, 8, 128, 2
LIMIT = 1 << 20  # the deployment's default body limit


@dataclass
class Stream:
    """What one victim saw: when each token chunk arrived, and how its stream ended."""

    arrivals: list[float] = field(default_factory=list)
    done: bool = False
    error: bool = False

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


async def victim(dep: Served, session: str) -> Stream:
    """One streamed completion over a raw socket (a lean client: with httpx parsing 64 streams, the
    load generator would eat the core the server needs); a token chunk is one with a token_id."""
    body = json.dumps(
        {
            "model": dep.name,
            "prompt": "the victim's prompt",
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": True,
            "stream": True,
        }
    ).encode()
    reader, writer = await asyncio.open_connection(*address(dep))
    writer.write(head(dep, "/inference/v1/completions", session, f"Content-Length: {len(body)}") + body)
    out = Stream()
    status = (await reader.readline()).split()
    if status[1:2] != [b"200"]:
        out.error = True
        writer.close()
        return out
    tail = b""
    while True:
        data = await reader.read(65536)
        now = time.perf_counter()
        if not data:
            break
        window = tail + data
        out.arrivals += [now] * (window.count(b'"token_id"') - tail.count(b'"token_id"'))
        if b'{"error"' in window:
            out.error = True
            break
        if b"data: [DONE]" in window:
            out.done = True
            break
        tail = window[-16:]
    writer.close()
    return out


def address(dep: Served) -> tuple[str, int]:
    host, port = dep.base_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def head(dep: Served, path: str, session: str, framing: str, media: str = "application/json") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {dep.api_key}\r\n"
        f"x-multi-turn-session-id: {session}\r\nContent-Type: {media}\r\n{framing}\r\n\r\n"
    ).encode()


@dataclass(frozen=True)
class Hostile:
    name: str
    path: str
    body: bytes
    framing: str = "length"  # "length", "declared" (oversized: only the headers and 64 KB sent), "chunked"


def hostile_requests(model: str) -> list[Hostile]:
    def completion(**fields) -> bytes:
        return json.dumps({"model": model, "prompt": "hostile", "max_tokens": 8, **fields}).encode()

    def chat(messages) -> bytes:
        return json.dumps({"model": model, "messages": messages, "max_tokens": 8}).encode()

    c, h = "/inference/v1/completions", "/inference/v1/chat/completions"
    return [
        Hostile("2 MiB body, declared", c, completion(prompt="x" * (2 << 20)), "declared"),
        Hostile("2 MiB body, chunked", c, completion(prompt="x" * (2 << 20)), "chunked"),
        Hostile("top_k 10**30", c, completion(top_k=10**30, temperature=1)),
        Hostile("temperature 5e-324", c, completion(temperature=5e-324)),
        Hostile("seed -1", c, completion(seed=-1)),
        Hostile("1 MB text prompt", c, completion(prompt="x" * 1_000_000)),
        Hostile("prompt past the context", c, completion(prompt="\U0001f600" * 26_000)),
        Hostile("30,000 messages", h, chat([{"role": "", "content": ""}] * 30_000)),
        Hostile("4096 empty messages", h, chat([{"role": "user", "content": ""}] * 4096)),
        Hostile("nested 100,000 deep", c, b"[" * 100_000 + b"]" * 100_000),
        Hostile("invalid UTF-8", c, completion(prompt="\xff").replace(b"\\u00ff", b"\xff\xfe")),
        Hostile("edge: top_k 2**20, temperature 2", c, completion(top_k=1 << 20, temperature=2)),
        Hostile("edge: top_p 5e-324, seed 2**63-1", c, completion(top_p=5e-324, temperature=1, seed=2**63 - 1)),
    ]


async def send(dep: Served, req: Hostile, session: str) -> str:
    """The status the deployment answered `req` with ("reset": the connection closed without one)."""
    reader, writer = await asyncio.open_connection(*address(dep))
    try:
        if req.framing == "chunked":
            chunks = [req.body[i : i + 65536] for i in range(0, len(req.body), 65536)]
            framed = b"".join(b"%x\r\n%s\r\n" % (len(x), x) for x in chunks) + b"0\r\n\r\n"
            writer.write(head(dep, req.path, session, "Transfer-Encoding: chunked") + framed)
        else:
            body = req.body[:65536] if req.framing == "declared" else req.body
            writer.write(head(dep, req.path, session, f"Content-Length: {len(req.body)}") + body)
        status = (await reader.readline()).split()
        if status[1:2] and status[1] != b"200":
            return status[1].decode()
        # a served request: read it to its end, as a client would
        length = 0
        while line := (await reader.readline()).strip():
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        return "200"
    except (ConnectionError, asyncio.IncompleteReadError):
        return "reset"
    finally:
        writer.close()


async def attack(dep: Served, requests: list[Hostile], offset: int, stop: asyncio.Event, answers: collections.Counter):
    i = offset
    while not stop.is_set():
        req = requests[i % len(requests)]
        answers[(req.name, await send(dep, req, f"v{i % VICTIMS}"))] += 1
        i += 1


async def one_round(dep: Served, requests: list[Hostile], loaded: bool, answers: collections.Counter) -> list[Stream]:
    stop = asyncio.Event()
    attackers = [
        asyncio.create_task(attack(dep, requests, k, stop, answers)) for k in range(HOSTILE_CLIENTS if loaded else 0)
    ]
    if loaded:
        await asyncio.sleep(0.5)  # the victims start into a load already on
    streams = await asyncio.gather(*(victim(dep, f"v{i}") for i in range(VICTIMS)))
    stop.set()
    await asyncio.gather(*attackers)
    return list(streams)


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98]


async def measure(dep: Served) -> int:
    requests = hostile_requests(dep.name)
    answers: collections.Counter = collections.Counter()
    await one_round(dep, requests, True, collections.Counter())  # warm-up: imports, caches, templates
    streams: dict[bool, list[Stream]] = {False: [], True: []}
    seconds: dict[bool, float] = {False: 0.0, True: 0.0}
    for _ in range(ROUNDS):
        for loaded in (False, True):
            t = time.perf_counter()
            streams[loaded] += await one_round(dep, requests, loaded, answers)
            seconds[loaded] += time.perf_counter() - t
    gaps = {k: [g for s in v for g in s.gaps()] for k, v in streams.items()}
    early = {k: sum(not s.done or s.error or len(s.arrivals) != MAX_TOKENS for s in v) for k, v in streams.items()}
    unloaded, loaded = p99(gaps[False]), p99(gaps[True])
    ratio = loaded / unloaded
    sent = sum(answers.values())
    print(
        f"{VICTIMS} victims x {MAX_TOKENS} tokens, {ROUNDS} rounds each; {HOSTILE_CLIENTS} hostile clients sent "
        f"{sent} requests ({sent / seconds[True]:.0f}/s) during the loaded rounds"
    )
    for loaded_ in (False, True):
        label = "loaded  " if loaded_ else "unloaded"
        tokens = sum(len(s.arrivals) for s in streams[loaded_])
        print(
            f"  {label}: p50 gap {statistics.median(gaps[loaded_]) * 1000:6.1f} ms, p99 gap "
            f"{p99(gaps[loaded_]) * 1000:6.1f} ms, max {max(gaps[loaded_]) * 1000:6.1f} ms; "
            f"{tokens / seconds[loaded_]:6.0f} victim tokens/s; victims ended early: {early[loaded_]}"
        )
    print(f"p99 inter-chunk gap, loaded / unloaded: {ratio:.2f}x (target < 10x: {'met' if ratio < 10 else 'MISSED'})")
    print("hostile requests answered:")
    by_name: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for (name, status), n in answers.items():
        by_name[name][status] += n
    for name, statuses in by_name.items():
        print(f"  {name:36} " + ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items())))
    server_errors = sum(n for (_, status), n in answers.items() if status.startswith("5"))
    print(f"victims ended early: {early[False] + early[True]}; hostile requests answered 5xx: {server_errors}")
    return 0 if ratio < 10 and not early[False] + early[True] and not server_errors else 1


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        dep = Served("--bucket", str(Path(d) / "bucket"))
        try:
            return asyncio.run(measure(dep))
        finally:
            dep.close()


if __name__ == "__main__":
    sys.exit(main())
