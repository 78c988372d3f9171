"""A soak stopped from outside: `rlrollout soak` given SIGTERM, Ctrl-C or SIGKILL while its load
runs leaves none of its Locust processes running.

Locust runs in processes of their own sessions (a terminal's Ctrl-C reaches only the soak, which
stops them). Once, SIGTERM killed the soak at once, and its hub and workers kept running for good
(10 minutes and counting): the hub's drain failed writing to a pipe nobody read, before it quit."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from pathlib import Path

import pytest

from ..processes import PROGRAM, ended, started

pytestmark = pytest.mark.xdist_group("soak")  # each soak takes both cores: one at a time


def children(pid: int) -> dict[int, str]:
    """The processes whose parent is `pid`, with their command lines (from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            if ppid == pid:
                found[int(entry.name)] = command
    return found


class Watched:
    """Processes watched through pidfds (readable once a process ended; signalled by pidfd, so
    never a process that took a finished one's id)."""

    def __init__(self, pids: list[int]):
        self.fds: dict[int, int] = {}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # already ended
                self.fds[os.pidfd_open(pid)] = pid

    def ended_within(self, seconds: float) -> float:
        """Seconds until every one ended; AssertionError naming those still running after `seconds`."""
        t0, deadline = time.monotonic(), time.monotonic() + seconds
        while self.fds:
            ready, _, _ = select.select(list(self.fds), [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"still running {seconds:g} s after the signal: {sorted(self.fds.values())}")
            for fd in ready:
                del self.fds[fd]
                os.close(fd)
        return time.monotonic() - t0

    def kill(self) -> None:
        """SIGKILL those still running (a failed test leaves nothing behind)."""
        for fd in self.fds:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        self.fds = {}


@pytest.mark.parametrize(
    ("signum", "workers", "status"),
    [(signal.SIGTERM, 1, 130), (signal.SIGINT, 0, 130), (signal.SIGKILL, 1, -signal.SIGKILL)],
    ids=["SIGTERM, a master and a worker", "Ctrl-C, one Locust process", "SIGKILL, a master and a worker"],
)
def test_a_soak_stopped_from_outside_leaves_no_locust_process_running(tmp_path, signum, workers, status):
    """Once the soak's first progress line shows its load running, the signal: SIGTERM and Ctrl-C
    end the soak through its teardown (exit 130, as an interrupted command) and its Locust
    processes with it; after SIGKILL, which no teardown survives, the Locust processes see their
    parent gone and end by themselves. Every one within 20 s of the signal."""
    args = [
        "soak",
        "--seconds",
        "120",
        "--swaps",
        "20",
        "--every",
        "5",
        "--users",
        "4",
        "--workers",
        str(workers),
        f"--rl-report={tmp_path / 'report.json'}",
    ]
    soak = started(PROGRAM, *args, until="soak ", within=120)
    locust = {pid: c for pid, c in children(soak.pid).items() if "locust" in c}
    watched = Watched([soak.pid, *locust])
    try:
        assert len(locust) == 1 + workers, locust
        soak.proc.send_signal(signum)
        took = watched.ended_within(20)
        assert soak.proc.wait() == status, soak.proc.stderr.read()[-2000:]
        print(f"{signal.Signals(signum).name}: the soak and {len(locust)} Locust process(es) ended in {took:.1f} s")
    finally:
        watched.kill()
        ended(soak.proc, within=0)
