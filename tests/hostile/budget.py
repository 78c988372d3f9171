"""What every hostile-input test asserts besides its outcome: bounded work (CPU time), no hang
(wall time within a multiple of the same bound: a machine busy with other tests stretches wall
time, never CPU time), bounded memory, and a row for the corpus summary (`build/hostile.{json,md}`:
inputs per target, the worst time and RSS seen)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROWS = Path(__file__).resolve().parents[2] / "build" / "hostile"
SAMPLE = 0.005  # seconds between RSS samples
HANG = 3  # wall time past this many times the CPU budget is a hang, however busy the machine


@pytest.fixture(scope="module")
def older_objects_frozen() -> Iterator[None]:
    """The objects older than the module are set aside from the collector (gc.freeze) while it
    runs: each test's gc.collect() walked every object the process holds, 0.1 s, 19 s of CPU
    over test_client.py and test_cassettes.py, and now walks what the module made, which is
    where an earlier test's garbage is."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def heap_returned(older_objects_frozen: None) -> None:
    """Memory freed by earlier tests goes back to the system first, so RSS growth measures what
    this test's inputs take rather than hiding in the heap an earlier test left (a module uses
    it autouse: `pytestmark = pytest.mark.usefixtures("heap_returned")`)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # glibc only
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class Budget:
    """`with Budget("validator", "nested header", seconds=5, rss_mb=200):` fails the test when
    the block uses more than `seconds` of this process's CPU time, lasts more than HANG times
    that, or grows this process's RSS by more than `rss_mb`
    (sampled every 5 ms: a spike shorter than that can slip through), and records one row.
    `inputs` counts the hostile inputs the block fed (a generator may feed many at once)."""

    def __init__(self, target: str, case: str, *, seconds: float, rss_mb: float, inputs: int = 1):
        self.target, self.case, self.seconds, self.rss_mb, self.inputs = target, case, seconds, rss_mb, inputs
        self._process = psutil.Process()
        self._done = threading.Event()
        self.elapsed = self.cpu = 0.0
        self.peak_mb = 0.0

    def __enter__(self) -> Budget:
        self._start_rss = self._process.memory_info().rss
        self._peak = self._start_rss
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        self._t0, self._cpu0 = time.monotonic(), time.process_time()
        return self

    def _sample(self) -> None:
        while not self._done.wait(SAMPLE):
            self._peak = max(self._peak, self._process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.monotonic() - self._t0
        self.cpu = time.process_time() - self._cpu0
        self._done.set()
        self._sampler.join()
        self._peak = max(self._peak, self._process.memory_info().rss)
        self.peak_mb = (self._peak - self._start_rss) / 2**20
        self._write_row()
        if exc[0] is None:
            assert self.cpu <= self.seconds, f"{self.case}: {self.cpu:.2f} s of CPU > {self.seconds} s"
            assert self.elapsed <= HANG * self.seconds, f"{self.case}: {self.elapsed:.2f} s > {HANG} × {self.seconds} s"
            assert self.peak_mb <= self.rss_mb, f"{self.case}: RSS grew {self.peak_mb:.0f} MB > {self.rss_mb} MB"

    def _write_row(self) -> None:
        ROWS.mkdir(parents=True, exist_ok=True)
        row = {
            "target": self.target,
            "case": self.case,
            "inputs": self.inputs,
            "seconds": round(self.elapsed, 3),
            "cpu_seconds": round(self.cpu, 3),
            "rss_mb": round(self.peak_mb, 1),
            "pid": os.getpid(),
        }
        (ROWS / f"{uuid.uuid4().hex}.json").write_text(json.dumps(row))


def assemble(rows: Path = ROWS) -> dict | None:
    """build/hostile.json and .md from this run's rows: per target the inputs fed, the worst
    time and the worst RSS growth (called at the session's end)."""
    files = sorted(rows.glob("*.json")) if rows.is_dir() else []
    if not files:
        return None
    table = [json.loads(p.read_text()) for p in files]
    targets: dict[str, dict] = {}
    for r in table:
        t = targets.setdefault(r["target"], {"cases": 0, "inputs": 0, "worst_seconds": 0.0, "worst_rss_mb": 0.0})
        t["cases"] += 1
        t["inputs"] += r["inputs"]
        if r["seconds"] >= t["worst_seconds"]:
            t["worst_seconds"], t["slowest"] = r["seconds"], r["case"]
        if r["rss_mb"] >= t["worst_rss_mb"]:
            t["worst_rss_mb"], t["hungriest"] = r["rss_mb"], r["case"]
    doc = {"targets": targets, "inputs": sum(t["inputs"] for t in targets.values())}
    (rows.parent / "hostile.json").write_text(json.dumps(doc, indent=2))
    lines = [
        "| target | cases | inputs | worst time (s) | slowest case | worst RSS growth (MB) | hungriest case |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, t in sorted(targets.items()):
        lines.append(
            f"| {name} | {t['cases']} | {t['inputs']} | {t['worst_seconds']} | {t['slowest']} | "
            f"{t['worst_rss_mb']} | {t['hungriest']} |"
        )
    (rows.parent / "hostile.md").write_text("\n".join(lines) + "\n")
    return doc
