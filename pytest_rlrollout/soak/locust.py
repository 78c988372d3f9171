"""Locust's processes for one soak, seen from the soak's process: started, fed orders, read, ended.

Locust runs in child processes only (importing it patches a process for gevent: see
`locustfile`). With no workers one process runs the hub and the rollout users; with N, a master
runs the hub and N worker processes on this machine run the users, the way Locust distributes a
test over machines; with `remote` more, the master listens on every interface and waits for that
many workers from other machines too (`remote_worker_command` is what such a machine runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from pytest_rlrollout.soak.plan import EVENT_PREFIX, KEY_ENV, PARENT_ENV, PLAN_ENV

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
START_TIMEOUT = 60.0  # seconds for the master to bind and every worker here to connect and spawn its users
REMOTE_TIMEOUT = 600.0  # ... and for workers on other machines, which people start by hand


class LocustError(RuntimeError):
    """Locust did not start, or ended without saying what it must (the log's tail says why)."""


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--loglevel", "WARNING", *args]


def remote_worker_command(master_host: str, master_port: int) -> str:
    """What another machine (with this package and its `soak` extra installed) runs to add its
    rollout workers to a soak's master: one worker process per core."""
    where = "$(python -c 'from pytest_rlrollout.soak.locust import LOCUSTFILE; print(LOCUSTFILE)')"
    return (
        f'{KEY_ENV}=<the deployment\'s API key> python -m locust -f "{where}" --worker '
        f"--master-host {master_host} --master-port {master_port} --processes -1"
    )


class Locust:
    """The soak's Locust processes. `events` holds what the hub printed, in order (each a dict:
    `master`, `spawned`, `turns`, `final`, `finished`), then None once its output ended."""

    def __init__(self, plan: Path, *, users: int, workers: int, workdir: Path, api_key: str | None, remote: int = 0):
        if users < 1 or workers < 0 or remote < 0:
            raise ValueError(f"{users} users on {workers} + {remote} workers: at least one user, no negative count")
        # absolute: Locust's processes run in `workdir` and are told their files by path
        self.plan, self.workdir = plan.resolve(), workdir.resolve()
        self.users, self.workers, self.remote = users, workers, remote
        self.start_timeout = REMOTE_TIMEOUT if remote else START_TIMEOUT
        # Locust reads LOCUST_* variables and locust.conf / [tool.locust] from the working
        # directory: a soak's processes see none of the user's
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}
        self.env |= {PLAN_ENV: str(self.plan), PARENT_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"}
        if api_key is not None:
            self.env[KEY_ENV] = api_key
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.hub: subprocess.Popen[str] | None = None
        self.worker_processes: list[subprocess.Popen[bytes]] = []
        self.port: int | None = None

    def __enter__(self) -> Locust:
        self.workdir.mkdir(parents=True, exist_ok=True)
        run = [
            "--headless",
            "-u",
            str(self.users),
            "-r",
            str(self.users),
            "--exit-code-on-error",
            "0",
            "--stop-timeout",
            "5",
            "--only-summary",
            "--logfile",
            str(self.workdir / "hub.log"),
        ]
        if self.workers or self.remote:
            run += [
                "--master",
                "--master-bind-host",
                "*" if self.remote else "127.0.0.1",
                "--master-bind-port",
                "0",
                "--expect-workers",
                str(self.workers + self.remote),
                "--expect-workers-max-wait",
                str(int(self.start_timeout)),
            ]
        self.hub = self._start(_command(*run), "hub", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        threading.Thread(target=self._read, args=(self.hub.stdout,), name="rlrollout-soak-hub", daemon=True).start()
        if self.workers or self.remote:
            first = self.next(START_TIMEOUT)
            if "master" not in first:
                raise LocustError(f"the master said {first} before its port{self._tail('hub')}")
            self.port = int(first["master"])
            for i in range(self.workers):
                worker = _command(
                    "--worker",
                    "--master-host",
                    "127.0.0.1",
                    "--master-port",
                    str(self.port),
                    "--logfile",
                    str(self.workdir / f"worker-{i}.log"),
                )
                self.worker_processes.append(self._start(worker, f"worker-{i}", stdout=subprocess.DEVNULL))
        return self

    def _start(self, command: list[str], name: str, **pipes: Any) -> subprocess.Popen[Any]:
        with open(self.workdir / f"{name}.err", "w") as err:
            return subprocess.Popen(
                command, cwd=self.workdir, env=self.env, stderr=err, text=True, start_new_session=True, **pipes
            )

    def _read(self, out: IO[str]) -> None:
        for line in out:
            if line.startswith(EVENT_PREFIX):
                self.events.put(json.loads(line[len(EVENT_PREFIX) :]))
        self.events.put(None)

    def poll(self, timeout: float) -> dict[str, Any] | None:
        """The hub's next event, None when none came within `timeout`; LocustError once it ended."""
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        if event is None:
            self.events.put(None)  # the end stays the end for every later call
            raise LocustError(f"Locust ended (exit {self.hub.poll() if self.hub else None}){self._tail('hub')}")
        return event

    def next(self, timeout: float) -> dict[str, Any]:
        """The hub's next event; LocustError when it ended or said nothing for `timeout` seconds."""
        event = self.poll(timeout)
        if event is None:
            raise LocustError(f"Locust said nothing for {timeout:g} s{self._tail('hub')}")
        return event

    def send(self, order: dict[str, Any]) -> None:
        """An order to the hub: {"signalled": n}, {"served": n} or {"stop": true}."""
        assert self.hub is not None and self.hub.stdin is not None
        self.hub.stdin.write(json.dumps(order) + "\n")
        self.hub.stdin.flush()

    def _tail(self, name: str, lines: int = 15) -> str:
        text = "".join(
            (self.workdir / f"{n}").read_text(errors="replace")
            for n in (f"{name}.err", f"{name}.log")
            if (self.workdir / n).exists()
        )
        tail = "\n".join(text.strip().splitlines()[-lines:])
        return f"; its log ends:\n{tail}" if tail else ""

    def __exit__(self, *exc: object) -> None:
        """Every process ended: each is given the time a drained soak needs, then killed."""
        processes = [p for p in (self.hub, *self.worker_processes) if p is not None]
        if self.hub is not None and self.hub.stdin is not None:
            with contextlib.suppress(OSError):
                self.hub.stdin.close()  # a hub still reading orders takes this as stop
        deadline = time.monotonic() + 30
        for p in processes:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)

    @property
    def exit_codes(self) -> list[int | None]:
        return [p.poll() for p in (self.hub, *self.worker_processes) if p is not None]
