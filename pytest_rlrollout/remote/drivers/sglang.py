"""The SGLang binding: an SGLang server (0.5.x) swapped through its own RL API, as SGLang's sources
publish it (`srt/entrypoints/http_server.py`, `srt/managers/io_struct.py`). No SGLang server ran
while it was written (none runs on this machine); it is tested against the reference
deployment's SGLang dialect, whose shapes follow the same sources.

- Load a snapshot: `POST /pause_generation {"mode": "retract"}`, `POST /update_weights_from_disk
  {"model_path": <bucket>/<identity>, "weight_version": identity, "flush_cache": <reset 'all'>,
  "abort_all_requests": false}` (synchronous), [`midway`], `POST /continue_generation`. Retracted
  requests continue on the new weights once generation continues, and a paused server flushes its
  cache although they wait (SGLang ignores its waiting queue then). A 400 "Weights were updated,
  but the cache was not flushed ..." comes *after* the swap: the weights changed, so this side
  publishes the label (`/update_weight_version`) and flushes (`/flush_cache`) before it answers
  with that 400, never reading it as "nothing changed".
- What is served: `GET /model_info` → `weight_version` (one replica: the server).
- Completions go to the native `POST /generate` (`input_ids` or `text`, `sampling_params`,
  `return_logprob` with `logprob_start_len` 0 for the prompt's scores, `return_text_in_logprobs`,
  `return_prompt_token_ids`, `cache_salt`, `return_routed_experts`); chat to
  `/v1/chat/completions`. The native answer's `meta_info` says the label (`weight_version`), the
  spans of the finished output (`weight_versions`), the cached tokens, the token logprobs
  `[logprob, id, text]` and the routed experts (base64 int32 `[positions, num_hidden_layers, k]`,
  no header; a dense layer's values are 0: with the served config known, only the MoE layers'
  values make the contract's matrices, as the contract decides for such engines).
  Streamed, every chunk repeats the output so far (SGLang's default): `SGLangReading.chunk` lays
  each chunk out as the contract's (`choices[0]` with the new text and ids, `usage` at the end).
- Pause: `POST /pause_generation {"mode": abort | in_place | retract}` (the contract's abort,
  keep, keep recomputing the KV), `POST /continue_generation`; no route says whether generation
  is paused, and there is no wait (drain) mode. A cache reset is `POST /flush_cache` (refused while
  requests run). A label alone: `POST /update_weight_version {"new_version", "abort_all_requests":
  false}` (SGLang's default aborts every request in flight).
- Isolation: the isolation key becomes `cache_salt`. Session headers pass through.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any, Unpack

from pytest_rlrollout.engines.sglang import ENGINE
from pytest_rlrollout.remote.discovery import PROBE_IDS, Answered, Discovery, get, mark, said
from pytest_rlrollout.remote.drivers.base import Driver, Status, registered, reset_policy
from pytest_rlrollout.remote.drivers.probes import auth_probe, inference_probes
from pytest_rlrollout.remote.openai_wire import (
    bound,
    labelled_status,
)
from pytest_rlrollout.remote.options import CompletionOptions, LoadOptions
from pytest_rlrollout.remote.sglang_wire import (
    GENERATE,
    SGLANG_READING,
    SGLangReading,
    meta_info,
    moe_columns,
    native_body,
)
from pytest_rlrollout.remote.stream import Stream, json_object

if TYPE_CHECKING:
    import httpx

    from pytest_rlrollout.remote.client import DeploymentClient

NOT_FLUSHED = "Weights were updated, but the cache was not flushed"  # SGLang's words for a swap it did
MODES = {"abort": "abort", "keep": "in_place"}  # the contract's pause modes SGLang has


class SGLangDriver(Driver):
    engine = registered(ENGINE)
    reading = SGLANG_READING
    transition = "ASYNC"  # the load retracts the requests in flight; they continue on the new weights
    reset_policies = ("all", "none")  # no session-keyed reset: new_session has no binding

    @classmethod
    def recognises(cls, client: DeploymentClient, seen: Answered) -> str | None:
        """An SGLang server answers `GET /model_info` with its weight_version."""
        r = get(client, client.target.base_url.rstrip("/") + "/model_info", client.auth_headers(), "--rl-base-url")
        label = (json_object(r) or {}).get("weight_version") if r.status_code == 200 else None
        return f"GET /model_info answers SGLang's weight_version {label[:80]!r}" if isinstance(label, str) else None

    holds_streams = True  # load: pause (retract), update from disk, continue

    def __init__(self, client: DeploymentClient, *, bucket: str | None = None):
        super().__init__(client)
        self.bucket = bucket  # where the server reads snapshots: <bucket>/<identity>
        self._width: int | None = None

    def row_width(self) -> int | None:
        """The values of one routed_experts row (layers * k), measured once, from what one more
        generated token adds to the array (whatever positions a server leaves out, each new
        token adds one row); None when the server returns no routing."""
        if self._width is None:
            sizes = []
            for tokens in (2, 3):
                probe = {
                    "prompt": PROBE_IDS,
                    "max_tokens": tokens,
                    "ignore_eos": True,
                    "stream": True,
                    "include_routing_matrix": True,
                }
                s = self.client.complete(native_body(probe, None), url=self._url(GENERATE), reading=self.reading)
                value = meta_info(s.chunks[-1] if s.chunks else {}).get("routed_experts")
                try:
                    sizes.append(len(base64.b64decode(value, validate=True)) if isinstance(value, str) else 0)
                except (ValueError, binascii.Error):
                    sizes.append(0)
            grown = sizes[1] - sizes[0]
            if all(sizes) and grown > 0 and grown % 4 == 0:
                self._width = grown // 4
        return self._width

    def _url(self, path: str) -> str:
        return self.target.base_url.rstrip("/") + path

    def _post(
        self, path: str, body: Any = None, *, headers: dict[str, str] | None = None, wait: float | None = None
    ) -> httpx.Response:
        sent = self.client.auth_headers() | {"Content-Type": "application/json"} | (headers or {})
        return self.client.request("POST", self._url(path), json=body, headers=sent, wait=wait)

    def _get(self, path: str, *, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.client.request("GET", self._url(path), headers=self.client.auth_headers() | (headers or {}))

    def _info(self, path: str = "/model_info") -> dict[str, Any]:
        r = self._get(path)
        return (json_object(r) or {}) if r.status_code == 200 else {}

    # ----------------------------------------------------------------------- inference

    def complete(
        self,
        body: dict[str, Any],
        **options: Unpack[CompletionOptions],
    ) -> Stream:
        return self.complete_at(None, body, **options)

    def complete_at(
        self,
        base: str | None,
        body: dict[str, Any],
        **options: Unpack[CompletionOptions],
    ) -> Stream:
        """`complete`, on the server at `base` (None: the target's)."""
        root = (base or self.target.base_url).rstrip("/")
        sent, options["headers"], salt = bound(body, options.get("headers"))
        if options.get("chat"):
            if salt is not None:
                sent["cache_salt"] = salt
            return self.client.complete(
                sent, url=None if base is None else root + "/v1/chat/completions", reading=self.reading, **options
            )
        native = native_body(body, salt)
        width = self.row_width() if body.get("include_routing_matrix") else None
        reading = SGLangReading(
            echo=bool(body.get("echo") and body.get("stream")), width=width, keep=moe_columns(self.served_config, width)
        )
        return self.client.complete(native, url=root + GENERATE, reading=reading, **options)

    # ----------------------------------------------------------------------- what is served

    def status(self, *, headers: dict[str, str] | None = None) -> Status:
        return labelled_status(self._get("/model_info", headers=headers), "GET /model_info", ENGINE.name)

    # ----------------------------------------------------------------------- loading

    def load(
        self,
        signal: dict[str, Any],
        **options: Unpack[LoadOptions],
    ) -> httpx.Response:
        """Retract, update from the bucket (label and flush in the same request), [`midway`],
        continue; the update's answer, or the pause's when it was refused. Generation continues
        whatever happened."""
        headers, midway = options.get("headers"), options.get("midway")
        if signal.get("incremental_snapshot_metadata"):
            raise self.unbound("incremental (ARC2) snapshots")
        if self.bucket is None:
            raise ValueError("loading a snapshot into SGLang needs the directory it reads them from (--rl-bucket-url)")
        identity = str(signal.get("identity"))
        policy = reset_policy(signal)
        if policy not in self.reset_policies:
            raise self.unbound(f"reset_prompt_cache {policy!r}")
        paused = self._post("/pause_generation", {"mode": "retract"}, headers=headers)
        if paused.status_code != 200:
            return paused
        try:
            body = {
                "model_path": f"{self.bucket}/{identity}",
                "weight_version": identity,
                "flush_cache": policy == "all",
                "abort_all_requests": False,
            }
            updated = self._post("/update_weights_from_disk", body, headers=headers, wait=self.load_wait)
            if updated.status_code == 400 and NOT_FLUSHED in str((json_object(updated) or {}).get("message")):
                # swapped, not flushed, not labelled: finish what SGLang left undone
                self.set_label(identity)
                self.reset_cache()
                return updated
            if updated.status_code == 200 and midway is not None:
                midway()
            return updated
        finally:
            self._post("/continue_generation", {}, headers=headers)

    # ----------------------------------------------------------------------- control

    def pause(self, mode: str, *, clear_cache: bool = False) -> httpx.Response:
        if mode == "wait":
            raise self.unbound("a pause that lets the requests in flight finish (SGLang: abort, retract, in_place)")
        sent = "retract" if mode == "keep" and clear_cache else MODES.get(mode, mode)
        r = self._post("/pause_generation", {"mode": sent})
        if clear_cache and r.status_code == 200:
            self.reset_cache()
        return r

    def resume(self) -> httpx.Response:
        return self._post("/continue_generation", {})

    def paused(self) -> bool | None:
        return None  # SGLang has no route that says

    def reset_cache(self) -> httpx.Response:
        return self._post("/flush_cache")

    def set_label(self, label: str) -> httpx.Response:
        return self._post("/update_weight_version", {"new_version": label, "abort_all_requests": False})

    def start_label(self) -> str | None:
        return "default"  # SGLang's weight_version until one is set (--weight-version)

    def started_from(self) -> str | None:
        """`tokenizer_path` of GET /model_info: the directory the server was started from
        (`model_path` moves with every update)."""
        path = self._info().get("tokenizer_path")
        return path if isinstance(path, str) else None

    def restore(self, label: str) -> str | None:
        root = self.started_from()
        if root is None:
            return "not restored: GET /model_info names no tokenizer_path"
        self._post("/pause_generation", {"mode": "retract"})
        try:
            body = {"model_path": root, "weight_version": label, "flush_cache": True, "abort_all_requests": False}
            updated = self._post("/update_weights_from_disk", body)
        finally:
            self._post("/continue_generation", {})
        if updated.status_code != 200:
            return f"not restored: updating from {root} got HTTP {updated.status_code} {updated.text[:200]}"
        return f"updated from {root} (the directory the server started from) and set the label back to {label!r}"

    # ----------------------------------------------------------------------- discovery

    def discover(self, *, transition: str | None, decided: str) -> Discovery:
        d = Discovery(self.engine, decided, transition=transition or self.transition)
        version = self._info("/server_info").get("version")
        d.version = version[:40] if isinstance(version, str) else None
        inference_probes(self, d)
        auth_probe(self, d)
        mark(d, "transition", True, f"{d.transition}: the load retracts the requests in flight")
        info = self._get("/model_info")
        label = (json_object(info) or {}).get("weight_version") if info.status_code == 200 else None
        mark(
            d,
            "hot_load_api",
            isinstance(label, str),
            f"GET /model_info: HTTP {info.status_code}"
            + (f", weight_version {label!r}" if isinstance(label, str) else ""),
        )
        d.replicas = 1 if isinstance(label, str) else 0
        mark(d, "incremental", False, "/update_weights_from_disk takes whole checkpoints")
        # no route says whether these exist without changing state: every SGLang HTTP server has them
        mark(d, "pause", isinstance(label, str), "/pause_generation and /continue_generation (every SGLang server)")
        mark(d, "cache_reset", isinstance(label, str), "/flush_cache (every SGLang server)")
        for name in ("ledger", "hint", "lora", "raw_output", "perf_metrics"):
            mark(d, name, False, "no SGLang binding in this suite")
        probe = {"prompt": PROBE_IDS, "max_tokens": 2, "stream": True, "logprobs": True, "include_routing_matrix": True}
        generated = self.complete(probe)
        mark(
            d,
            "policy_version",
            generated.ok and bool(generated.spans),
            f"POST {GENERATE}: {said(generated)}"
            + (f", spans {generated.spans}" if generated.spans else ", no weight_versions"),
        )
        routed = meta_info(generated.chunks[-1] if generated.chunks else {}).get("routed_experts")
        mark(
            d,
            "routing_matrix",
            isinstance(routed, str),
            f"POST {GENERATE}: " + ("meta_info.routed_experts" if isinstance(routed, str) else "no routed_experts"),
        )
        ids = self.complete({"prompt": PROBE_IDS, "max_tokens": 1})
        mark(d, "token_id_prompts", ids.ok and bool(ids.chunks), said(ids))
        mark(
            d,
            "nonstream_version",
            bool(ids.versions) and None not in ids.versions,
            f"a non-streamed answer's spans: {ids.spans}",
        )
        logprobs = self.complete({"prompt": PROBE_IDS, "max_tokens": 1, "logprobs": True})
        lps = logprobs.entries
        mark(d, "logprobs", bool(lps) and all("token_id" in e for e in lps), f"{len(lps)} logprobs entries")
        echoed = self.complete({"prompt": PROBE_IDS, "max_tokens": 1, "logprobs": True, "echo": True})
        mark(
            d,
            "echo",
            len(echoed.entries) > 1,
            f"{len(echoed.entries)} entries for a prompt and one token (input_token_logprobs)",
        )
        back = self.complete({"prompt": PROBE_IDS, "max_tokens": 1, "return_token_ids": True})
        mark(
            d,
            "token_ids",
            isinstance(back.choice_field("token_ids"), list)
            and isinstance(back.choice_field("prompt_token_ids"), list),
            "output_ids and prompt_token_ids",
        )
        return d
