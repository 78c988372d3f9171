"""A client for any hot-load deployment (the reference one, or a live one at a plain URL): the
hot-load control API, status waits with per-replica progress, the ledger, capability discovery,
and completions parsed into what the contract talks about (`Stream`)."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_rlrollout.contract.catalogue import Profile
from pytest_rlrollout.remote.polling import ticks
from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.remote.sse import SSEDecoder, event_data
from pytest_rlrollout.remote.stream import EXCERPT, Exchange, Stream, json_object

BUSY_STAGES = ("pending", "downloading", "loading", "swapping", "draining")
FIRST_POLL = 0.01  # waits poll at once, then back off to their interval


@dataclass(frozen=True)
class Target:
    """Where a deployment is and what it is called. The key is a `Secret`: it never shows.

    A Fireworks hot-load deployment has a name (accounts/<a>/deployments/<d>), which is also the
    `model` of its inference requests; a plain OpenAI-compatible server needs none and is asked
    for `model` by name."""

    deployment: str | None  # accounts/<a>/deployments/<d>
    base_url: str  # the API base (control plane and hot-load API)
    model: str  # the model the deployment serves, for fireworks-model
    api_key: Secret = field(repr=False)
    inference_url: str = ""  # as given; empty: see `inference_base`
    profile: Profile = "fireworks"

    def __post_init__(self) -> None:
        if self.profile == "fireworks" and not _is_deployment_name(self.deployment):
            raise ValueError(f"{self.deployment!r} is not accounts/<account>/deployments/<deployment>")
        if not isinstance(self.api_key, Secret):
            object.__setattr__(self, "api_key", Secret(self.api_key))

    @property
    def inference_base(self) -> str:
        """Where /v1/completions lives: as given, else base URL + /inference (Fireworks) or the
        base URL itself (an OpenAI-compatible server)."""
        base = self.base_url.rstrip("/")
        return (self.inference_url or (base + "/inference" if self.profile == "fireworks" else base)).rstrip("/")

    @property
    def name(self) -> str:
        """What to call the deployment in reports: its name, else the model at its URL."""
        return self.deployment or f"{self.model} at {self.base_url}"

    @property
    def body_model(self) -> str:
        """The `model` of an inference request: the deployment's name on Fireworks (what the
        official SDK sends), the served model's name on an OpenAI-compatible server."""
        return self.deployment if self.profile == "fireworks" and self.deployment else self.model

    @property
    def account(self) -> str:
        return self._parts[1]

    @property
    def deployment_id(self) -> str:
        return self._parts[3]

    @property
    def _parts(self) -> list[str]:
        if self.deployment is None:
            raise ValueError(f"{self.name} has no deployment name (an {self.profile} server)")
        return self.deployment.split("/")


def _is_deployment_name(name: str | None) -> bool:
    parts = (name or "").split("/")
    return len(parts) == 4 and parts[0] == "accounts" and parts[2] == "deployments" and all(parts)


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
        # what was asked and answered, newest last: the evidence a failed verdict shows
        self.exchanges: collections.deque[Exchange] = collections.deque(maxlen=32)

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

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """Send a request and read the answer, writing the exchange down (secrets left out)."""
        try:
            r = self.http.request(method, url, **kwargs)
        except httpx.HTTPError as e:
            self._note(method, url, type(e).__name__, kwargs.get("content") or kwargs.get("json"), str(e))
            raise
        self._note(method, url, r.status_code, kwargs.get("content") or kwargs.get("json"), r.text)
        return r

    def _note(self, method: str, url: str, status: int | str, body: Any, answer: str) -> None:
        sent = body.decode("utf-8", "replace") if isinstance(body, bytes) else json.dumps(body) if body else ""
        self.exchanges.append(
            Exchange.of(method, httpx.URL(url).path, status, sent, answer, self.target.api_key.reveal())
        )

    # ----------------------------------------------------------------------- control

    def auth_headers(self) -> dict[str, str]:
        key = self.target.api_key.reveal()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def hot_load_headers(self) -> dict[str, str]:
        names = {"fireworks-model": self.target.model}
        if self.target.deployment:
            names["fireworks-deployment"] = self.target.deployment
        return self.auth_headers() | names

    def _hot_load_url(self, suffix: str = "") -> str:
        return self.target.base_url.rstrip("/") + "/hot_load/v1/models/hot_load" + suffix

    def hot_load(self, body: Any, *, headers: dict[str, str] | None = None) -> httpx.Response:
        """POST a signal (any body: tests send malformed ones on purpose)."""
        h = self.hot_load_headers() | {"Content-Type": "application/json"} | (headers or {})
        return self.request("POST", self._hot_load_url(), content=json.dumps(body).encode(), headers=h)

    def status(self, *, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.request("GET", self._hot_load_url(), headers=self.hot_load_headers() | (headers or {}))

    def hint(self, identity: str, file: str) -> httpx.Response:
        body = {"identity": identity, "file": file}
        return self.request("POST", self._hot_load_url("/hint"), json=body, headers=self.hot_load_headers())

    def _deployment_url(self) -> str:
        t = self.target
        return f"{t.base_url.rstrip('/')}/v1/accounts/{t.account}/deployments/{t.deployment_id}"

    def resource(self) -> dict[str, Any]:
        """The deployment resource (GET /v1/accounts/<a>/deployments/<d>), {} when unavailable."""
        r = self.request("GET", self._deployment_url(), headers=self.auth_headers())
        doc = json_object(r) if r.status_code == 200 else None
        return doc or {}

    def ledger(self) -> httpx.Response:
        return self.request("GET", self._deployment_url() + "/ledger", headers=self.auth_headers())

    def reset_ledger(self) -> httpx.Response:
        return self.request("DELETE", self._deployment_url() + "/ledger", headers=self.auth_headers())

    def replicas(self) -> list[dict[str, Any]]:
        """The status's replicas; [] when the status cannot be read."""
        r = self.status()
        doc = json_object(r) if r.status_code == 200 else None
        replicas = (doc or {}).get("replicas")
        return [x for x in replicas if isinstance(x, dict)] if isinstance(replicas, list) else []

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
        (LoRA: lists it as loaded), a replica reports stage 'error' for it, or the deadline
        passes. With `stalled_after`, also give up once some replicas serve it and no replica has
        been loading for that long (a rollout that stopped part-way)."""
        replicas: list[dict[str, Any]] = []
        stalled_since: float | None = None
        for elapsed in ticks(timeout, poll, start=min(poll, FIRST_POLL)):
            r = self.status()
            if r.status_code != 200:
                continue
            doc = json_object(r) or {}
            if not isinstance(doc.get("replicas"), list):
                return Waited(False, elapsed, [], "the status has no 'replicas' list (HL-GET-1)")
            replicas = [x for x in doc["replicas"] if isinstance(x, dict)]
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
        return self.target.inference_base + ("/v1/chat/completions" if chat else "/v1/completions")

    def post_inference(self, content: bytes, *, chat: bool = False) -> httpx.Response:
        """POST raw bytes to the completions endpoint (for malformed requests), on a connection
        of its own: a server that drops a connection after an error must not be blamed for
        the next request's reset."""
        headers = self.auth_headers() | {"Content-Type": "application/json", "Connection": "close"}
        return self.request("POST", self.inference_url(chat), content=content, headers=headers)

    def complete(
        self,
        body: dict[str, Any],
        *,
        chat: bool = False,
        headers: dict[str, str] | None = None,
        on_chunk: Callable[[dict[str, Any]], None] | None = None,
    ) -> Stream:
        """Send a completion (streaming when body['stream']) and parse what comes back;
        `on_chunk` sees every streamed chunk as it arrives. What does not parse is kept in
        `Stream.problems`, never raised."""
        payload = {"model": self.target.body_model, **body}
        url, h = self.inference_url(chat), self.auth_headers() | (headers or {})
        if not payload.get("stream"):
            r = self.request("POST", url, json=payload, headers=h)
            out = Stream(r.status_code, {k.lower(): v for k, v in r.headers.items()}, body=r.text)
            if r.status_code == 200:
                doc = json_object(r)
                if doc is None:
                    out.problems.append(f"the 200 answer is not a JSON object: {r.text[:EXCERPT]!r}")
                else:
                    out.chunks.append(doc)
            return out
        try:
            with self.http.stream("POST", url, json=payload, headers=h) as r:
                out = Stream(r.status_code, {k.lower(): v for k, v in r.headers.items()})
                if r.status_code != 200:
                    out.body = r.read().decode("utf-8", "replace")
                else:
                    self._read_stream(r, out, on_chunk)
        except httpx.HTTPError as e:
            self._note("POST", url, type(e).__name__, payload, str(e))
            raise
        self._note("POST", url, out.status, payload, out.body or "\n\n".join(out.events))
        return out

    def _read_stream(self, r: httpx.Response, out: Stream, on_chunk: Callable[[dict[str, Any]], None] | None) -> None:
        decoder = SSEDecoder()
        for raw in r.iter_bytes():
            for event in decoder.feed(raw):
                if self._take(out, event, on_chunk):
                    return
        for event in decoder.close():
            self._take(out, event, on_chunk)
        out.unterminated = decoder.unterminated

    @staticmethod
    def _take(out: Stream, event: str, on_chunk: Callable[[dict[str, Any]], None] | None) -> bool:
        """Add one event to `out`; True once the stream is done."""
        out.events.append(event)
        data = event_data(event)
        if data.strip() == "[DONE]":
            out.done = True
            return True
        if not data:
            return False
        try:
            chunk = json.loads(data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            out.problems.append(f"event {len(out.events)} is not a JSON object: {data[:EXCERPT]!r}")
            return False
        out.chunks.append(chunk)
        if on_chunk is not None:
            on_chunk(chunk)
        return False


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
