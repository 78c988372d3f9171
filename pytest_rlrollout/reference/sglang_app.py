"""The SGLang dialect's routes: the same engine core behind SGLang 0.5.23's HTTP server, as its
sources say it answers (`srt/entrypoints/http_server.py`, `srt/managers/io_struct.py`); answers in
`sglang_answers`. Not measured against a running SGLang: none runs on this machine (see the README).

Routes: `GET /health`, `GET /model_info` (`weight_version`, `model_path`, ...: what a weight update
moves), `GET /server_info` (`version`, the flags that change answers, the start-up `model_path` and
`weight_version`), `POST /generate` (native), `POST /v1/completions`,
`POST /v1/chat/completions`, `GET /v1/models`, `POST /update_weights_from_disk`,
`POST /update_weight_version`, `POST /pause_generation`, `POST /continue_generation`,
`GET|POST /flush_cache`.

What SGLang does, as modelled:
- `/update_weights_from_disk {model_path, weight_version?, flush_cache = true,
  abort_all_requests = false}` answers once the weights serve: `{"success", "message",
  "num_paused_requests"}`, 200 or 400 (a directory it cannot read: "Failed to get weights iterator:
  ...", a snapshot it cannot load: "Failed to update weights: ...\nRolling back to original
  weights."). On success `model_path` and `served_model_name` of /model_info become the
  directory loaded. Unless generation is paused it first waits for the requests
  in flight to finish, holding new ones (SGLang's writer lock): they finish on the old weights.
  Paused, it swaps at once; the requests frozen by the pause continue on the new weights once
  generation continues. A refused snapshot changes nothing. With `flush_cache` the radix cache is
  flushed after the swap; a flush refused (requests frozen in place still hold their KV) answers
  400 "Weights were updated, but the cache was not flushed ..." *after* the weights were swapped,
  and the label is not updated then (SGLang sets it only on success).
- `/update_weight_version {new_version, abort_all_requests = true}`: by default every request in
  flight is aborted first.
- `/pause_generation {mode}`: `abort` ends the requests in flight (finish_reason abort);
  `retract` freezes them and they recompute their KV once generation continues; `in_place`
  freezes them with their KV. Requests that arrive while paused are held. An unknown mode changes
  nothing.
- A control route's body that does not fit its request struct (io_struct's msgspec structs, read
  by pydantic as the union "an instance of the struct" | "a dict built into it"; a missing body
  included) is refused as SGLang's RequestValidationError handler refuses it: 400 ErrorResponse
  `{"object": "error", "message": <FastAPI's text of the errors>, "type": "Bad Request", "param":
  null, "code": 400}`, never FastAPI's 422.
- `/flush_cache` answers text: 200 "Cache flushed. ..." when nothing runs (requests frozen by a
  retract do not count, as SGLang ignores its waiting queue while paused), else 400.
- With `--api-key` every route but `/health` asks for `Authorization: Bearer <key>` and refuses
  with 401 `{"error": "Unauthorized"}` (the HL-AUTH-1 fault leaves the RL routes open).
- Native `/generate` takes `input_ids` or `text`, `sampling_params` (`max_new_tokens` = 128,
  `temperature`, `top_p`, `top_k`, `stop`, `stop_token_ids`, `ignore_eos`, `sampling_seed`),
  `stream`, `return_logprob`, `logprob_start_len` (-1: no input logprobs), `top_logprobs_num`,
  `return_text_in_logprobs`, `return_prompt_token_ids`, `rid`, `cache_salt` and `extra_key` (both
  isolate the cache), `return_routed_experts` (answered with `--enable-return-routed-experts`
  only, from position 0); a body it cannot take is 400 `{"error": "<message>"}`: a
  sampling_params key SGLang's schema does not have in serde's words, as its JSON contract gate
  answers (`unknown field `x`, expected one of `max_new_tokens`, ...`). Unknown top-level fields
  are ignored, as that schema ignores them. What the reference engine does not implement
  (penalties, min_new_tokens, structured output, several prompts, n > 1, other
  routed_experts_start_len) is refused, never ignored.
- `GET /v1/models`: SGLang's ModelCard (`owned_by` "sglang", `root` the served model name).

Where it departs from SGLang on purpose, or does not model it (a real server would differ):
- Errors of the OpenAI routes keep the contract's `{"error": {"message"}}`; SGLang answers them flat
  (`serving_base.create_error_response`: `{"object": "error", "message", "type", "param",
  "code"}`), which INF-ERR-1 would fail. Native errors are `{"error": "<str>"}` in vLLM's words;
  SGLang's schema failures are 400 ErrorResponse, and a streamed bad request gets 200 and an error
  event. `logprob_start_len` past the prompt is not refused.
- A request's `model` is checked (404 for another); SGLang does not check it.
- `sglext.routed_experts` / `return_routed_experts` on the OpenAI routes, `/flush_cache?timeout=`,
  the update fields `keep_pause`, `is_async`, `load_format`, `--incremental-streaming-output`,
  `stream_interval`, `no_stop_trim` and `skip_special_tokens=false` are ignored.
- An output of no tokens has `weight_versions: []` (SGLang: one zero-length span); the radix
  cache is modelled by blocks of 16 tokens (SGLang caches any prefix).
"""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from pytest_rlrollout.engines.sglang import NAME as OWNED_BY  # the card names the engine
from pytest_rlrollout.reference.controller import Deployment, HotLoadError
from pytest_rlrollout.reference.inference_request import BadRequest, decode_json
from pytest_rlrollout.reference.replica import TooEarly, Unavailable
from pytest_rlrollout.reference.settings import FIRST_LABEL, SGLANG_VERSION
from pytest_rlrollout.reference.sglang_answers import SglangOpenAIRun, SglangRun, native_error
from pytest_rlrollout.reference.vllm_app import VllmJson, VllmRoutes, guard_error
from pytest_rlrollout.reference.vllm_requests import VllmError
from pytest_rlrollout.reference.wire import Guarded, off_loop, on_http_errors, read_body

MODES = {"abort": ("abort", False), "retract": ("keep", True), "in_place": ("keep", False)}  # -> engine core
# SGLang's sampling_params schema, its order (sglang/api/v1/api_types.py, _FIELDS_SamplingParams)
SAMPLING_FIELDS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)
EXPECTED = ", ".join(f"`{k}`" for k in SAMPLING_FIELDS)  # api_types._unknown_field's list
# what the reference engine takes of them (None: read and ignored); the others are refused
SAMPLING = {
    "max_new_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "sampling_seed": "seed",
    "n": "n",
    "min_new_tokens": "min_tokens",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "skip_special_tokens": None,
    "spaces_between_special_tokens": None,
    "no_stop_trim": None,
}
# GenerateReqInput's fields the reference engine does not implement (other unknown fields are
# ignored, as SGLang's schema ignores them at the top level; in sampling_params it refuses them)
UNIMPLEMENTED = (
    "input_embeds",
    "image_data",
    "video_data",
    "audio_data",
    "lora_path",
    "lora_id",
    "session_params",
    "token_ids_logprob",
    "return_hidden_states",
    "custom_logit_processor",
    "return_sampling_mask",
)
# where SGLang's handlers are (http_server.py: the first decorator's line), as FastAPI names them in a refusal
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
HANDLERS = {
    "/update_weights_from_disk": (1300, "update_weights_from_disk"),
    "/update_weight_version": (1527, "update_weight_version"),
    "/pause_generation": (1831, "pause_generation"),
    "/continue_generation": (1844, "continue_generation"),
}
# the request structs' fields the reference reads (io_struct.py, BaseReq's first), by kind
BASE_FIELDS: dict[str, Any] = {"rid": "optional str", "http_worker_ipc": "optional str"}
STRUCTS: dict[str, tuple[str, dict[str, Any]]] = {
    "/update_weights_from_disk": (
        "UpdateWeightFromDiskReqInput",
        BASE_FIELDS
        | {
            "model_path": "str",
            "load_format": "optional str",
            "abort_all_requests": "bool",
            "weight_version": "optional str",
            "is_async": "bool",
            "torch_empty_cache": "bool",
            "keep_pause": "bool",
            "recapture_cuda_graph": "bool",
            "flush_cache": "bool",
        },
    ),
    "/update_weight_version": (
        "UpdateWeightVersionReqInput",
        BASE_FIELDS | {"new_version": "str", "abort_all_requests": "bool"},
    ),
    "/pause_generation": ("PauseGenerationReqInput", BASE_FIELDS | {"mode": ("abort", "retract", "in_place")}),
    "/continue_generation": ("ContinueGenerationReqInput", BASE_FIELDS | {"torch_empty_cache": "bool"}),
}
TRUE, FALSE = {"1", "on", "t", "true", "y", "yes"}, {"0", "off", "f", "false", "n", "no"}  # pydantic's lax booleans
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, "
    "the operation will not be performed.)\n"
)
NOT_FLUSHED = (
    "Weights were updated, but the cache was not flushed because requests are still running or queued. "
    "Retract or finish them, then call /flush_cache."
)


class NativeError(Exception):
    """A native request SGLang refuses: 400 `{"error": message}`."""


def field_error(kind: Any, doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    """pydantic's error for field `name` of `doc` (python mode, lax), None when it fits."""
    if name not in doc:
        return {"type": "missing", "msg": "Field required", "input": doc} if kind == "str" else None
    value = doc[name]
    if isinstance(kind, tuple):  # a Literal
        if isinstance(value, str) and value in kind:
            return None
        expected = ", ".join(repr(v) for v in kind[:-1]) + f" or {kind[-1]!r}"
        return {
            "type": "literal_error",
            "msg": f"Input should be {expected}",
            "input": value,
            "ctx": {"expected": expected},
        }
    if kind == "bool":
        if isinstance(value, bool) or (isinstance(value, int | float) and value in (0, 1)):
            return None
        if isinstance(value, str) and value.lower() in TRUE | FALSE:
            return None
        if isinstance(value, str | int | float):
            return {
                "type": "bool_parsing",
                "msg": "Input should be a valid boolean, unable to interpret input",
                "input": value,
            }
        return {"type": "bool_type", "msg": "Input should be a valid boolean", "input": value}
    if isinstance(value, str) or (value is None and kind == "optional str"):
        return None
    return {"type": "string_type", "msg": "Input should be a valid string", "input": value}


def lax_bool(value: Any) -> bool:
    """A boolean field's value once pydantic accepted it."""
    return value.lower() in TRUE if isinstance(value, str) else bool(value)


def struct_body(path: str, raw: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The body of a control route and what FastAPI refuses in it (nothing: `[]`), as pydantic
    lists the errors of io_struct's msgspec structs (msgspec_utils.msgspec_struct_pydantic_core_schema:
    the union of "an instance of the struct" and "a dict built into it", both branches reported)."""
    if not raw:
        return {}, [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        return {}, [
            {
                "type": "json_invalid",
                "loc": ("body", e.pos),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": e.msg},
            }
        ]
    except (ValueError, RecursionError) as e:
        return {}, [
            {
                "type": "json_invalid",
                "loc": ("body", 0),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": str(e)[:200]},
            }
        ]
    model, fields = STRUCTS[path]
    branch = ("body", f"function-after[build_struct(), {model}]")
    if isinstance(doc, dict):
        found = [(name, field_error(kind, doc, name)) for name, kind in fields.items()]
        errors = [
            {"type": e["type"], "loc": (*branch, name)} | {k: v for k, v in e.items() if k != "type"}
            for name, e in found
            if e is not None
        ]
    else:
        errors = [{"type": "dict_type", "loc": branch, "msg": "Input should be a valid dictionary", "input": doc}]
    if not errors:
        return doc, []
    instance = {
        "type": "is_instance_of",
        "loc": ("body", f"is-instance[{model}]"),
        "msg": f"Input should be an instance of {model}",
        "input": doc,
        "ctx": {"class": model},
    }
    return {}, [instance, *errors]


def refused(path: str, errors: list[dict[str, Any]]) -> Response:
    """http_server.validation_exception_handler: 400 ErrorResponse whose message is FastAPI's text of
    the RequestValidationError (its errors, where the endpoint is) and then the list of errors."""
    line, function = HANDLERS[path]
    listed = "".join(f"  {e}\n" for e in errors)
    head = f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}:\n"
    text = f'{head}{listed}\n  File "{HTTP_SERVER}", line {line}, in {function}\n    POST {path}'.rstrip()
    return VllmJson(
        {"object": "error", "message": f"{text} {errors}", "type": "Bad Request", "param": None, "code": 400}, 400
    )


class SglangRoutes(VllmRoutes):
    """The handlers, over one deployment (the OpenAI routes are the vLLM dialect's, reshaped)."""

    run_class = SglangOpenAIRun

    def __init__(self, dep: Deployment):
        super().__init__(dep)
        self.started_from = self.model_path = str(dep.full_dirs[self.s.base_identity])
        self.served_model_name = self.s.model  # --served-model-name; a weight update moves it to the path loaded
        self.pause_mode: str | None = None

    # ----------------------------------------------------------------------- about the server

    async def model_info(self, request: Request) -> Response:
        """http_server.model_info: what a weight update moves (model_path, served_model_name, the
        label); the tokenizer stays where the server started."""
        label = self.dep.info_label
        head = {
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.started_from,
            "is_generation": True,
            "preferred_sampling_params": None,
        }
        tail = {
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.dep.config.get("model_type"),
            "architectures": self.dep.config.get("architectures"),
        }
        if self.s.fault("HL-GET-1"):  # the bug: the label under another key
            return VllmJson(head | tail | {"status": {"weight_version": label}})
        return VllmJson(head | {"weight_version": label} | tail)

    async def server_info(self, request: Request) -> Response:
        """http_server.server_info: the start-up configuration (what the control plane changes
        after start-up is /model_info's to say) and the version."""
        return VllmJson(
            {
                "model_path": self.started_from,
                "served_model_name": self.s.model,
                "weight_version": FIRST_LABEL,
                "enable_return_routed_experts": self.s.routed_experts,
                "enable_cache_report": True,
                "page_size": self.s.block_size,
                "context_length": self.s.max_context,
                "version": SGLANG_VERSION,
                "frontend": "python",
            }
        )

    async def models(self, request: Request) -> Response:
        """http_server.available_models: protocol.ModelCard of the served model name."""
        card = {
            "id": self.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": OWNED_BY,
            "root": self.served_model_name,
            "parent": None,
            "max_model_len": self.s.max_context,
        }
        return VllmJson({"object": "list", "data": [card]})

    # ----------------------------------------------------------------------- native generate

    def _native(self, doc: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """A native body as the vLLM dialect's generate body (the engine's request) and the
        native options the answer needs."""
        if not isinstance(doc, dict):
            raise NativeError("the request body must be a JSON object")
        sp = doc.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise NativeError("sampling_params must be an object")
        bad = [k for k in sp if k not in SAMPLING_FIELDS]
        if bad:  # api_contract.generate_contract_error: serde's words, SGLang's schema
            raise NativeError(f"unknown field `{bad[0]}`, expected one of {EXPECTED}")
        unknown = [k for k in sp if k not in SAMPLING and sp[k] not in (None, [], {})]
        if unknown:
            raise NativeError(f"sampling_params {unknown} not implemented by the reference deployment")
        unimplemented = [k for k in UNIMPLEMENTED if doc.get(k) not in (None, False, [], {})]
        if unimplemented:
            raise NativeError(f"{unimplemented} not implemented by the reference deployment")
        ids, text = doc.get("input_ids"), doc.get("text")
        if (ids is None) == (text is None):
            raise NativeError("Either text or input_ids should be provided.")
        if text is not None:
            if not isinstance(text, str):
                raise NativeError("several prompts in one request are not implemented by the reference deployment")
            ids = self.vt.text.encode(text)
        params = {SAMPLING[k]: v for k, v in sp.items() if SAMPLING.get(k) is not None and v is not None}
        params.setdefault("max_tokens", 128)
        if params.get("top_k") == -1:
            del params["top_k"]  # SGLang's "every token"
        start = doc.get("logprob_start_len")
        start = -1 if start is None else start
        top = doc.get("top_logprobs_num") or 0
        for name, value in (("logprob_start_len", start), ("top_logprobs_num", top)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise NativeError(f"{name} must be an integer")
        want = bool(doc.get("return_logprob"))
        if want:
            params["logprobs"] = top
            if 0 <= start < len(ids) if isinstance(ids, list) else False:
                params["prompt_logprobs"] = top
        if doc.get("routed_experts_start_len") not in (None, 0):
            raise NativeError("routed_experts_start_len other than 0 is not implemented by the reference deployment")
        salts = [v for v in (doc.get("cache_salt"), doc.get("extra_key")) if v is not None]
        if not all(isinstance(v, str) for v in salts):
            raise NativeError("cache_salt and extra_key must be strings")
        body: dict[str, Any] = {
            "token_ids": ids,
            "sampling_params": params,
            "stream": bool(doc.get("stream")),
            "output_mode": "tokens",
        }
        if salts:
            body["cache_salt"] = "\x1f".join(salts)
        if doc.get("rid") is not None:
            body["request_id"] = str(doc["rid"])
        native = {
            "logprob_start": max(start, 0),
            "want_logprobs": want,
            "top": top if want else 0,
            "text": bool(doc.get("return_text_in_logprobs")),
            "routed": bool(doc.get("return_routed_experts")) and self.s.routed_experts,
            "prompt_ids": bool(doc.get("return_prompt_token_ids")),
        }
        return body, native

    async def generate(self, request: Request) -> Response:
        dep, s = self.dep, self.s

        def parse(raw: bytes) -> tuple[Any, dict[str, Any]]:
            body, native = self._native(decode_json(raw))
            return self.reader.generate(body), native

        try:
            raw = await read_body(request, s, media=False)
            req, native = await off_loop(lambda: parse(raw), dep.workers)
            run = SglangRun(dep, self.vt, req, {k.lower(): v for k, v in request.headers.items()}, **native)
        except BadRequest as e:
            if e.close:
                return VllmJson({"error": str(e)}, e.status, headers={"Connection": "close"})
            if s.fault("INF-ERR-1"):  # the bug: a body that is not JSON crashes the handler
                return VllmJson(native_error(f"internal error: {e}", 500), 500)
            return VllmJson({"error": str(e)}, 400)
        except NativeError as e:
            return VllmJson({"error": str(e)}, 400)
        except VllmError as e:  # what the engine's reader refuses (lengths, ids, sampling values)
            return VllmJson({"error": e.message}, 400)
        except Unavailable as e:
            return VllmJson(native_error(str(e), 503), 503)
        except TooEarly as e:
            return VllmJson(native_error(str(e), 425), 425, headers={"Retry-After": "1"})
        self.live.add(run)
        if req.stream:
            return StreamingResponse(self._written(run), media_type="text/event-stream")
        try:
            kind, value = await run.first()
            if kind == "error":
                status, message = value
                return VllmJson({"error": {"message": message}}, status)
            return VllmJson(await run.native_body())
        except VllmError as e:
            return VllmJson({"error": {"message": e.message}}, e.status)
        finally:
            self.live.discard(run)

    # ----------------------------------------------------------------------- weights and labels

    async def _struct(self, request: Request) -> tuple[dict[str, Any], Response | None]:
        """A control route's body as its io_struct request, or SGLang's refusal of it."""
        try:
            raw = await read_body(request, self.s, media=False)
        except BadRequest as e:
            return {}, VllmJson({"error": str(e)}, e.status, headers={"Connection": "close"} if e.close else None)
        doc, errors = struct_body(request.url.path, raw)
        return doc, (refused(request.url.path, errors) if errors else None)

    async def update_weights_from_disk(self, request: Request) -> Response:
        doc, refusal = await self._struct(request)
        if refusal is not None:
            return refusal
        version, flush = doc.get("weight_version"), lax_bool(doc.get("flush_cache", True))
        dep = self.dep
        if lax_bool(doc.get("abort_all_requests", False)):
            for replica in dep.replicas:
                replica.end_in_flight(("end", "abort"))
        drain = self.pause_mode is None  # SGLang's writer lock: what runs finishes first, new requests wait
        if drain:
            await off_loop(lambda: dep.pause("wait", False), dep.control)
        try:
            await off_loop(lambda: dep.reload_weights(doc["model_path"]), dep.signals)
        except HotLoadError as e:  # model_runner_components/weight_updater.update_weights_from_disk's words
            unread = "not found in the bucket" in e.message or "is not a snapshot directory" in e.message
            message = (
                f"Failed to get weights iterator: {e.message}."
                if unread
                else f"Failed to update weights: {e.message}.\nRolling back to original weights."
            )
            return VllmJson({"success": False, "message": message, "num_paused_requests": 0}, 400)
        finally:
            if drain:
                await off_loop(dep.resume, dep.control)
        if flush and not await self._flush_cache():
            return VllmJson({"success": False, "message": NOT_FLUSHED, "num_paused_requests": 0}, 400)
        self.model_path = self.served_model_name = doc["model_path"]  # tokenizer_manager._update_model_path_info
        message = "Succeeded to update model weights."
        if version is not None:
            dep.set_label(version)
            message += f" Weight version updated to {version}."
        if self.s.fault("HL-POST-1"):  # the bug: an empty answer
            return Response(b"", 200)
        return VllmJson({"success": True, "message": message, "num_paused_requests": 0})

    async def update_weight_version(self, request: Request) -> Response:
        doc, refusal = await self._struct(request)
        if refusal is not None:
            return refusal
        version = doc["new_version"]
        if lax_bool(doc.get("abort_all_requests", True)):
            for replica in self.dep.replicas:
                replica.end_in_flight(("end", "abort"))
        self.dep.set_label(version)
        return VllmJson({"success": True, "message": f"Weight version updated to {version}", "new_version": version})

    # ----------------------------------------------------------------------- pause and caches

    async def pause_generation(self, request: Request) -> Response:
        doc, refusal = await self._struct(request)
        if refusal is not None and not self.s.fault("CTL-PAUSE-5"):
            return refusal
        mode = doc.get("mode", "abort") if refusal is None else "unknown"
        core, recompute = MODES.get(mode, ("unknown", False))
        await off_loop(lambda: self.dep.pause(core, False, recompute=recompute), self.dep.control)
        self.pause_mode = mode if mode in MODES else "abort"
        await self._flush()
        return VllmJson({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: Request) -> Response:
        _, refusal = await self._struct(request)
        if refusal is not None:
            return refusal
        await off_loop(self.dep.resume, self.dep.control)
        self.pause_mode = None
        return VllmJson({"message": "Generation continued successfully.", "status": "ok"})

    async def _flush_cache(self) -> bool:
        """SGLang's flush: only when nothing runs; requests frozen in place hold their KV."""
        if self.pause_mode == "in_place" and self.live and not self.s.fault("CTL-CACHE-1"):
            return False
        return await off_loop(lambda: self.dep.reset_prefix_cache(False), self.dep.control)

    async def flush_cache(self, request: Request) -> Response:
        if await self._flush_cache():
            return PlainTextResponse(FLUSHED)
        return PlainTextResponse("Flush cache failed.\n", 400)

    # ----------------------------------------------------------------------- the app

    def routes(self) -> list[Route]:
        g = self.guarded
        return [
            Route("/health", self.health, methods=["GET"]),
            Route("/model_info", g(self.model_info, rl=True), methods=["GET"]),
            Route("/server_info", g(self.server_info), methods=["GET"]),
            Route("/v1/models", g(self.models), methods=["GET"]),
            Route("/generate", g(self.generate), methods=["POST", "PUT"]),
            Route("/v1/completions", g(self.inference("completions")), methods=["POST"]),
            Route("/v1/chat/completions", g(self.inference("chat")), methods=["POST"]),
            Route("/update_weights_from_disk", g(self.update_weights_from_disk, rl=True), methods=["POST"]),
            Route("/update_weight_version", g(self.update_weight_version, rl=True), methods=["POST"]),
            Route("/pause_generation", g(self.pause_generation, rl=True), methods=["POST"]),
            Route("/continue_generation", g(self.continue_generation, rl=True), methods=["POST"]),
            Route("/flush_cache", g(self.flush_cache, rl=True), methods=["GET", "POST"]),
        ]


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    return VllmJson({"detail": exc.detail or "Not Found"}, exc.status_code)


async def _crash(request: Request, exc: Exception) -> Response:
    return VllmJson(native_error(f"internal error: {type(exc).__name__}", 500), 500)


def create_sglang_app(dep: Deployment) -> Guarded:
    s = dep.settings
    app = Starlette(
        routes=SglangRoutes(dep).routes(), exception_handlers={**on_http_errors(_http_exception), Exception: _crash}
    )
    return Guarded(app, dep.requests, s.max_body_bytes, s.max_header_bytes, guard_error)
