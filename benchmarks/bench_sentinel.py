"""What a live swap test uploads: a sentinel delta (ARC2 diff changing one norm vector, or every
MoE router) against a full snapshot, on a Qwen3-30B-A3B-shaped base made of sparse files.

    python benchmarks/bench_sentinel.py

Prints bytes uploaded per sentinel, their ratio to the full snapshot, and the time to build one
(dominated, the first time, by the Adler-32 of every unchanged tensor, which is cached after).
Target: <= 1% of a full snapshot.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_validate import write_sparse_snapshot

from pytest_rlrollout.remote.bucket import Bucket
from pytest_rlrollout.runs.snapshots import SnapshotFactory


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = root / "bucket" / "qwen3-30b-a3b-shaped"
        base.parent.mkdir()
        tensors, total = write_sparse_snapshot(base)
        full = total + sum(p.stat().st_size for p in base.iterdir() if not p.name.endswith(".safetensors"))
        factory = SnapshotFactory(
            base, Bucket(base.parent), root / "work", "bench", root / "record.json", model="accounts/x/models/qwen3-30b"
        )
        factory.for_test("bench_sentinel::main")
        print(f"base: {tensors} tensors, {full / 1e9:.1f} GB declared")
        for label, change in (
            ("norm", None),
            ("routers", {n: ["negate"] for n in factory.router_tensors}),
            ("norm again", None),
        ):
            t = time.perf_counter()
            built = factory.sentinel(base.name, label.replace(" ", "-"), change)
            seconds = time.perf_counter() - t
            print(
                f"sentinel ({label}): {built.uploaded_bytes / 1e6:.2f} MB uploaded = "
                f"{100 * built.uploaded_bytes / full:.4f}% of the full snapshot, built in {seconds:.1f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
