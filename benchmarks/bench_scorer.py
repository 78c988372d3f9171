"""The local scorer on a production-sized model: the streaming scorer (the reference engine's
forward pass reading its weights layer by layer) on a Qwen3-30B-A3B-shaped base of sparse files
(48 layers, 128 experts, ~61 GB declared in bf16), scoring one 64-token sequence in a fresh
process.

    python benchmarks/bench_scorer.py

Prints the peak resident memory of that process beside the largest shard and the base (the
in-memory engine and transformers in float32 would hold ~2x the base: ~122 GB), and the wall
time. Goal (issue 31): peak RSS <= 2x the largest shard. The sparse base's weights are zeros,
so every token routes to the same 8 experts of each layer; a real model's tokens reach more
experts, each read and dropped in turn (more time, not more memory).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_validate import write_sparse_snapshot

GB = 1e9
TOKENS = 64

CHILD = """
import json, resource, sys, time
from pytest_rlrollout.numerics.scorer import local_scorer
t = time.perf_counter()
scorer = local_scorer(sys.argv[1])
scored = scorer.score(list(range(1, {tokens} + 1)))
print(json.dumps({{"scorer": scorer.name, "seconds": time.perf_counter() - t,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "routing": list(scored.routing.shape)}}))
"""


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "qwen3-30b-a3b-shaped"
        tensors, total = write_sparse_snapshot(base)
        shard = max(f.stat().st_size for f in base.glob("*.safetensors"))
        print(
            f"base: {tensors} tensors, {total / GB:.1f} GB declared in bf16 (~{2 * total / GB:.0f} GB in float32), "
            f"largest shard {shard / GB:.2f} GB"
        )
        t = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(tokens=TOKENS), str(base)], capture_output=True, text=True, check=True
        )
        wall = time.perf_counter() - t
        got = json.loads(done.stdout.strip().splitlines()[-1])
        ratio = got["peak_rss"] / shard
        print(
            f"scorer `auto` chose: {got['scorer']}; {TOKENS} tokens scored in {got['seconds']:.1f} s "
            f"({wall:.1f} s with the interpreter's start); routing {got['routing']}"
        )
        print(
            f"peak RSS {got['peak_rss'] / GB:.2f} GB = {ratio:.2f}x the largest shard "
            f"= {got['peak_rss'] / (2 * total):.4f}x the float32 model (goal <= 2x the largest shard: "
            f"{'met' if ratio <= 2 else 'MISSED'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
