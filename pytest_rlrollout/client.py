"""A client for any hot-load deployment (the reference one, or a live one at a plain URL): the
hot-load control API, status waits with per-replica progress, the ledger, capability discovery,
and completions whose streams are parsed into what the contract talks about (policy version per
chunk, routing matrices as arrays, cached tokens from every channel)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import numpy as np

Mode = Literal["local", "live", "replay"]


@dataclass(frozen=True)
class Target:
    """Where a deployment is and what it is called."""

    deployment: str  # accounts/<a>/deployments/<d>
    base_url: str  # the API base (control plane and hot-load API)
    model: str  # the model the deployment serves, for fireworks-model
    api_key: str
    inference_url: str = ""  # default: base_url + "/inference"
    mode: Mode = "live"

    def __post_init__(self) -> None:
        parts = self.deployment.split("/")
        if len(parts) != 4 or parts[0] != "accounts" or parts[2] != "deployments" or not all(parts):
            raise ValueError(f"{self.deployment!r} is not accounts/<account>/deployments/<deployment>")
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
    ok: bool
    seconds: float
    replicas: list[dict[str, Any]]
    error: str | None = None


@dataclass
class Stream:
    """A parsed completion stream (or non-streaming body, as one chunk)."""

    status: int
    headers: dict[str, str]
    chunks: list[dict[str, Any]] = field(default_factory=list)
    raw_events: list[str] = field(default_factory=list)
    done: bool = False  # ended with data: [DONE]

    @property
    def versions(self) -> list[str | None]:
        """The policy version (`@identity` suffix) of every chunk; None where a chunk has none."""
        return policy_versions(self.chunks)

    @property
    def entries(self) -> list[dict[str, Any]]:
        """Every logprobs.content entry, in order."""
        return logprob_entries(self.chunks)

    @property
    def final(self) -> dict[str, Any]:
        """The chunk that carries the finish_reason (the last chunk if none does)."""
        for c in reversed(self.chunks):
            if any((choice or {}).get("finish_reason") for choice in c.get("choices") or []):
                return c
        return self.chunks[-1] if self.chunks else {}

    @property
    def finish_reason(self) -> str | None:
        for c in reversed(self.chunks):
            for choice in c.get("choices") or []:
                if choice.get("finish_reason"):
                    return choice["finish_reason"]
        return None

    @property
    def usage(self) -> dict[str, Any] | None:
        """The last non-null usage. (The official SDK keeps the last chunk carrying the key, so a
        trailing 'usage': null erases it there: INF-SSE-1 checks for that on its own.)"""
        usage = None
        for c in self.chunks:
            if c.get("usage") is not None:
                usage = c["usage"]
        return usage

    def cached_tokens(self) -> dict[str, int | None]:
        """Cached prompt tokens per channel: usage, header, perf_metrics (None where absent)."""
        usage = self.usage or {}
        perf = next((c["perf_metrics"] for c in reversed(self.chunks) if c.get("perf_metrics")), {})
        header = self.headers.get("fireworks-cached-prompt-tokens")
        return {
            "usage": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "header": int(header) if header is not None and header.isdigit() else None,
            "perf_metrics": perf.get("cached-prompt-tokens"),
        }


def policy_versions(chunks: list[dict[str, Any]]) -> list[str | None]:
    """The `@identity` suffix of each chunk's `model`; None where a chunk has none."""
    return [c.get("model", "").rpartition("@")[2] if "@" in c.get("model", "") else None for c in chunks]


def logprob_entries(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every logprobs.content entry of `chunks`, in order."""
    out = []
    for c in chunks:
        for choice in c.get("choices") or []:
            out += ((choice or {}).get("logprobs") or {}).get("content") or []
    return out


def routing_matrix(entry: dict[str, Any], layers: int, k: int) -> np.ndarray:
    """An entry's routing_matrix as a [layers, k] uint8 array; ValueError when the size is wrong."""
    raw = base64.b64decode(entry["routing_matrix"], validate=True)
    if len(raw) != layers * k:
        raise ValueError(f"routing_matrix holds {len(raw)} bytes, expected L*k = {layers}*{k} = {layers * k}")
    return np.frombuffer(raw, dtype=np.uint8).reshape(layers, k)


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
        return {"Authorization": f"Bearer {self.target.api_key}"}

    def hot_load_headers(self) -> dict[str, str]:
        return self.auth_headers() | {
            "fireworks-model": self.target.model,
            "fireworks-deployment": self.target.deployment,
        }

    def _hot_load_url(self, suffix: str = "") -> str:
        return self.target.base_url.rstrip("/") + "/hot_load/v1/models/hot_load" + suffix

    def hot_load(self, body: Any, *, headers: dict[str, str] | None = None) -> httpx.Response:
        """POST a hot-load signal (any body: tests send malformed ones on purpose)."""
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

    def _ledger_url(self) -> str:
        return self._deployment_url() + "/ledger"

    def resource(self) -> dict[str, Any]:
        """The deployment resource (GET /v1/accounts/<a>/deployments/<d>), {} when unavailable."""
        r = self.http.get(self._deployment_url(), headers=self.auth_headers())
        json_body = r.headers.get("content-type", "").startswith("application/json")
        return r.json() if r.status_code == 200 and json_body else {}

    def ledger(self) -> httpx.Response:
        return self.http.get(self._ledger_url(), headers=self.auth_headers())

    def reset_ledger(self) -> httpx.Response:
        return self.http.delete(self._ledger_url(), headers=self.auth_headers())

    def serving(self) -> list[str | None]:
        """current_snapshot_identity of every replica."""
        return [r.get("current_snapshot_identity") for r in self.status().json()["replicas"]]

    def wait(
        self,
        identity: str,
        *,
        timeout: float = 600.0,
        poll: float = 0.05,
        lora: bool = False,
        progress: Callable[[list[dict[str, Any]]], None] | None = None,
        stalled_after: float | None = None,
    ) -> Waited:
        """Poll the status until every replica serves `identity` (LoRA: lists it as loaded), a
        replica reports stage 'error' for it, or the deadline passes. With `stalled_after`,
        also give up once some replicas serve it and no replica has been loading for that long
        (a rollout that stopped part-way)."""
        start = time.monotonic()
        replicas: list[dict[str, Any]] = []
        stalled_since: float | None = None
        while True:
            r = self.status()
            if r.status_code == 200 and not isinstance(r.json().get("replicas"), list):
                return Waited(False, time.monotonic() - start, [], "the status has no 'replicas' list (HL-GET-1)")
            if r.status_code == 200:
                replicas = r.json()["replicas"]
                if progress is not None:
                    progress(replicas)
                if replicas and all(_serves(x, identity, lora) for x in replicas):
                    return Waited(True, time.monotonic() - start, replicas)
                for x in replicas:
                    state = x.get("loading_state") or {}
                    if state.get("stage") == "error" and state.get("target_snapshot_identity") == identity:
                        return Waited(False, time.monotonic() - start, replicas, state.get("error") or "load failed")
                partial = any(_serves(x, identity, lora) for x in replicas) and not any(map(busy, replicas))
                stalled_since = (stalled_since or time.monotonic()) if partial else None
                if stalled_after is not None and stalled_since and time.monotonic() - stalled_since > stalled_after:
                    behind = [x.get("current_snapshot_identity") for x in replicas if not _serves(x, identity, lora)]
                    return Waited(False, time.monotonic() - start, replicas,
                                  f"the rollout stopped: replicas still serve {behind}")  # fmt: skip
            if time.monotonic() - start > timeout:
                return Waited(False, time.monotonic() - start, replicas, f"not served within {timeout} s")
            time.sleep(poll)

    # ----------------------------------------------------------------------- inference

    def _inference(self, chat: bool) -> str:
        return self.target.inference_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")

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
            r = self.http.post(self._inference(chat), json=payload, headers=h)
            out = Stream(r.status_code, {k.lower(): v for k, v in r.headers.items()})
            if r.status_code == 200:
                out.chunks.append(r.json())
            return out
        with self.http.stream("POST", self._inference(chat), json=payload, headers=h) as r:
            out = Stream(r.status_code, {k.lower(): v for k, v in r.headers.items()})
            if r.status_code != 200:
                r.read()
                return out
            for event in sse_events(r.iter_bytes()):
                out.raw_events.append(event)
                data = "\n".join(line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:"))
                if data.strip() == "[DONE]":
                    out.done = True
                    break
                if data:
                    out.chunks.append(json.loads(data))
                    if on_chunk is not None:
                        on_chunk(out.chunks[-1])
        return out

    def capabilities(self) -> dict[str, Any]:
        """What the deployment offers, discovered without changing its state."""
        probe = self.complete(
            {"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0, "logprobs": True, "include_routing_matrix": True}
        )
        entry = probe.entries[0] if probe.entries else {}
        status = self.status()
        replicas = status.json().get("replicas", []) if status.status_code == 200 else []
        return {
            "moe": "routing_matrix" in entry,
            "nonstream_version": "@" in (probe.final.get("model") or ""),
            "replicas": len(replicas),
            "lora": any("loaded_adapters" in r for r in replicas),
            "ledger": self.ledger().status_code == 200,
            "backend_host": "fireworks-backend-host" in probe.headers,
        }


BUSY_STAGES = ("pending", "downloading", "loading", "swapping", "draining")


def busy(replica: dict[str, Any]) -> bool:
    return ((replica.get("loading_state") or {}).get("stage")) in BUSY_STAGES


def _serves(replica: dict[str, Any], identity: str, lora: bool) -> bool:
    if not replica.get("readiness"):
        return False
    if lora:
        return any(
            a.get("identity") == identity and a.get("status") == "loaded" for a in replica.get("loaded_adapters") or []
        )
    return replica.get("current_snapshot_identity") == identity


def sse_events(chunks: Iterator[bytes]) -> Iterator[str]:
    """SSE events, each yielded only when its terminating blank line arrived (a final event
    without one is dropped, as the official SDK drops it). Accepts \\n, \\r\\n and \\r."""
    import codecs

    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    buffer, pending = "", ""
    for chunk in chunks:
        text = pending + utf8.decode(chunk)
        # a CR at the end of a read may be the first half of a CRLF: decide once the next read comes
        text, pending = (text[:-1], "\r") if text.endswith("\r") else (text, "")
        events, buffer = _split_events(buffer + text.replace("\r\n", "\n").replace("\r", "\n"))
        yield from events
    events, _ = _split_events(buffer + pending.replace("\r", "\n"))
    yield from events


def _split_events(buffer: str) -> tuple[list[str], str]:
    """(events terminated by a blank line, the unterminated rest); comment-only events are skipped."""
    *complete, rest = buffer.split("\n\n")
    return [e for e in complete if e.strip() and not all(line.startswith(":") for line in e.split("\n"))], rest
