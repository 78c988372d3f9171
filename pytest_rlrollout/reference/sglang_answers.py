"""A request's answer on SGLang 0.5.23's wire, read from its sources (`srt/managers/io_struct.py`,
`tokenizer_manager.py`, `utils/weight_versions.py`, `entrypoints/openai/protocol.py`); no SGLang
server was run here (its registry wheel is a CUDA build, its CPU backend needs Intel AMX).

- Native `/generate`: `{"text", "output_ids", "meta_info"}`; streamed, every chunk repeats the
  whole output so far (SGLang's default, without `--incremental-streaming-output`), then
  `data: [DONE]`. `meta_info`: `id` (the rid: 32 hex digits unless given), `finish_reason` (null
  until the end, then `{"type": "length", "length": n}`, `{"type": "stop", "matched": id|str}` or,
  for a request aborted while it ran, `{"type": "abort", "message": "Aborted", "status_code":
  null, "err_type": null}`), `prompt_tokens`, `completion_tokens`, `cached_tokens`,
  `weight_version` (the label the server has when the chunk is written), `num_retractions`,
  `reasoning_tokens`; with `return_logprob`, `input_token_logprobs` (from `logprob_start_len`,
  its first entry `[null, id, text]` whatever that start) and `output_token_logprobs` as
  `[logprob, id, text or null]` (the text: the token decoded alone), and with `top_logprobs_num`
  > 0 `input_top_logprobs` / `output_top_logprobs` (per position the best `[logprob, id, text]`,
  null where the token list has null); the finished chunk adds the `weight_versions` spans
  `[{version, start, end}]`, `weight_version` = the last span's, `e2e_latency`, and
  `routed_experts` (base64 of int32 `[prompt + output - 1 - start, num_hidden_layers, k]`, no
  header, a dense layer's rows zeros) when asked for on a server with
  `--enable-return-routed-experts`.
- OpenAI routes: the vLLM dialect's run in SGLang's response models (`CompletionResponse`,
  `CompletionStreamResponse`, `ChatCompletionResponse`, the chat stream's `StreamChunk`): the
  rid as `id`, a choice's `matched_stop` (not `stop_reason`; the end-of-sequence id when that
  ended it), `token_ids` / `prompt_token_ids` (chat: `prompt_token_ids` / `response_token_ids`)
  only when asked for, a chat message's `reasoning_content`, `UsageInfo` (`reasoning_tokens`,
  `prompt_tokens_details: {cached_tokens}` as with `--enable-cache-report`), no vLLM-only field,
  and `metadata {weight_version, weight_versions}` on non-streamed answers. A chat stream says
  the role first, then the content, then the finish in a chunk of its own. Routing is answered
  on the native route only (SGLang's `sglext` is not modelled).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from pytest_rlrollout.reference.settings import FIRST_LABEL
from pytest_rlrollout.reference.vllm_answers import DONE, ConnectionDropped, Cut, Position, VllmRun
from pytest_rlrollout.reference.vllm_requests import VllmError
from pytest_rlrollout.reference.weights import moe_layers

# A request aborted while it runs (pause abort, abort_all_requests): schedule_batch.FINISH_ABORT()
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def sse(doc: Any) -> bytes:
    return b"data: " + json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def matched(run: VllmRun, finish: str | None) -> str | int | None:
    """What ended a request that stopped: the stop string or stop token id, else the end-of-sequence
    token it sampled (SGLang's FINISH_MATCHED_TOKEN names it; vLLM says nothing then)."""
    if finish != "stop":
        return None
    return run.stop_reason if run.stop_reason is not None else (run.tokens[-1].id if run.tokens else None)


def native_error(message: str, status: int = 400) -> dict[str, Any]:
    """What SGLang writes into a native stream that failed after its head went out."""
    return {"error": {"message": message, "type": "invalid_request_error", "code": status, "retryable": False}}


class SglangRun(VllmRun):
    """A native `/generate` request: the engine's run, answered in SGLang's `meta_info` shapes."""

    def __init__(
        self, *args: Any, logprob_start: int, want_logprobs: bool, top: int, routed: bool, text: bool, prompt_ids: bool
    ) -> None:
        super().__init__(*args)
        self.logprob_start, self.want_logprobs, self.routed, self.with_text = logprob_start, want_logprobs, routed, text
        self.top, self.prompt_ids = top, prompt_ids
        self.rid = self.req.request_id or uuid.uuid4().hex  # GenerateReqInput._normalize_single_inputs

    # ----------------------------------------------------------------------- meta_info

    def _text(self, token: int) -> str | None:
        """A logprobs entry's text: the token decoded alone (tokenizer_manager.detokenize_logprob_tokens)."""
        return self.vt.text.piece(token) if self.with_text else None

    def _entry(self, pos: Position, first: bool = False) -> list[Any]:
        return [None if first else pos.logprob, pos.token, self._text(pos.token)]

    def _top(self, pos: Position) -> list[list[Any]] | None:
        """The `top` best tokens of a position, best first (detokenize_top_logprobs_tokens)."""
        best = sorted(pos.items, key=lambda item: item[2])[: self.top]
        return [[lp, t, self._text(t)] for t, lp, _ in best] or None

    def _finish(self, finish: str | None) -> dict[str, Any] | None:
        if finish is None:
            return None
        if finish == "length":
            return {"type": "length", "length": len(self.tokens)}
        if finish == "abort":
            return dict(ABORTED)
        return {"type": "stop", "matched": matched(self, finish)}

    def meta(self, finish: str | None, streamed: bool) -> dict[str, Any]:
        n = len(self.tokens)
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self._finish(finish),
            "prompt_tokens": len(self.req.prompt),
            "weight_version": self.replica_obj.label or FIRST_LABEL,
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": n + (1 if self.f("INF-USAGE-1") else 0),
        }
        if not (streamed and self.f("CACHE-RPT-1")):  # the fault: streamed answers without cached tokens
            meta["cached_tokens"] = self.cached
        if self.want_logprobs:
            # from logprob_start_len on, the first entry without a logprob whatever that start
            # (logprob_result_processor._process_input_token_logprobs: [None] + logprobs[:-1])
            prompt = (self.prompt_positions or [])[self.logprob_start :]
            outputs = [self.position(i) for i in range(n)]
            meta["input_token_logprobs"] = [self._entry(p, first=i == 0) for i, p in enumerate(prompt)]
            meta["output_token_logprobs"] = [self._entry(p) for p in outputs]
            meta["output_token_logprobs_length"] = n
            if self.top > 0:
                meta["input_top_logprobs"] = [None if i == 0 else self._top(p) for i, p in enumerate(prompt)]
                meta["output_top_logprobs"] = [self._top(p) for p in outputs]
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
        """The routed experts as SGLang encodes them: the int32 array's bytes, no header, a row
        for every decoder layer (state_capturer/routed_experts.RoutedExpertsCapturer sizes its
        buffer by num_hidden_layers; a dense layer, which routes nothing, keeps its zeros)."""
        rows = self.routed_rows(streamed) if self.routed else None
        if rows is None:
            return None
        full = np.zeros((len(rows), len(self.replica_obj.model.layers), rows.shape[2]), dtype=np.int32)
        full[:, moe_layers(self.replica_obj.model), :] = rows
        return base64.b64encode(full.tobytes()).decode()

    def answer(self, finish: str | None, streamed: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "text": self.text_out,
            "output_ids": self.output_ids() if finish else [t.id for t in self.tokens],
            "meta_info": self.meta(finish, streamed),
        }
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
    """An OpenAI-route request: the vLLM dialect's run, answered in SGLang's response models
    (`entrypoints/openai/protocol.py`; serving_completions.py, serving_chat.py, sse_utils.py)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.id = uuid.uuid4().hex  # the request's rid (serving_base._generate_request_id_base gives none)

    # ----------------------------------------------------------------------- shapes

    def sglang_usage(self, usage: dict[str, Any] | None, cached: bool) -> dict[str, Any] | None:
        """vLLM's usage as SGLang's UsageInfo (usage_processor.calculate_token_usage); `cached`:
        with prompt_tokens_details (--enable-cache-report), as on the final usage, not continuous."""
        if usage is None:
            return None
        details = usage.get("prompt_tokens_details")
        shown = {"cached_tokens": details.get("cached_tokens", 0)} if cached and isinstance(details, dict) else None
        return {
            "prompt_tokens": usage["prompt_tokens"],
            "total_tokens": usage["total_tokens"],
            "completion_tokens": usage["completion_tokens"],
            "prompt_tokens_details": shown,
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }

    def metadata(self) -> dict[str, Any]:
        """weight_versions.build_endpoint_weight_version_metadata of the finished request."""
        spans = self.spans()
        label = spans[-1]["version"] if spans else (self.replica_obj.label or FIRST_LABEL)
        return {"weight_version": label, "weight_versions": spans}

    @staticmethod
    def _delta(**fields: Any) -> dict[str, Any]:
        """sse_utils.StreamDelta: reasoning_content always said, role and content when set."""
        return {"reasoning_content": None} | {k: v for k, v in fields.items() if v is not None}

    def _chat_piece(self, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
        """sse_utils.build_sse_content's StreamChunk (no usage key unless given)."""
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish,
            "matched_stop": matched(self, finish),
        }
        return self._head() | {"choices": [choice]}

    def _reshaped_chunk(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        """A vLLM-dialect chunk as SGLang streams it (none, one, or a chat token chunk and the
        chunk that says its finish)."""
        if "error" in doc:
            return [doc]
        choices = doc.get("choices") or []
        if self.req.route == "chat":
            if not choices:  # the usage chunk: ChatCompletionStreamResponse.model_dump_json()
                return [self._head() | {"choices": [], "usage": self.sglang_usage(doc.get("usage"), True)}]
            vc = choices[0]
            delta, finish = vc.get("delta") or {}, vc.get("finish_reason")
            out = []
            if delta.get("role"):
                out.append(self._chat_piece(self._delta(role=delta["role"], content=delta.get("content"))))
            elif delta.get("content"):  # a step that adds no text adds no chunk (its logprobs go with it)
                out.append(self._chat_piece(self._delta(content=delta["content"]), vc.get("logprobs")))
            if finish is not None:
                out.append(self._chat_piece(self._delta(), finish=finish))
            if "usage" in doc:  # continuous usage stats, and the INF-SSE-1 fault's trailing 'usage': null
                out = out or [self._chat_piece(self._delta())]
                out[-1]["usage"] = self.sglang_usage(doc["usage"], False)
            return out
        if not choices:  # the usage chunk: model_dump_json(exclude_none=True)
            usage = self.sglang_usage(doc.get("usage"), True) or {}
            return [self._head() | {"choices": [], "usage": {k: v for k, v in usage.items() if v is not None}}]
        vc = choices[0]
        choice = {
            "index": 0,
            "text": vc.get("text", ""),
            "logprobs": vc.get("logprobs"),
            "finish_reason": vc.get("finish_reason"),
            "matched_stop": matched(self, vc.get("finish_reason")),
        }
        for key in ("token_ids", "prompt_token_ids"):
            if vc.get(key) is not None:
                choice[key] = vc[key]
        return [self._head() | {"choices": [choice], "usage": self.sglang_usage(doc.get("usage"), False)}]

    def _sse(self, doc: dict[str, Any]) -> bytes:  # type: ignore[override]
        return b"".join(sse(chunk) for chunk in self._reshaped_chunk(doc))

    # ----------------------------------------------------------------------- bodies

    def _completion_body(self, finish: str, positions: list[Position]) -> dict[str, Any]:
        vc = super()._completion_body(finish, positions)["choices"][0]
        choice = {
            "index": 0,
            "text": vc["text"],
            "logprobs": vc["logprobs"],
            "finish_reason": finish,
            "matched_stop": matched(self, finish),
        }
        if self.req.return_token_ids:
            choice |= {"token_ids": vc["token_ids"], "prompt_token_ids": self.req.prompt}
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.sglang_usage(self.usage(False), True),
            "metadata": self.metadata(),
        }

    def _chat_body(self, finish: str, positions: list[Position]) -> dict[str, Any]:
        vc = super()._chat_body(finish, positions)["choices"][0]
        message = {"role": "assistant", "content": vc["message"]["content"] or "", "reasoning_content": None}
        choice = {
            "index": 0,
            "message": message,
            "logprobs": vc["logprobs"],
            "finish_reason": finish,
            "matched_stop": matched(self, finish),
        }
        if self.req.return_token_ids:
            choice |= {"prompt_token_ids": self.req.prompt, "response_token_ids": vc["token_ids"]}
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.sglang_usage(self.usage(False), True),
            "metadata": self.metadata(),
        }
