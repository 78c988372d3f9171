"""Child processes the tests start (servers, the `rlrollout` program) and how each one ends:
however a test ends, what it started does not outlive it."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The `rlrollout` program from the checkout (what `python -m pytest_rlrollout.cli` runs).
PROGRAM = "from pytest_rlrollout.cli import program; program()"
# Ctrl-C reaches the child as it would from a terminal, however pytest was started: a shell
# running pytest in the background without job control ignores SIGINT, every child inherits that,
# and a command leaves an ignored signal ignored (`nohup`).
DEFAULT_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


@dataclass
class Child:
    """A process started by `started`: what it printed up to the line waited for, and a queue of
    the lines after it (None once its output ended)."""

    proc: subprocess.Popen
    printed: list[str]
    lines: queue.Queue = field(repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def named(self, prefix: str) -> str:
        """The value of the printed line `prefix: value`."""
        return next(x for x in self.printed if x.startswith(prefix + ":")).split(":", 1)[1].strip()

    @property
    def url(self) -> str:
        """`rlrollout serve`'s base URL (the gateway's, on the CoreWeave dialect)."""
        return self.named("gateway" if any(x.startswith("gateway:") for x in self.printed) else "base URL")

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def bucket(self) -> Path:
        return Path(self.named("bucket"))

    def rest(self, timeout: float) -> list[str]:
        """The lines it printed until it ended, within `timeout` seconds (else AssertionError,
        and it is killed)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            ended(self.proc, within=0)
            raise AssertionError(f"still running after {timeout:g} s") from None
        out = []
        while (line := self.lines.get(timeout=10)) is not None:
            out.append(line)
        return out


def started(
    code: str, *args: str, until: str, within: float = 60.0, session: bool = False, env: dict[str, str] | None = None
) -> Child:
    """`python -c CODE ARGS` from the checkout (in a session of its own with `session`: as a
    terminal's foreground job, whose process group a Ctrl-C reaches; with `env` added to the
    environment), once it printed a line starting with `until` (AssertionError, and it is
    killed, if it did not within `within` seconds or ended first)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", DEFAULT_SIGINT + code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=session,
        env={**os.environ, **(env or {})},
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    printed: list[str] = []
    deadline = time.monotonic() + within
    while not printed or not printed[-1].startswith(until):
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            ended(proc, within=0)
            raise AssertionError(f"no {until!r} line within {within:g} s: {printed[-20:]}") from None
        if line is None:
            proc.wait()
            raise AssertionError(
                f"ended ({proc.returncode}) before a {until!r} line: {printed[-20:]} {proc.stderr.read()[-2000:]}"
            )
        printed.append(line)
    return Child(proc, printed, lines)


def serving(*args: str) -> Child:
    """`rlrollout serve ARGS` in a process of its own, once it serves."""
    return started(PROGRAM, "serve", *args, until="serving")


def ended(proc: subprocess.Popen, *, group: bool = False, within: float = 30.0) -> int:
    """End `proc` (its whole process group with `group`: a child started in a session of its
    own): SIGTERM, then SIGKILL if it still runs `within` seconds later. Its exit status."""
    if proc.poll() is None:
        _signal(proc, signal.SIGTERM, group)
        try:
            return proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            pass
    _signal(proc, signal.SIGKILL, group)  # a group's other members may outlive its leader
    return proc.wait(timeout=30)


def _signal(proc: subprocess.Popen, signum: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
