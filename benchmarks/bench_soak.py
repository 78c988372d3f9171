"""The soak's load against what the reference deployment serves alone, measured side by side in one run.

    python benchmarks/bench_soak.py [SECONDS]

The reference deployment runs as `rlrollout serve` in its own process, at full speed (no pace),
and is loaded three ways for SECONDS each (default 30), the same number of rollouts in flight
(64) and the same turn shape (32 tokens):
- alone: a lean asyncio client in this process (raw sockets, counting token entries in the SSE
  bytes), which costs the server as little CPU as a client can: what the deployment serves;
- `rlrollout soak` with Locust in one process, and with a master and 2 worker processes: the
  soak's rollouts (multi-turn, growing prefixes, parsed and judged), no swaps.
Prints each load's tokens/s and its ratio to the deployment alone, and the soak's own CPU (the
soak's process and its Locust processes, user + system) per 1,000 tokens.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# `rlrollout serve` at full speed in its own process, and the lean client's one stream
from bench_deployment import Served, stream_tokens

USERS, MAX_TOKENS = 64, 32


async def alone(dep: Served, seconds: float) -> float:
    """Tokens/s of USERS rollouts in flight from the lean client, back to back for `seconds`."""
    deadline = time.monotonic() + seconds

    async def user(i: int) -> int:
        rng, n, turn = random.Random(i), 0, 0
        while time.monotonic() < deadline:
            prompt = [rng.randrange(10, 500) for _ in range(48)]
            n += await stream_tokens(dep, f"alone-{i}-{turn // 4}", MAX_TOKENS, prompt, temperature=1.0)
            turn += 1
        return n

    t = time.monotonic()
    total = sum(await asyncio.gather(*(user(i) for i in range(USERS))))
    return total / (time.monotonic() - t)


def soak(dep: Served, seconds: float, workers: int, where: Path) -> tuple[float, float]:
    """(tokens/s the soak generated while its load ran, its CPU seconds per 1,000 tokens)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [
        sys.executable,
        "-m",
        "pytest_rlrollout.cli",
        "soak",
        "--swaps",
        "0",
        "--every",
        str(seconds),
        "--seconds",
        str(seconds + 60),
        "--users",
        str(USERS),
        "--workers",
        str(workers),
        *dep.options,
        f"--rl-report={where / 'report.json'}",
        "-q",
        "-p",
        "no:randomly",
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    books = json.loads((where / "soak" / "soak.json").read_text())
    per_second = {int(s): n for s, n in books["figures"]["per_second"].items()}
    span = max(per_second) - min(per_second) + 1
    tokens = books["figures"]["tokens"]
    return tokens / span, cpu / tokens * 1000


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    with tempfile.TemporaryDirectory() as d:
        dep = Served("--bucket", str(Path(d) / "bucket"))
        try:
            served = asyncio.run(alone(dep, seconds))
            one = soak(dep, seconds, 0, Path(d) / "one")
            two = soak(dep, seconds, 2, Path(d) / "two")
        finally:
            dep.close()
    print(
        f"{USERS} rollouts in flight, {MAX_TOKENS} tokens a turn, {seconds:g} s each, reference deployment at full speed"
    )
    print(f"the deployment alone (lean client):   {served:8.0f} tok/s")
    for label, (rate, cpu) in (("soak, Locust in one process:", one), ("soak, master + 2 Locust workers:", two)):
        print(
            f"{label:38}{rate:8.0f} tok/s = {rate / served:.2f}x alone; the soak's own CPU {cpu:.3f} s per 1,000 tokens"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
