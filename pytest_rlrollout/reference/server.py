"""Running the reference deployment: in-process for tests, or as `rlrollout serve`."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from pytest_rlrollout.engines import DEFAULT, spec
from pytest_rlrollout.reference.app import create_app
from pytest_rlrollout.reference.controller import Deployment
from pytest_rlrollout.reference.settings import Dialect, Settings


@dataclass
class Running:
    """A started reference deployment: where it is and what it is called."""

    base_url: str
    deployment: Deployment
    _server: uvicorn.Server | None = field(default=None, repr=False, compare=False)

    @property
    def settings(self) -> Settings:
        return self.deployment.settings

    @property
    def engine(self) -> str:
        """The wire it speaks: an engine of the registry with a reference dialect."""
        return self.settings.engine

    @property
    def inference_url(self) -> str:
        """Where /v1/completions is: under the engine's inference prefix (/inference on Fireworks)."""
        return self.base_url + spec(self.engine).inference_prefix

    @property
    def name(self) -> str:
        return self.settings.deployment

    @property
    def model(self) -> str:
        return self.settings.model

    @property
    def api_key(self) -> str | None:
        return self.settings.api_key

    def hurry_stop(self) -> None:
        """Stop waiting for the requests in flight: a stop under way (or the next) ends their
        streams at once instead of letting them finish (for up to GRACE seconds). From any
        thread: it sets a flag the server's loop reads."""
        if self._server is not None:
            self._server.force_exit = True

    def hot_load_headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.api_key}",
            "fireworks-model": self.model,
            "fireworks-deployment": self.name,
            "Content-Type": "application/json",
        }


GRACE = 10  # seconds a stopping deployment lets the requests in flight finish before it cancels them


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # runs in a thread: leave signals to the host
        pass


@contextlib.contextmanager
def reference_deployment(
    bucket: str | Path, host: str = "127.0.0.1", port: int = 0, engine: Dialect = DEFAULT, **settings: Any
) -> Iterator[Running]:
    """Start the reference deployment on a free port (in a thread) and stop it on exit. `engine`
    is the wire it speaks (`fireworks`, or `vllm`: vLLM's RL routes, one replica and the model
    served as `tiny` unless `replicas` and `model` say otherwise)."""
    dep = Deployment(Settings.for_dialect(engine, bucket=Path(bucket), **settings))
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so, and without
    # it every keep-alive response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    config = uvicorn.Config(
        create_app(dep),
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=GRACE,
    )
    server = _Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="rlrollout-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the reference deployment did not start")
        time.sleep(0.002)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    try:
        yield Running(f"http://{shown}:{bound[1]}", dep, server)
    finally:
        server.should_exit = True
        thread.join(timeout=GRACE + 5)  # past GRACE uvicorn cancels what still runs
        sock.close()
        dep.close()
