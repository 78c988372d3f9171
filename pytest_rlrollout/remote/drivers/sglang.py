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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np

from pytest_rlrollout.contract.moe import moe_layers
from pytest_rlrollout.engines.sglang import ENGINE
from pytest_rlrollout.remote.discovery import PROBE_IDS, Answered, Discovery, get, mark, said
from pytest_rlrollout.remote.drivers.base import Driver, Status, registered, reset_policy
from pytest_rlrollout.remote.drivers.probes import auth_probe, inference_probes
from pytest_rlrollout.remote.openai_wire import (
    OpenAIReading,
    as_list,
    bound,
    labelled_status,
    lay_routing,
    token_prompt,
)
from pytest_rlrollout.remote.options import CompletionOptions, LoadOptions
from pytest_rlrollout.remote.stream import Stream, as_object, json_object

if TYPE_CHECKING:
    import httpx

    from pytest_rlrollout.remote.client import DeploymentClient

GENERATE = "/generate"
NOT_FLUSHED = "Weights were updated, but the cache was not flushed"  # SGLang's words for a swap it did
MODES = {"abort": "abort", "keep": "in_place"}  # the contract's pause modes SGLang has
COMPLETION_MAX_TOKENS = 16  # the contract's (OpenAI's) default; SGLang's native default is 128


def _meta(chunk: dict[str, Any]) -> dict[str, Any]:
    return as_object(chunk.get("meta_info"))


def _grown(now: Any, before: Any) -> Any:
    """What `now` adds to `before` (SGLang repeats the output so far), or `now` when it does not
    extend it (a server run with --incremental-streaming-output sends only what is new)."""
    if isinstance(now, list | str) and isinstance(before, type(now)) and now[: len(before)] == before:
        return now[len(before) :]
    return now


def _entries(rows: Any) -> list[dict[str, Any]]:
    """`[[logprob, id, text], ...]` as the contract's entries (what a row does not say is left out)."""
    out = []
    for row in as_list(rows):
        row = as_list(row)
        if len(row) < 2:
            continue
        entry: dict[str, Any] = {"logprob": row[0], "token_id": row[1]}
        if len(row) > 2 and isinstance(row[2], str):
            entry["token"] = row[2]
        out.append(entry)
    return out


def moe_columns(config: Mapping[str, Any] | None, width: int | None) -> tuple[int, ...] | None:
    """The values of a routed_experts row that belong to MoE layers, when the row covers every
    hidden layer (SGLang's capture buffer is num_hidden_layers deep; a dense layer routes nothing
    and its values stay 0); None when the config is unknown or the row has another width."""
    layers = moe_layers(config or {})
    if not config or not layers or width is None:
        return None
    hidden, k = config.get("num_hidden_layers"), config.get("num_experts_per_tok")
    if not isinstance(hidden, int) or not isinstance(k, int) or width != hidden * k or len(layers) == hidden:
        return None
    return tuple(layer * k + j for layer in layers for j in range(k))


def routed_rows(value: Any, width: int | None) -> np.ndarray | None:
    """SGLang's routed_experts, base64 of int32 with no header, as rows of `width` (layers * k)
    values, one per fed position; None when absent, when the width is unknown, or when the array
    does not split into such rows. The array names no shape: the width is measured once
    (`SGLangDriver.row_width`), and the rows are laid from the last fed position backwards, so an
    array that leaves positions out shows as entries without routing."""
    if not isinstance(value, str) or not width:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        return None
    if not raw or len(raw) % (4 * width):
        return None
    return np.frombuffer(raw, dtype="<i4").reshape(-1, width)


@dataclass(frozen=True)
class SGLangReading(OpenAIReading):
    """Where SGLang's native answers say what the contract talks about (see the module's doc):
    chunks laid out with `choices` and `usage`; entries from the last chunk's cumulative
    `input_token_logprobs` and `output_token_logprobs`; versions from the finished chunk's spans,
    else each chunk's `weight_version`. `width`: the values of one routed_experts row; `keep`:
    those of MoE layers, where the row covers dense layers too (the matrices are the MoE layers')."""

    width: int | None = None
    keep: tuple[int, ...] | None = None

    def chunk(self, doc: dict[str, Any], before: list[dict[str, Any]]) -> dict[str, Any]:
        if "meta_info" not in doc or "choices" in doc:
            return doc  # an error, or an OpenAI route's answer
        meta, last = _meta(doc), before[-1] if before else {}
        finish = as_object(meta.get("finish_reason")).get("type") if meta.get("finish_reason") is not None else None
        choice: dict[str, Any] = {
            "index": 0,
            "text": _grown(doc.get("text"), last.get("text")),
            "token_ids": _grown(doc.get("output_ids"), last.get("output_ids")),
            "finish_reason": finish,
        }
        if "weight_versions" in meta:
            choice["weight_versions"] = meta["weight_versions"]
        out = doc | {"choices": [choice]}
        if finish is not None:
            usage: dict[str, Any] = {k: meta[k] for k in ("prompt_tokens", "completion_tokens") if k in meta}
            if all(isinstance(usage.get(k), int) for k in ("prompt_tokens", "completion_tokens")):
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            if "cached_tokens" in meta:
                usage["prompt_tokens_details"] = {"cached_tokens": meta["cached_tokens"]}
            out["usage"] = usage
        return out

    def versions(self, chunks: list[dict[str, Any]]) -> list[str | None]:
        if self.spans(chunks) is not None:
            return super().versions(chunks)
        out = []
        for chunk in chunks:
            label = _meta(chunk).get("weight_version")
            out.append(label if isinstance(label, str) else None)
        return out

    def entries(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not any("meta_info" in c for c in chunks):
            return super().entries(chunks)  # an OpenAI route's answer
        meta = next((_meta(c) for c in reversed(chunks) if "meta_info" in c), {})
        prompt = next((c["prompt_token_ids"] for c in chunks if isinstance(c.get("prompt_token_ids"), list)), None)
        scored = _entries(meta.get("input_token_logprobs"))
        if not scored and self.echo and prompt is not None:
            scored = [{"token_id": token} for token in prompt]
        out = scored + _entries(meta.get("output_token_logprobs"))
        generated = sum(len(as_list(c["choices"][0].get("token_ids"))) for c in chunks if c.get("choices"))
        size = meta.get("prompt_tokens")
        rows = routed_rows(meta.get("routed_experts"), self.width)
        if rows is not None and self.keep is not None:
            rows = rows[:, list(self.keep)]
        if rows is not None and isinstance(size, int) and 0 < generated <= len(out):
            lay_routing(out, rows, size, generated)
        return out


SGLANG_READING = SGLangReading()


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
                value = _meta(s.chunks[-1] if s.chunks else {}).get("routed_experts")
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
        routed = _meta(generated.chunks[-1] if generated.chunks else {}).get("routed_experts")
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


def native_body(body: dict[str, Any], salt: str | None) -> dict[str, Any]:
    """A contract completion body on SGLang's native /generate (see the module's doc)."""
    prompt = body.get("prompt")
    out: dict[str, Any] = {"input_ids" if token_prompt(prompt) else "text": prompt, "return_prompt_token_ids": True}
    params = {"max_new_tokens": body.get("max_tokens", COMPLETION_MAX_TOKENS)}
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("seed", "sampling_seed"),
        ("stop", "stop"),
        ("stop_token_ids", "stop_token_ids"),
        ("ignore_eos", "ignore_eos"),
        ("n", "n"),
    ):
        if body.get(ours) is not None:
            params[theirs] = body[ours]
    out["sampling_params"] = params
    if body.get("logprobs"):
        out["return_logprob"] = True
        out["return_text_in_logprobs"] = True
        out["top_logprobs_num"] = (body.get("top_logprobs") or 0) if body["logprobs"] is True else body["logprobs"]
        # scoring the prompt skips the cache for it: a streamed echo gets the prompt's ids alone
        out["logprob_start_len"] = 0 if body.get("echo") and not body.get("stream") else -1
    if body.get("include_routing_matrix"):
        out["return_routed_experts"] = True
    if body.get("stream"):
        out["stream"] = True
    if salt is not None:
        out["cache_salt"] = salt
    if body.get("request_id") is not None:
        out["rid"] = body["request_id"]
    return out
