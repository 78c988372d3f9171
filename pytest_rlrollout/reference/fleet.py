"""The reference deployment as a fleet: N engines of one self-hosted dialect sharing one bucket
(the base written once), and in front of them, where it is installed, SGLang's model gateway
(`smg launch --enable-rl`), as self-hosted RL teams run their rollout engines.

A fault switch can hit one engine only (`faults={index: switches}`): that engine keeps its old
weights, drops its label or keeps its cache while the others behave, which only a suite that
judges each engine by what it serves can catch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pytest_rlrollout.engines import Engine, smg, spec
from pytest_rlrollout.reference.server import Running, reference_deployment

GATEWAY = smg.NAME  # SGLang's model gateway's program (PyPI smg, the project's `fleet` extra)
READY_WITHIN = 60.0  # seconds for the gateway to list every engine as ready
STOP_WITHIN = 10.0  # seconds the gateway gets to stop on SIGTERM before SIGKILL


@dataclass
class Gateway:
    url: str
    process: subprocess.Popen
    log: Path


@dataclass
class Fleet:
    engines: list[Running]
    gateway: Gateway | None

    @property
    def urls(self) -> list[str]:
        return [e.base_url for e in self.engines]

    @property
    def base_url(self) -> str:
        """Where a run reaches the fleet: the gateway (else the first engine)."""
        return self.gateway.url if self.gateway is not None else self.engines[0].base_url

    def hurry_stop(self) -> None:
        """Every engine stops waiting for its requests in flight (`Running.hurry_stop`)."""
        for e in self.engines:
            e.hurry_stop()


def gateway_program() -> str | None:
    """The gateway's program: beside this Python's (a virtual environment's bin), else on PATH."""
    beside = Path(sys.executable).with_name(GATEWAY)
    return str(beside) if beside.exists() else shutil.which(GATEWAY)


@contextlib.contextmanager
def reference_fleet(
    bucket: str | Path,
    engines: int,
    *,
    engine: Engine,
    gateway: bool = True,
    faults: Mapping[int, frozenset[str]] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    log: Path | None = None,
    **settings: Any,
) -> Iterator[Fleet]:
    """`engines` reference engines speaking `engine` (a self-hosted dialect) on one bucket, and,
    with `gateway`, smg in front of them (a RuntimeError when it is not installed). `faults`:
    the switches each engine (by index) has on; the others have none. `port`: the gateway's (0: a
    free one)."""
    if not spec(engine).self_hosted or spec(engine).dialect is None:
        raise ValueError(f"a fleet is of self-hosted engines the reference speaks, not {engine!r}")
    if engines < 1:
        raise ValueError(f"a fleet has at least one engine, not {engines}")
    if unknown := sorted(set(faults or {}) - set(range(engines))):
        raise ValueError(f"faults for engines {unknown}: the fleet has engines 0..{engines - 1}")
    with contextlib.ExitStack() as stack:
        running = [
            stack.enter_context(
                reference_deployment(
                    bucket, host=host, engine=engine, faults=(faults or {}).get(i, frozenset()), **settings
                )
            )
            for i in range(engines)
        ]
        front = None
        if gateway:
            front = stack.enter_context(
                smg_gateway([r.base_url for r in running], backend=engine, host=host, port=port, log=log)
            )
        yield Fleet(running, front)


@contextlib.contextmanager
def smg_gateway(
    urls: list[str], *, backend: str, host: str = "127.0.0.1", port: int = 0, log: Path | None = None
) -> Iterator[Gateway]:
    """smg with its RL control plane in front of `urls` (consistent hashing on the routing key),
    ready once it lists every engine as ready; stopped with its whole process group (its router
    outlives the launcher otherwise)."""
    program = gateway_program()
    if program is None:
        raise RuntimeError(
            f"{GATEWAY} is not installed: pip install 'pytest-rlrollout[fleet]' (SGLang's model gateway)"
        )
    port, metrics = port or _free_port(host), _free_port(host)  # its metrics server binds 29000 unless told
    url = f"http://{host}:{port}"
    command = [
        program,
        "launch",
        "--host",
        host,
        "--port",
        str(port),
        "--worker-urls",
        *urls,
        "--backend",
        backend,
        "--enable-rl",
        "--policy",
        "consistent_hashing",
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(metrics),
        "--shutdown-grace-period-secs",
        str(int(STOP_WITHIN) - 2),
    ]
    log = log or Path(os.devnull)
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    gateway = Gateway(url, process, log)
    try:
        _wait_ready(gateway, len(urls))
        yield gateway
    finally:
        _stop(process)


def _wait_ready(gateway: Gateway, engines: int) -> None:
    deadline = time.monotonic() + READY_WITHIN
    while time.monotonic() < deadline:
        try:
            doc = httpx.get(gateway.url + "/v1/rl/workers", timeout=2).json()
            workers = doc.get("workers") if isinstance(doc, dict) else None
            if isinstance(workers, list) and sum(w.get("health") == "ready" for w in workers) == engines:
                return
        except (httpx.HTTPError, ValueError):
            pass  # not listening yet
        if gateway.process.poll() is not None and not _listening(gateway.url):
            raise RuntimeError(f"{GATEWAY} exited with {gateway.process.returncode} (see {gateway.log})")
        time.sleep(0.1)  # a start-up poll: nothing to be told by
    raise TimeoutError(f"{GATEWAY} at {gateway.url} did not list {engines} ready engines within {READY_WITHIN:g} s")


def _listening(url: str) -> bool:
    try:
        httpx.get(url + "/v1/rl/workers", timeout=2)
    except httpx.HTTPError:
        return False
    return True


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the gateway's process group (the launcher and the router it leaves behind),
    SIGKILL past STOP_WITHIN."""
    for sig, within in ((signal.SIGTERM, STOP_WITHIN), (signal.SIGKILL, STOP_WITHIN)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            process.poll()  # reaps the launcher: a zombie would keep its group alive
            if not _group_alive(process.pid):
                return
            time.sleep(0.05)  # the group's end has no event to wait on
    process.wait(timeout=STOP_WITHIN)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
