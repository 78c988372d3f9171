"""The vLLM dialect's routes: the same engine core as the Fireworks dialect behind vLLM 0.32's
OpenAI and RL routes (a server started with `VLLM_SERVER_DEV_MODE=1 --enable-scale-out
--enable-prompt-tokens-details --served-model-name tiny`), answered as the measured server
answers them (`vllm_answers`, `vllm_requests`).

Routes: `GET /health`, `GET /version`, `GET /v1/models`, `POST /v1/completions`,
`POST /v1/chat/completions`, `POST /inference/v1/generate`, `GET /weight_info`,
`POST /update_weight_version`, `POST /collective_rpc` (reload_weights), `POST /pause`,
`POST /resume`, `GET /is_paused`, `POST /reset_prefix_cache`.

What the reference decided where vLLM's own behaviour was not measured, or differs on purpose:

- No API key is asked for unless the deployment has one (vLLM's `--api-key`): then a request
  without `Authorization: Bearer <key>` gets 401 `{"error": "Unauthorized"}` on the routes vLLM
  guards (`/v1/*`, `/inference/v1/generate`) and, unlike vLLM 0.32 (which leaves them open), on
  the RL routes too (`/weight_info`, `/update_weight_version`, `/collective_rpc`, `/pause`,
  `/resume`, `/is_paused`, `/reset_prefix_cache`): HL-AUTH-1. `/health` and `/version` stay open.
- reload_weights loads `weights_path`, an absolute path naming a directory of the bucket (one
  path segment below it, still inside it once symlinks are followed); without `weights_path` it
  reloads the base snapshot (vLLM reloads the path it started from). The snapshot is validated
  first (every SNAP MUST clause) and refused with 400 `BadRequestError`, "Call to collective_rpc
  method failed: ..." when it fails validation or loading; the previous weights keep serving.
  Real vLLM answers a failed reload 500 `InternalServerError` (and, measured here, may leave its
  engine dead); the reference never answers an input with a 5xx. Other collective_rpc methods
  are refused alike. The label does not change and the prefix cache is kept (vLLM's behaviour:
  a trainer resets it). `{"results": [null]}` has one entry per replica (vLLM: per worker).
- POST /pause defaults to `mode=abort&clear_cache=true` (vLLM's defaults); an unknown mode is
  pydantic's 400 (`query.mode`) and changes nothing. The answer comes once the pause took hold
  (wait: once the requests in flight finished) and what they streamed before it was written out.
  Requests that arrive while paused are held (not refused): a stream's headers go out at once and
  its first chunk after POST /resume, as measured; a non-streamed answer comes after the resume.
  An aborted stream's last chunk says `finish_reason: "abort"` with no token of its own (vLLM's
  may carry the last token: the reference ends requests between tokens).
  Keep with `clear_cache=true` makes the frozen requests recompute their KV on the weights served
  at resume (vLLM preempts them), and resets the prefix cache.
- POST /reset_prefix_cache answers `{"success": false}` and resets nothing while requests are
  in flight (vLLM refuses while their blocks are held), requests frozen by a keep pause included
  (measured on vLLM 0.32: `success: false` with one stream frozen, the log saying "some blocks (1)
  are not freed yet"), unless `reset_running_requests=true`: they then recompute their KV, the
  reset happens, and the stream goes on token for token (measured: every token of a 1,500-token
  stream came); they are not cached once they finish.
- A request with prompt logprobs does not read the prefix cache, as vLLM (its
  `skip_reading_prefix_cache` defaults to true then): its cached_tokens is 0 and every prompt
  position is computed. An explicit `skip_reading_prefix_cache: false` is not honoured for such a
  request (vLLM would leave the cached positions' prompt logprobs unfilled); `true` skips the
  cache for any request.
- Prefix-cache blocks are 128 tokens (the CPU backend measured here); `block_size` changes it.
- Measured vLLM bugs the reference does not reproduce (each is a fault switch instead): a reload
  leaves the MoE experts as they were (FID-SAME-1), the RL routes take no API key (HL-AUTH-1); a
  failed reload, which leaves vLLM's weights unloaded and kills its engine at the next request,
  is a refusal here. An unknown collective_rpc method is a 400 here (vLLM: 500, server alive).
- `routed_experts` only with `routed_experts=True` (vLLM's --enable-return-routed-experts, which
  the measured CPU server cannot enable: null on every choice otherwise), read from vLLM 0.32's
  sources: on the generate route's final chunk and on non-streamed choices.
- Not served: `/abort_requests`, `/weight_checker`, `/sleep`, `/tokenize`, the weight-transfer
  routes.
- One prompt per request, n = 1; sampling fields the engine does not implement are refused.
- The generate route's logprobs for a sampled token outside the top N list it first with its
  rank (vLLM's order); spans over no output tokens are `[]`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from http import HTTPStatus
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pytest_rlrollout.engines.vllm import NAME as OWNED_BY  # the card names the engine
from pytest_rlrollout.engines.vllm import PAUSED_MESSAGE
from pytest_rlrollout.reference.controller import Deployment, HotLoadError
from pytest_rlrollout.reference.inference_request import BadRequest, decode_json
from pytest_rlrollout.reference.replica import PAUSE_MODES, Paused, TooEarly, Unavailable
from pytest_rlrollout.reference.text import Text
from pytest_rlrollout.reference.vllm_answers import ConnectionDropped, VllmRun
from pytest_rlrollout.reference.vllm_requests import VllmError, VllmReader, VllmRequest, invalid, not_json
from pytest_rlrollout.reference.vllm_text import VllmText
from pytest_rlrollout.reference.wire import Guarded, off_loop, on_http_errors, read_body

FLUSH_STEPS = 200  # event-loop turns a pause waits for what was generated before it to be written
TRUE, FALSE = ("1", "true", "yes", "on", "t", "y"), ("0", "false", "no", "off", "f", "n")


async def _refused_stream(e: VllmError, route: str) -> Any:
    """vLLM 0.33's stream for a request the engine refused: one error event, then [DONE]. Its
    chat route says the error's type as InternalServerError, in compact JSON; the others say it
    as it is, with json.dumps' spaces."""
    if route == "chat":
        doc = VllmError(e.message, e.status, "InternalServerError").body()
        yield f"data: {json.dumps(doc, separators=(',', ':'))}\n\n".encode()
    else:
        yield f"data: {json.dumps(e.body())}\n\n".encode()
    yield b"data: [DONE]\n\n"


class VllmJson(JSONResponse):
    """vLLM's JSON: UTF-8 text as it is (ASCII escapes only where a string cannot be encoded)."""

    def render(self, content: Any) -> bytes:
        try:
            return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def answer(e: VllmError, headers: dict[str, str] | None = None) -> Response:
    return VllmJson(e.body(), e.status, headers=headers)


def http_error(status: int, message: str) -> Response:
    """FastAPI's HTTPException as vLLM's handler answers it."""
    return answer(VllmError(message, status, HTTPStatus(status).phrase))


def guard_error(status: int, message: str) -> Response:
    return answer(VllmError(message, status, "InternalServerError" if status == 500 else HTTPStatus(status).phrase))


def refused_body(e: BadRequest) -> Response:
    """A body refused before it was parsed: too large, too slow (the connection is closed), not JSON."""
    if e.close:
        return answer(VllmError(str(e), e.status, HTTPStatus(e.status).phrase), {"Connection": "close"})
    return answer(not_json(e))


UNAUTHORIZED = {"error": "Unauthorized"}  # vLLM's answer without the key (--api-key)


class VllmRoutes:
    """The handlers, over one deployment."""

    run_class: type[VllmRun] = VllmRun  # what answers a request (a dialect on vLLM's runs answers in its shapes)

    def __init__(self, dep: Deployment):
        self.dep, self.s = dep, dep.settings
        base = dep.full_dirs[self.s.base_identity]
        text = Text(base, dep.config)
        self.vt = VllmText(text, base, dep.config, self.s.vllm_release)
        self.reader = VllmReader(text, dep.config["vocab_size"], self.s.max_context, self.s.model)
        self.started = int(time.time())
        self.live: set[VllmRun] = set()  # requests whose answers are being written

    # ----------------------------------------------------------------------- who may call

    def guarded(self, handler: Any, rl: bool = False) -> Any:
        """`handler` behind the deployment's API key (none: open). `rl`: one of the RL routes,
        which vLLM leaves open and the HL-AUTH-1 fault leaves open too."""

        async def checked(request: Request) -> Response:
            key = self.s.api_key
            checks = key is not None and not (rl and self.s.fault("HL-AUTH-1"))
            if checks and request.headers.get("authorization") != f"Bearer {key}":
                return VllmJson(UNAUTHORIZED, 401)
            return await handler(request)

        return checked

    # ----------------------------------------------------------------------- about the server

    async def health(self, request: Request) -> Response:
        return Response(b"", 200)

    async def version(self, request: Request) -> Response:
        return VllmJson({"version": self.s.vllm_release})

    async def models(self, request: Request) -> Response:
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex[:16]}",
            "object": "model_permission",
            "created": self.started,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        card = {
            "id": self.s.model,
            "object": "model",
            "created": self.started,
            "owned_by": OWNED_BY,
            "root": str(self.dep.full_dirs[self.s.base_identity]),
            "parent": None,
            "max_model_len": self.s.max_context,
            "permission": [permission],
        }
        return VllmJson({"object": "list", "data": [card]})

    # ----------------------------------------------------------------------- inference

    def inference(self, route: str) -> Any:
        read = {"completions": self.reader.completion, "chat": self.reader.chat, "generate": self.reader.generate}[
            route
        ]
        dep, s = self.dep, self.s

        def parse(raw: bytes) -> VllmRequest:
            try:
                doc = decode_json(raw)
            except BadRequest as e:
                if s.fault("INF-ERR-1"):  # the bug: a body that is not JSON crashes the handler
                    raise VllmError(f"internal error: {e}", 500, "InternalServerError") from None
                raise VllmError(not_json(e).message, 400, "Bad Request", "body") from None
            return read(doc)

        async def handler(request: Request) -> Response:
            media = request.headers.get("content-type", "").lower().split(";", 1)[0].strip()
            try:
                raw = await read_body(request, s, media=False)
                if media != "application/json":  # vLLM's validate_json_request
                    raise VllmError(
                        "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
                        kind="Bad Request",
                    )
                req = await off_loop(lambda: parse(raw), dep.workers)
                run = self.run_class(dep, self.vt, req, {k.lower(): v for k, v in request.headers.items()})
            except BadRequest as e:
                return refused_body(e)
            except VllmError as e:
                return answer(e)
            except Paused:  # vLLM 0.33, paused in abort or wait mode: refused, retryable
                refusal = VllmError(PAUSED_MESSAGE, 503, "ServiceUnavailableError")
                if not req.stream:
                    return answer(refusal)
                # a stream's headers are out before the engine refuses it: an error event in a 200
                return StreamingResponse(_refused_stream(refusal, req.route), media_type="text/event-stream")
            except Unavailable as e:
                return answer(VllmError(str(e), 503, "ServiceUnavailableError"))
            except TooEarly as e:
                return answer(VllmError(str(e), 425, "Too Early"), {"Retry-After": "1"})
            self.live.add(run)
            if req.stream:  # the headers go out at once, held or not (as vLLM's)
                return StreamingResponse(self._written(run), media_type="text/event-stream")
            kind, value = await run.first()
            if kind == "error":
                self.live.discard(run)
                status, message = value
                return answer(VllmError(message, status, "InternalServerError" if status >= 500 else "Too Early"))
            try:
                return VllmJson(await run.body())
            except VllmError as e:
                return answer(e)
            finally:
                self.live.discard(run)

        return handler

    async def _written(self, run: VllmRun) -> Any:
        try:
            async for chunk in run.stream():
                yield chunk
        except ConnectionDropped:
            raise  # ends the connection mid-stream (the CTL-PAUSE-2 fault)
        finally:
            self.live.discard(run)

    # ----------------------------------------------------------------------- weights and labels

    async def weight_info(self, request: Request) -> Response:
        label = self.dep.info_label
        if self.s.fault("HL-GET-1"):  # the bug: the label under another key
            return VllmJson({"status": {"weight_version": label}})
        return VllmJson({"weight_version": label})

    async def update_weight_version(self, request: Request) -> Response:
        try:
            doc = decode_json(await read_body(request, self.s, media=False))
        except BadRequest as e:
            return refused_body(e)
        version = doc.get("new_version") if isinstance(doc, dict) else None
        if version is None:
            return answer(invalid("body.new_version", "missing", "Field required", None))
        if not isinstance(version, str):
            return answer(invalid("body.new_version", "string_type", "Input should be a valid string", version))
        self.dep.set_label(version)
        return VllmJson({"success": True, "new_version": version})

    async def collective_rpc(self, request: Request) -> Response:
        try:
            raw = await read_body(request, self.s, media=False)
            doc = json.loads(raw) if raw.strip() else None
        except BadRequest as e:
            return refused_body(e)
        except (ValueError, RecursionError) as e:
            return http_error(400, f"JSON decode error: {str(e)[:200]}")
        if not isinstance(doc, dict):
            return http_error(400, "Request body must be a JSON object")
        if doc.get("method") is None:
            return http_error(400, "Missing 'method' in request body")
        kwargs = doc.get("kwargs") or {}
        try:
            if doc["method"] != "reload_weights":
                raise HotLoadError(
                    400, f"method {str(doc['method'])[:120]!r}: the reference deployment implements only reload_weights"
                )
            if not isinstance(kwargs, dict):
                raise HotLoadError(400, "kwargs must be an object")
            path = kwargs.get("weights_path")
            if path is None:  # vLLM reloads the weights it started from
                path = str(self.dep.full_dirs[self.s.base_identity].resolve())
            # one load at a time, on the thread that judges every load: validation may take seconds
            await off_loop(lambda: self.dep.reload_weights(path), self.dep.signals)
        except HotLoadError as e:
            return answer(VllmError(f"Call to collective_rpc method failed: {e.message}", e.status))
        if self.s.fault("HL-POST-1"):  # the bug: an empty answer
            return Response(b"", 200)
        return VllmJson({"results": [None] * len(self.dep.replicas)})

    # ----------------------------------------------------------------------- pause and caches

    async def pause(self, request: Request) -> Response:
        mode = request.query_params.get("mode", "abort")
        clear = request.query_params.get("clear_cache", "true")
        if mode not in PAUSE_MODES and not self.s.fault("CTL-PAUSE-5"):
            expected = "'abort', 'wait' or 'keep'"
            return answer(
                invalid("query.mode", "literal_error", f"Input should be {expected}", mode, {"expected": expected})
            )
        if clear.lower() not in TRUE + FALSE:
            return answer(
                invalid(
                    "query.clear_cache",
                    "bool_parsing",
                    "Input should be a valid boolean, unable to interpret input",
                    clear,
                )
            )
        await off_loop(lambda: self.dep.pause(mode, clear.lower() in TRUE), self.dep.control)
        await self._flush()
        return VllmJson({"status": "paused"})

    async def _flush(self) -> None:
        """Let every answer being written take what its request generated before the pause (a
        client reading its stream sees those tokens before the pause's answer, none after)."""
        for _ in range(FLUSH_STEPS):
            if all(run.queue.empty() for run in self.live):
                break
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # and let the stream that took the last one write it

    async def resume(self, request: Request) -> Response:
        await off_loop(self.dep.resume, self.dep.control)
        return VllmJson({"status": "resumed"})

    async def is_paused(self, request: Request) -> Response:
        return VllmJson({"is_paused": self.dep.paused is not None})

    async def reset_prefix_cache(self, request: Request) -> Response:
        flags = {}
        for name in ("reset_running_requests", "reset_external"):
            value = request.query_params.get(name, "false")
            if value.lower() not in TRUE + FALSE:
                return answer(
                    invalid(
                        f"query.{name}",
                        "bool_parsing",
                        "Input should be a valid boolean, unable to interpret input",
                        value,
                    )
                )
            flags[name] = value.lower() in TRUE
        running = flags["reset_running_requests"]
        done = await off_loop(lambda: self.dep.reset_prefix_cache(running), self.dep.control)
        return VllmJson({"success": done})

    # ----------------------------------------------------------------------- the app

    def routes(self) -> list[Route]:
        g = self.guarded
        return [
            Route("/health", self.health, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/v1/models", g(self.models), methods=["GET"]),
            Route("/v1/completions", g(self.inference("completions")), methods=["POST"]),
            Route("/v1/chat/completions", g(self.inference("chat")), methods=["POST"]),
            Route("/inference/v1/generate", g(self.inference("generate")), methods=["POST"]),
            Route("/weight_info", g(self.weight_info, rl=True), methods=["GET"]),
            Route("/update_weight_version", g(self.update_weight_version, rl=True), methods=["POST"]),
            Route("/collective_rpc", g(self.collective_rpc, rl=True), methods=["POST"]),
            Route("/pause", g(self.pause, rl=True), methods=["POST"]),
            Route("/resume", g(self.resume, rl=True), methods=["POST"]),
            Route("/is_paused", g(self.is_paused, rl=True), methods=["GET"]),
            Route("/reset_prefix_cache", g(self.reset_prefix_cache, rl=True), methods=["POST"]),
        ]


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    # FastAPI's own answer to a path it does not route, or a method a route does not take
    return VllmJson({"detail": exc.detail or HTTPStatus(exc.status_code).phrase}, exc.status_code)


async def _crash(request: Request, exc: Exception) -> Response:
    return answer(VllmError(f"internal error: {type(exc).__name__}", 500, "InternalServerError"))


def create_vllm_app(dep: Deployment) -> Guarded:
    s = dep.settings
    app = Starlette(
        routes=VllmRoutes(dep).routes(), exception_handlers={**on_http_errors(_http_exception), Exception: _crash}
    )
    return Guarded(app, dep.requests, s.max_body_bytes, s.max_header_bytes, guard_error)
