"""A client for any hot-load deployment (the reference one, or a live one at a plain URL): the
hot-load control API, status waits with per-replica progress, the ledger, capability discovery,
and completions parsed into what the contract talks about (`Stream`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_rlrollout.remote.polling import ticks
from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.remote.sse import SSEDecoder, event_data
from pytest_rlrollout.remote.stream import Stream

BUSY_STAGES = ("pending", "downloading", "loading", "swapping", "draining")
FIRST_POLL = 0.01  # waits poll at once, then back off to their interval


@dataclass(frozen=True)
class Target:
    """Where a deployment is and what it is called. The key is a `Secret`: it never shows."""

    deployment: str  # accounts/<a>/deployments/<d>
    base_url: str  # the API base (control plane and hot-load API)
    model: str  # the model the deployment serves, for fireworks-model
    api_key: Secret = field(repr=False)
    inference_url: str = ""  # default: base_url + "/inference"

    def __post_init__(self) -> None:
        parts = self.deployment.split("/")
        if len(parts) != 4 or parts[0] != "accounts" or parts[2] != "deployments" or not all(parts):
            raise ValueError(f"{self.deployment!r} is not accounts/<account>/deployments/<deployment>")
        if not isinstance(self.api_key, Secret):
            object.__setattr__(self, "api_key", Secret(self.api_key))
        if not self.inference_url:
            object.__setattr__(self, "inference_url", self.base_url.rstrip("/") + "/inference")

    @property
    def account(self) -> str:
        return self.deployment.split("/")[1]

    @property
    def deployment_id(self) -> str:
        return self.deployment.split("/")[3]


@dataclass(frozen=True)
class Waited:
    """How a wait for a snapshot ended: served everywhere (`ok`), failed, or out of time."""

    ok: bool
    seconds: float
    replicas: list[dict[str, Any]]
    error: str | None = None


class DeploymentClient:
    def __init__(self, target: Target, *, timeout: float = 60.0, transport: httpx.BaseTransport | None = None):
        self.target, self.transport = target, transport
        self.http = httpx.Client(timeout=timeout, transport=transport)

    def mark(self, name: str) -> float:
        """The time now (monotonic seconds); when recording or replaying, on the cassette's
        timeline, so verdicts about timing are the same in replay."""
        mark = getattr(self.transport, "mark", None)
        return mark(name) if mark is not None else time.monotonic()

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> DeploymentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------- control

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.target.api_key.reveal()}"}

    def hot_load_headers(self) -> dict[str, str]:
        return self.auth_headers() | {
            "fireworks-model": self.target.model,
            "fireworks-deployment": self.target.deployment,
        }

    def _hot_load_url(self, suffix: str = "") -> str:
        return self.target.base_url.rstrip("/") + "/hot_load/v1/models/hot_load" + suffix

    def hot_load(self, body: Any, *, headers: dict[str, str] | None = None) -> httpx.Response:
        """POST a signal (any body: tests send malformed ones on purpose)."""
        h = self.hot_load_headers() | {"Content-Type": "application/json"} | (headers or {})
        return self.http.post(self._hot_load_url(), content=json.dumps(body).encode(), headers=h)

    def status(self, *, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.http.get(self._hot_load_url(), headers=self.hot_load_headers() | (headers or {}))

    def hint(self, identity: str, file: str) -> httpx.Response:
        return self.http.post(
            self._hot_load_url("/hint"), json={"identity": identity, "file": file}, headers=self.hot_load_headers()
        )

    def _deployment_url(self) -> str:
        t = self.target
        return f"{t.base_url.rstrip('/')}/v1/accounts/{t.account}/deployments/{t.deployment_id}"

    def resource(self) -> dict[str, Any]:
        """The deployment resource (GET /v1/accounts/<a>/deployments/<d>), {} when unavailable."""
        r = self.http.get(self._deployment_url(), headers=self.auth_headers())
        json_body = r.headers.get("content-type", "").startswith("application/json")
        return r.json() if r.status_code == 200 and json_body else {}

    def ledger(self) -> httpx.Response:
        return self.http.get(self._deployment_url() + "/ledger", headers=self.auth_headers())

    def reset_ledger(self) -> httpx.Response:
        return self.http.delete(self._deployment_url() + "/ledger", headers=self.auth_headers())

    def replicas(self) -> list[dict[str, Any]]:
        """The status's replicas; [] when the status cannot be read."""
        r = self.status()
        body = r.json() if r.status_code == 200 else {}
        replicas = body.get("replicas") if isinstance(body, dict) else None
        return replicas if isinstance(replicas, list) else []

    def served_identities(self) -> list[str | None]:
        """current_snapshot_identity of every replica."""
        return [r.get("current_snapshot_identity") for r in self.replicas()]

    def wait(
        self,
        identity: str,
        *,
        timeout: float,
        poll: float,
        lora: bool = False,
        progress: Callable[[list[dict[str, Any]]], None] | None = None,
        stalled_after: float | None = None,
    ) -> Waited:
        """Poll the status (backing off from 10 ms to `poll`) until every replica serves `identity`
        (LoRA: lists it as loaded), a replica reports stage 'error' for it, or the deadline passes. With `stalled_after`,
        also give up once some replicas serve it and no replica has been loading for that long
        (a rollout that stopped part-way)."""
        replicas: list[dict[str, Any]] = []
        stalled_since: float | None = None
        for elapsed in ticks(timeout, poll, start=min(poll, FIRST_POLL)):
            r = self.status()
            if r.status_code == 200 and not isinstance(r.json().get("replicas"), list):
                return Waited(False, elapsed, [], "the status has no 'replicas' list (HL-GET-1)")
            if r.status_code != 200:
                continue
            replicas = r.json()["replicas"]
            if progress is not None:
                progress(replicas)
            if replicas and all(serves(x, identity, lora) for x in replicas):
                return Waited(True, elapsed, replicas)
            for x in replicas:
                state = x.get("loading_state") or {}
                if state.get("stage") == "error" and state.get("target_snapshot_identity") == identity:
                    return Waited(False, elapsed, replicas, state.get("error") or "load failed")
            partial = any(serves(x, identity, lora) for x in replicas) and not any(map(busy, replicas))
            stalled_since = (stalled_since if stalled_since is not None else elapsed) if partial else None
            if stalled_after is not None and stalled_since is not None and elapsed - stalled_since > stalled_after:
                behind = [x.get("current_snapshot_identity") for x in replicas if not serves(x, identity, lora)]
                return Waited(False, elapsed, replicas, f"the rollout stopped: replicas still serve {behind}")
        return Waited(False, timeout, replicas, f"not served within {timeout} s")

    # ----------------------------------------------------------------------- inference

    def inference_url(self, chat: bool = False) -> str:
        return self.target.inference_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")

    def post_inference(self, content: bytes, *, chat: bool = False) -> httpx.Response:
        """POST raw bytes to the completions endpoint (for malformed requests)."""
        headers = self.auth_headers() | {"Content-Type": "application/json"}
        return self.http.post(self.inference_url(chat), content=content, headers=headers)

    def complete(
        self,
        body: dict[str, Any],
        *,
        chat: bool = False,
        headers: dict[str, str] | None = None,
        on_chunk: Callable[[dict[str, Any]], None] | None = None,
    ) -> Stream:
        """Send a completion (streaming when body['stream']) and parse what comes back;
        `on_chunk` sees every streamed chunk as it arrives."""
        payload = {"model": self.target.deployment, **body}
        h = self.auth_headers() | (headers or {})
        if not payload.get("stream"):
            r = self.http.post(self.inference_url(chat), json=payload, headers=h)
            out = Stream(r.status_code, {k.lower(): v for k, v in r.headers.items()})
            if r.status_code == 200:
                out.chunks.append(r.json())
            else:
                out.body = r.text
            return out
        with self.http.stream("POST", self.inference_url(chat), json=payload, headers=h) as r:
            out = Stream(r.status_code, {k.lower(): v for k, v in r.headers.items()})
            if r.status_code != 200:
                out.body = r.read().decode("utf-8", "replace")
                return out
            decoder = SSEDecoder()
            for raw in r.iter_bytes():
                for event in decoder.feed(raw):
                    if self._take(out, event, on_chunk):
                        return out
            for event in decoder.close():
                self._take(out, event, on_chunk)
        return out

    @staticmethod
    def _take(out: Stream, event: str, on_chunk: Callable[[dict[str, Any]], None] | None) -> bool:
        """Add one event to `out`; True once the stream is done."""
        out.events.append(event)
        data = event_data(event)
        if data.strip() == "[DONE]":
            out.done = True
            return True
        if data:
            out.chunks.append(json.loads(data))
            if on_chunk is not None:
                on_chunk(out.chunks[-1])
        return False

    def capabilities(self) -> dict[str, Any]:
        """What the deployment offers, discovered without changing its state."""
        probe = self.complete(
            {"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0, "logprobs": True, "include_routing_matrix": True}
        )
        entry = probe.entries[0] if probe.entries else {}
        replicas = self.replicas()
        return {
            "moe": "routing_matrix" in entry,
            "nonstream_version": "@" in (probe.final.get("model") or ""),
            "replicas": len(replicas),
            "lora": any("loaded_adapters" in r for r in replicas),
            "ledger": self.ledger().status_code == 200,
            "backend_host": "fireworks-backend-host" in probe.headers,
        }


def busy(replica: dict[str, Any]) -> bool:
    """The replica is loading or swapping a snapshot."""
    return ((replica.get("loading_state") or {}).get("stage")) in BUSY_STAGES


def serves(replica: dict[str, Any], identity: str, lora: bool = False) -> bool:
    """The replica is ready and serves `identity` (LoRA: lists it as a loaded adapter)."""
    if not replica.get("readiness"):
        return False
    if lora:
        return any(
            a.get("identity") == identity and a.get("status") == "loaded" for a in replica.get("loaded_adapters") or []
        )
    return replica.get("current_snapshot_identity") == identity
