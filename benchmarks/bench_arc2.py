"""ARC2 decode + verify, side by side with fireworks-delta-compression, on one ~1 GB diff.

    python benchmarks/bench_arc2.py [--gb 1.0]

Builds bf16 parent/target shards (weights ~N(0, 0.02), a training-step-like update of
+N(0, 1e-3) that changes ~96% of bf16 values), encodes the diff with the project codec, then decodes it (every Adler-32
checked) with:
  - fdc in place:   fireworks_delta_compression.delta_decompress_inplace (mmap, one thread; what a
                    server-style loader calls; it msyncs the file)
  - ours verify:    pytest_rlrollout.snapshot.arc2.verify_file (decode + check, nothing written)
  - ours apply:     pytest_rlrollout.snapshot.arc2.apply_files (decode + check + write the target file)
Each run is a fresh subprocess, so peak RSS (VmHWM) is that run's own. Prints throughput
in diff-GB/s, ratios against fdc, thread scaling, and peak RSS against 2 x largest tensor + 64 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TENSOR_ELEMS = 24 * 1024 * 1024  # 48 MB bf16 tensors, like a large expert or embedding slice
PER_FILE = 4


def build(root: Path, gb: float) -> tuple[list[str], int]:
    from pytest_rlrollout.snapshot import arc2
    from pytest_rlrollout.snapshot import safetensors_io as st

    rng = np.random.default_rng(0)
    (root / "parent").mkdir()
    (root / "target").mkdir()
    (root / "diff").mkdir()
    files, i = [], 0
    # the diff is ~60% of the target for this update, so size the target to give a ~gb diff
    n_tensors = max(1, round(gb * 1e9 / 0.6 / (2 * TENSOR_ELEMS)))
    while i < n_tensors:
        name = f"model-{len(files):05d}.safetensors"
        parent, target = {}, {}
        for _ in range(min(PER_FILE, n_tensors - i)):
            w = rng.standard_normal(TENSOR_ELEMS, dtype=np.float32) * 0.02
            parent[f"model.layers.{len(files)}.t{i}.weight"] = st.Tensor.bf16(w)
            w += rng.standard_normal(TENSOR_ELEMS, dtype=np.float32) * 1e-3
            target[f"model.layers.{len(files)}.t{i}.weight"] = st.Tensor.bf16(w)
            i += 1
        st.write_file(root / "parent" / name, st.entries_of(parent))
        st.write_file(root / "target" / name, st.entries_of(target))
        del parent, target
        arc2.encode_file(root / "parent" / name, root / "target" / name, root / "diff" / name)
        files.append(name)
    return files, 2 * TENSOR_ELEMS


CHILD = r"""
import json, os, sys, time
from pathlib import Path
mode, root, files, threads = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
t = time.perf_counter()
if mode == "fdc":
    from fireworks_delta_compression.compression import delta_decompress_inplace
    t = time.perf_counter()
    for f in files:
        delta_decompress_inplace(base_path=str(root / "work" / f), diff_path=str(root / "diff" / f), compression_format="arc_v2")
else:
    from pytest_rlrollout.snapshot import arc2
    out = (lambda f: root / "out" / f) if mode == "apply" else (lambda f: None)
    t = time.perf_counter()
    arc2.apply_files([arc2.FilePlan(f, root / "parent" / f, root / "diff" / f, out(f)) for f in files], threads=threads)
dt = time.perf_counter() - t
# VmHWM is this address space's peak RSS; ru_maxrss would include the forking parent's.
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"seconds": dt, "maxrss": hwm}))
"""


def run(mode: str, root: Path, files: list[str], threads: int = 1) -> dict:
    if mode == "fdc":
        shutil.rmtree(root / "work", ignore_errors=True)
        shutil.copytree(root / "parent", root / "work")
    if mode == "apply":
        shutil.rmtree(root / "out", ignore_errors=True)
        (root / "out").mkdir()
    r = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(root), json.dumps(files), str(threads)],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(r.stdout.strip().splitlines()[-1])
    if mode == "fdc":
        assert all((root / "work" / f).read_bytes() == (root / "target" / f).read_bytes() for f in files)
    if mode == "apply":
        assert all((root / "out" / f).read_bytes() == (root / "target" / f).read_bytes() for f in files)
    return result


def best(mode: str, root: Path, files: list[str], threads: int = 1, repeats: int = 3) -> dict:
    runs = [run(mode, root, files, threads) for _ in range(repeats)]
    return min(runs, key=lambda r: r["seconds"]) | {"maxrss": max(r["maxrss"] for r in runs)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0, help="approximate diff size")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as d:
        root = Path(d)
        t = time.perf_counter()
        files, largest = build(root, args.gb)
        diff = sum((root / "diff" / f).stat().st_size for f in files)
        target = sum((root / "target" / f).stat().st_size for f in files)
        print(
            f"diff {diff / 1e9:.2f} GB for a {target / 1e9:.2f} GB target ({len(files)} files, largest tensor "
            f"{largest / 1e6:.0f} MB); built in {time.perf_counter() - t:.0f} s; best of {args.repeats}"
        )
        rows = {
            "fdc in place (1 thread)": best("fdc", root, files, 1, args.repeats),
            "ours verify, 1 thread": best("verify", root, files, 1, args.repeats),
            "ours verify, 2 threads": best("verify", root, files, 2, args.repeats),
            "ours apply, 1 thread": best("apply", root, files, 1, args.repeats),
            "ours apply, 2 threads": best("apply", root, files, 2, args.repeats),
        }
        base = rows["fdc in place (1 thread)"]["seconds"]
        budget = 2 * largest + 64 * 2**20
        print(
            f"{'':28} {'seconds':>8} {'diff GB/s':>10} {'vs fdc':>7} {'peak RSS':>10}  (budget {budget / 2**20:.0f} MiB)"
        )
        for label, r in rows.items():
            print(
                f"{label:28} {r['seconds']:8.3f} {diff / 1e9 / r['seconds']:10.2f} {base / r['seconds']:6.2f}x "
                f"{r['maxrss'] / 2**20:8.0f} MiB {'ok' if r['maxrss'] <= budget else 'OVER'}"
            )
        v1, v2 = rows["ours verify, 1 thread"]["seconds"], rows["ours verify, 2 threads"]["seconds"]
        a1, a2 = rows["ours apply, 1 thread"]["seconds"], rows["ours apply, 2 threads"]["seconds"]
        print(f"second core: verify {v1 / v2:.2f}x, apply {a1 / a2:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
