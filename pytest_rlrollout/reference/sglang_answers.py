"""A request's answer on SGLang 0.5.23's wire, read from its sources (`srt/managers/io_struct.py`,
`tokenizer_manager.py`, `utils/weight_versions.py`, `entrypoints/openai/protocol.py`); no SGLang
server was run here (its registry wheel is a CUDA build, its CPU backend needs Intel AMX).

- Native `/generate`: `{"text", "output_ids", "meta_info"}`; streamed, every chunk repeats the
  whole output so far (SGLang's default, without `--incremental-streaming-output`), then
  `data: [DONE]`. `meta_info`: `id`, `finish_reason` (null until the end, then `{"type": "length",
  "length": n}`, `{"type": "stop", "matched": id|str}` or `{"type": "abort", "message"}`),
  `prompt_tokens`, `completion_tokens`, `cached_tokens`, `weight_version` (the label the server
  has when the chunk is written), `num_retractions`, `reasoning_tokens`; with `return_logprob`,
  `input_token_logprobs` (from `logprob_start_len`, the first position `[null, id, text]`) and
  `output_token_logprobs` as `[logprob, id, text or null]`; the finished chunk adds the
  `weight_versions` spans `[{version, start, end}]`, `weight_version` = the last span's,
  `e2e_latency`, and `routed_experts` (base64 of int32 `[prompt + output - 1 - start, layers,
  k]`, no header) when asked for on a server with `--enable-return-routed-experts`.
- OpenAI routes: the vLLM dialect's run in SGLang's response models: a choice's `matched_stop`
  (not `stop_reason`), no vLLM-only fields, and `metadata {weight_version, weight_versions}` on
  non-streamed answers; routing is answered on the native route only.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from pytest_rlrollout.reference.vllm_answers import DONE, ConnectionDropped, Cut, Position, VllmRun
from pytest_rlrollout.reference.vllm_requests import VllmError

VLLM_ONLY = ("service_tier", "system_fingerprint", "kv_transfer_params", "ec_transfer_params", "metrics",
             "prompt_text", "prompt_logprobs")  # fmt: skip


def sse(doc: Any) -> bytes:
    return b"data: " + json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def native_error(message: str, status: int = 400) -> dict[str, Any]:
    """What SGLang writes into a native stream that failed after its head went out."""
    return {"error": {"message": message, "type": "invalid_request_error", "code": status, "retryable": False}}


class SglangRun(VllmRun):
    """A native `/generate` request: the engine's run, answered in SGLang's `meta_info` shapes."""

    def __init__(self, *args: Any, logprob_start: int, want_logprobs: bool, routed: bool, text: bool,
                 prompt_ids: bool) -> None:  # fmt: skip
        super().__init__(*args)
        self.logprob_start, self.want_logprobs, self.routed, self.with_text = logprob_start, want_logprobs, routed, text
        self.prompt_ids = prompt_ids
        self.rid = self.req.request_id or self.id.removeprefix("generate-tokens-")

    # ----------------------------------------------------------------------- meta_info

    def _entry(self, pos: Position) -> list[Any]:
        text = self.vt.token(pos.token, pos.context) if self.with_text else None
        return [pos.logprob, pos.token, text]

    def _finish(self, finish: str | None) -> dict[str, Any] | None:
        if finish is None:
            return None
        if finish == "length":
            return {"type": "length", "length": len(self.tokens)}
        if finish == "abort":
            return {"type": "abort", "message": "Abort before or during generation."}
        matched = self.stop_reason if self.stop_reason is not None else (self.tokens[-1].id if self.tokens else None)
        return {"type": "stop", "matched": matched}

    def meta(self, finish: str | None, streamed: bool) -> dict[str, Any]:
        n = len(self.tokens)
        meta: dict[str, Any] = {"id": self.rid, "finish_reason": self._finish(finish),
                                "prompt_tokens": len(self.req.prompt),
                                "weight_version": self.replica_obj.label or "default", "num_retractions": 0,
                                "reasoning_tokens": 0,
                                "completion_tokens": n + (1 if self.f("INF-USAGE-1") else 0)}  # fmt: skip
        if not (streamed and self.f("CACHE-RPT-1")):  # the fault: streamed answers without cached tokens
            meta["cached_tokens"] = self.cached
        if self.want_logprobs:
            prompt = self.prompt_positions or []
            meta["input_token_logprobs"] = [self._entry(p) for p in prompt[self.logprob_start :]] if prompt else []
            meta["output_token_logprobs"] = [self._entry(self.position(i)) for i in range(n)]
            meta["output_token_logprobs_length"] = n
        if finish is not None:
            spans = self.spans()
            visible = [s for s in spans if s["start"] < n or s["start"] == 0]
            meta["weight_versions"] = visible
            if visible:
                meta["weight_version"] = visible[-1]["version"]
            meta["e2e_latency"] = round(time.monotonic() - self.t0, 6)
            routed = self.routed_experts_raw(streamed)
            if routed is not None:
                meta["routed_experts"] = routed
        return meta

    def routed_experts_raw(self, streamed: bool) -> str | None:
        """The routed experts as SGLang encodes them: the int32 array's bytes, no header."""
        rows = self.routed_rows(streamed) if self.routed else None
        return None if rows is None else base64.b64encode(np.ascontiguousarray(rows, dtype=np.int32).tobytes()).decode()

    def answer(self, finish: str | None, streamed: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text_out, "output_ids": self.output_ids() if finish else
                               [t.id for t in self.tokens], "meta_info": self.meta(finish, streamed)}  # fmt: skip
        if self.prompt_ids:
            out["prompt_token_ids"] = self.req.prompt
        return out

    # ----------------------------------------------------------------------- answers

    async def stream(self) -> AsyncIterator[bytes]:
        try:
            kind, value = await self.first()  # held here while generation is paused
            if kind == "error":
                raise VllmError(value[1], value[0])
            async for d in self.deltas():
                if not d.tokens and d.finish is None:
                    continue
                yield sse(self.answer(d.finish, True))
            if not self.f("INF-SSE-1"):  # the fault: the stream ends without [DONE]
                yield DONE
        except Cut:  # SWAP-ASYNC-1 fault: a last chunk says abort, and the stream just stops
            yield sse(self.answer("abort", True))
        except VllmError as e:
            yield sse(native_error(e.message, e.status))
            yield DONE
        except ConnectionDropped:
            raise
        finally:
            self.job.cancelled.set()

    async def native_body(self) -> dict[str, Any]:
        await self.drain()
        return self.answer(self.finish or "stop", False)


class SglangOpenAIRun(VllmRun):
    """An OpenAI-route request: the vLLM dialect's answer in SGLang's response models."""

    def _reshaped(self, doc: dict[str, Any], streamed: bool) -> dict[str, Any]:
        if "error" in doc:
            return doc
        out = {k: v for k, v in doc.items() if k not in VLLM_ONLY}
        choices = []
        for choice in out.get("choices") or []:
            choice = {k: v for k, v in choice.items() if k not in ("routed_experts", "prompt_logprobs")}
            if "stop_reason" in choice:
                choice["matched_stop"] = choice.pop("stop_reason")
            choices.append(choice)
        out["choices"] = choices
        if not streamed:
            spans = self.spans()
            out["metadata"] = {"weight_version": spans[-1]["version"] if spans else self.replica_obj.label,
                               "weight_versions": spans}  # fmt: skip
        return out

    def _sse(self, doc: dict[str, Any]) -> bytes:  # type: ignore[override]
        return sse(self._reshaped(doc, True))

    async def body(self) -> dict[str, Any]:
        return self._reshaped(await super().body(), False)
