"""The SGLang dialect's routes: the same engine core behind SGLang 0.5.23's HTTP server, as its
sources say it answers (`srt/entrypoints/http_server.py`, `srt/managers/io_struct.py`); answers in
`sglang_answers`. Not measured against a running SGLang: none runs on this machine (see the README).

Routes: `GET /health`, `GET /model_info` (`weight_version`, `model_path`, ...), `GET /server_info`
(`version`, the flags that change answers), `POST /generate` (native), `POST /v1/completions`,
`POST /v1/chat/completions`, `GET /v1/models`, `POST /update_weights_from_disk`,
`POST /update_weight_version`, `POST /pause_generation`, `POST /continue_generation`,
`GET|POST /flush_cache`.

What SGLang does, as modelled:
- `/update_weights_from_disk {model_path, weight_version?, flush_cache = true,
  abort_all_requests = false}` answers once the weights serve: `{"success", "message",
  "num_paused_requests"}`, 200 or 400. Unless generation is paused it first waits for the requests
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
  freezes them with their KV. Requests that arrive while paused are held. An unknown mode is
  FastAPI's 422 and changes nothing.
- `/flush_cache` answers text: 200 "Cache flushed. ..." when nothing runs (requests frozen by a
  retract do not count, as SGLang ignores its waiting queue while paused), else 400.
- With `--api-key` every route but `/health` asks for `Authorization: Bearer <key>` and refuses
  with 401 `{"error": "Unauthorized"}` (the HL-AUTH-1 fault leaves the RL routes open).
- Native `/generate` takes `input_ids` or `text`, `sampling_params` (`max_new_tokens` = 128,
  `temperature`, `top_p`, `top_k`, `stop`, `stop_token_ids`, `ignore_eos`, `sampling_seed`),
  `stream`, `return_logprob`, `logprob_start_len` (-1: no input logprobs), `top_logprobs_num`,
  `return_text_in_logprobs`, `return_prompt_token_ids`, `rid`, `cache_salt` and `extra_key` (both
  isolate the cache), `return_routed_experts` (answered with `--enable-return-routed-experts`
  only, from position 0); a body it cannot take is 400 `{"error": "<message>"}`. What the
  reference engine does not implement (penalties, min_new_tokens, several prompts, n > 1, other
  routed_experts_start_len) is refused, never ignored.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from pytest_rlrollout.reference.controller import Deployment, HotLoadError
from pytest_rlrollout.reference.inference_request import BadRequest, decode_json
from pytest_rlrollout.reference.replica import TooEarly, Unavailable
from pytest_rlrollout.reference.settings import SGLANG_VERSION
from pytest_rlrollout.reference.sglang_answers import SglangOpenAIRun, SglangRun, native_error
from pytest_rlrollout.reference.vllm_app import VllmJson, VllmRoutes, guard_error
from pytest_rlrollout.reference.vllm_requests import VllmError
from pytest_rlrollout.reference.wire import Guarded, off_loop, read_body

MODES = {"abort": ("abort", False), "retract": ("keep", True), "in_place": ("keep", False)}  # -> engine core
SAMPLING = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
            "stop": "stop", "stop_token_ids": "stop_token_ids", "ignore_eos": "ignore_eos",
            "sampling_seed": "seed", "n": "n", "min_new_tokens": "min_tokens", "min_p": "min_p",
            "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
            "repetition_penalty": "repetition_penalty", "skip_special_tokens": None,
            "spaces_between_special_tokens": None, "no_stop_trim": None}  # fmt: skip
# GenerateReqInput's fields the reference engine does not implement (other unknown fields are
# ignored, as SGLang's schema ignores them at the top level; in sampling_params it refuses them)
UNIMPLEMENTED = ("input_embeds", "image_data", "video_data", "audio_data", "lora_path", "lora_id", "session_params",
                 "token_ids_logprob", "return_hidden_states", "custom_logit_processor", "return_sampling_mask")  # fmt: skip
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, "
           "the operation will not be performed.)\n")  # fmt: skip
NOT_FLUSHED = ("Weights were updated, but the cache was not flushed because requests are still running or queued. "
               "Retract or finish them, then call /flush_cache.")  # fmt: skip


class NativeError(Exception):
    """A native request SGLang refuses: 400 `{"error": message}`."""


def unprocessable(loc: list[str], kind: str, msg: str, value: Any) -> Response:
    """FastAPI's 422 for a body that does not fit the route's model."""
    return VllmJson({"detail": [{"type": kind, "loc": loc, "msg": msg, "input": value}]}, 422)


class SglangRoutes(VllmRoutes):
    """The handlers, over one deployment (the OpenAI routes are the vLLM dialect's, reshaped)."""

    run_class = SglangOpenAIRun

    def __init__(self, dep: Deployment):
        super().__init__(dep)
        self.model_path = str(dep.full_dirs[self.s.base_identity])
        self.pause_mode: str | None = None

    # ----------------------------------------------------------------------- about the server

    async def model_info(self, request: Request) -> Response:
        label = self.dep.info_label
        info = {"model_path": self.model_path, "served_model_name": self.s.model, "tokenizer_path": self.model_path,
                "is_generation": True, "preferred_sampling_params": None, "load_format": "auto",
                "model_type": self.dep.config.get("model_type"),
                "architectures": self.dep.config.get("architectures")}  # fmt: skip
        if self.s.fault("HL-GET-1"):  # the bug: the label under another key
            return VllmJson(info | {"status": {"weight_version": label}})
        return VllmJson(info | {"weight_version": label})

    async def server_info(self, request: Request) -> Response:
        return VllmJson({"version": SGLANG_VERSION, "model_path": self.model_path, "weight_version":
                         self.dep.info_label, "enable_return_routed_experts": self.s.routed_experts,
                         "enable_cache_report": True, "page_size": self.s.block_size})  # fmt: skip

    # ----------------------------------------------------------------------- native generate

    def _native(self, doc: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """A native body as the vLLM dialect's generate body (the engine's request) and the
        native options the answer needs."""
        if not isinstance(doc, dict):
            raise NativeError("the request body must be a JSON object")
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
        sp = doc.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise NativeError("sampling_params must be an object")
        bad = sorted(set(sp) - set(SAMPLING))
        if bad:  # serde's words, as SGLang's schema answers
            raise NativeError(f"unknown field `{bad[0]}`, expected one of {', '.join(f'`{k}`' for k in SAMPLING)}")
        params = {SAMPLING[k]: v for k, v in sp.items() if SAMPLING[k] is not None and v is not None}
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
        body: dict[str, Any] = {"token_ids": ids, "sampling_params": params, "stream": bool(doc.get("stream")),
                                "output_mode": "tokens"}  # fmt: skip
        if salts:
            body["cache_salt"] = "\x1f".join(salts)
        if doc.get("rid") is not None:
            body["request_id"] = str(doc["rid"])
        native = {"logprob_start": max(start, 0), "want_logprobs": want, "text": bool(doc.get("return_text_in_logprobs")),
                  "routed": bool(doc.get("return_routed_experts")) and self.s.routed_experts,
                  "prompt_ids": bool(doc.get("return_prompt_token_ids"))}  # fmt: skip
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

    async def _json(self, request: Request) -> Any:
        return decode_json(await read_body(request, self.s, media=False))

    async def update_weights_from_disk(self, request: Request) -> Response:
        try:
            doc = await self._json(request)
        except BadRequest as e:
            return unprocessable(["body"], "json_invalid", "JSON decode error", str(e))
        if not isinstance(doc, dict) or not isinstance(doc.get("model_path"), str):
            value = doc.get("model_path") if isinstance(doc, dict) else doc
            kind, msg = (
                ("missing", "Field required") if value is None else ("string_type", "Input should be a valid string")
            )
            return unprocessable(["body", "model_path"], kind, msg, value)
        version, flush = doc.get("weight_version"), doc.get("flush_cache", True)
        if version is not None and not isinstance(version, str):
            return unprocessable(["body", "weight_version"], "string_type", "Input should be a valid string", version)
        dep = self.dep
        if doc.get("abort_all_requests"):
            for replica in dep.replicas:
                replica.end_in_flight(("end", "abort"))
        drain = self.pause_mode is None  # SGLang's writer lock: what runs finishes first, new requests wait
        if drain:
            await off_loop(lambda: dep.pause("wait", False), dep.control)
        try:
            await off_loop(lambda: dep.reload_weights(doc["model_path"]), dep.signals)
        except HotLoadError as e:
            return VllmJson({"success": False, "message": f"Failed to update weights: {e.message}",
                             "num_paused_requests": 0}, 400)  # fmt: skip
        finally:
            if drain:
                await off_loop(dep.resume, dep.control)
        if flush and not await self._flush_cache():
            return VllmJson({"success": False, "message": NOT_FLUSHED, "num_paused_requests": 0}, 400)
        self.model_path = doc["model_path"]
        message = "Succeeded to update model weights."
        if version is not None:
            dep.set_label(version)
            message += f" Weight version updated to {version}."
        if self.s.fault("HL-POST-1"):  # the bug: an empty answer
            return Response(b"", 200)
        return VllmJson({"success": True, "message": message, "num_paused_requests": 0})

    async def update_weight_version(self, request: Request) -> Response:
        try:
            doc = await self._json(request)
        except BadRequest as e:
            return unprocessable(["body"], "json_invalid", "JSON decode error", str(e))
        version = doc.get("new_version") if isinstance(doc, dict) else None
        if not isinstance(version, str):
            kind, msg = (
                ("missing", "Field required") if version is None else ("string_type", "Input should be a valid string")
            )
            return unprocessable(["body", "new_version"], kind, msg, version)
        if doc.get("abort_all_requests", True):
            for replica in self.dep.replicas:
                replica.end_in_flight(("end", "abort"))
        self.dep.set_label(version)
        return VllmJson({"success": True, "message": f"Weight version updated to {version}", "new_version": version})

    # ----------------------------------------------------------------------- pause and caches

    async def pause_generation(self, request: Request) -> Response:
        try:
            raw = await read_body(request, self.s, media=False)
            doc = json.loads(raw) if raw.strip() else {}
        except (BadRequest, ValueError, RecursionError) as e:
            return unprocessable(["body"], "json_invalid", "JSON decode error", str(e)[:200])
        mode = doc.get("mode", "abort") if isinstance(doc, dict) else doc
        if mode not in MODES and not self.s.fault("CTL-PAUSE-5"):
            expected = "'abort', 'retract' or 'in_place'"
            return unprocessable(["body", "mode"], "literal_error", f"Input should be {expected}", mode)
        core, recompute = MODES.get(mode, ("unknown", False))
        await off_loop(lambda: self.dep.pause(core, False, recompute=recompute), self.dep.control)
        self.pause_mode = mode if mode in MODES else "abort"
        await self._flush()
        return VllmJson({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: Request) -> Response:
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
    app = Starlette(routes=SglangRoutes(dep).routes(), exception_handlers={HTTPException: _http_exception,
                                                                             Exception: _crash})  # fmt: skip
    return Guarded(app, dep.requests, s.max_body_bytes, s.max_header_bytes, guard_error)
