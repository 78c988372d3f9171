"""The reference deployment's HTTP API (Starlette): hot-load control, a control-plane stub the
official SDK can discover, and OpenAI-compatible completions and chat completions."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pytest_rlrollout.reference.controller import Deployment, HotLoadError
from pytest_rlrollout.reference.inference_request import BadRequest, Inference, decode_json, parse_inference, quoted
from pytest_rlrollout.reference.replica import Job, Token, TooEarly, Unavailable
from pytest_rlrollout.reference.text import Text

FINISH = ("stop", "length")
log = logging.getLogger(__name__)
T = TypeVar("T")


class Json(JSONResponse):
    """A JSON response whose text is ASCII: an error message may quote what a client sent, lone
    surrogates included, and those have no UTF-8 encoding."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error(
    status: int, message: str, code: str = "invalid_request_error", headers: dict | None = None, **extra
) -> JSONResponse:
    return Json({"error": {"message": message, "code": code, "type": code, **extra}}, status, headers=headers)


def refusal(e: BadRequest) -> JSONResponse:
    # a body left unread (too large, too slow) leaves the connection mid-request: close it
    return error(e.status, str(e), headers={"Connection": "close"} if e.close else None)


# --------------------------------------------------------------------------- one running request


class Run:
    """Turns a job's events into OpenAI-shaped chunks or a response body."""

    def __init__(self, dep: Deployment, text: Text, req: Inference, headers: dict[str, str]):
        self.dep, self.text, self.req = dep, text, req
        self.f = dep.settings.fault
        self._streamed = 0  # tokens streamed so far (R3-STREAM-1 fault)
        self.request_id = headers.get("x-request-id") or uuid.uuid4().hex
        self.id = f"{'chatcmpl' if req.chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.queue: asyncio.Queue = asyncio.Queue()
        self.t0 = time.monotonic()
        self.ttft: float | None = None
        self.cached = 0
        self.replica = ""
        self.tokens: list[Token] = []
        self.text_so_far = ""
        self.finish: str | None = None
        self.version = ""
        self._decode = text.stream_decoder()
        loop = asyncio.get_running_loop()
        session = headers.get("x-multi-turn-session-id")
        replica = dep.route(session, headers.get("x-session-affinity"))
        self.version = self.admitted_version = replica.version
        drain = headers.get("x-fireworks-hot-load-drain-timeout")
        try:
            drain_timeout = float(drain) if drain is not None else dep.settings.drain_timeout
        except ValueError:
            drain_timeout = math.nan
        if not (math.isfinite(drain_timeout) and drain_timeout >= 0):
            raise BadRequest(quoted(f"x-fireworks-hot-load-drain-timeout: expected seconds >= 0, got {drain!r}"))
        isolation = headers.get("x-prompt-cache-isolation-key") or req.isolation
        seed = req.seed if req.seed is not None else (hash(self.id) & 0x7FFFFFFF)
        self.job = Job(
            prompt=np.array(req.prompt),
            max_tokens=req.max_tokens,
            params=req.params,
            rng=np.random.default_rng(seed),
            stop_ids=frozenset() if req.ignore_eos else text.stop_ids,
            session=session,
            isolation=isolation,
            want_prompt_entries=req.echo or req.echo_last is not None,
            loop=loop,
            queue=self.queue,
            drain_timeout=drain_timeout,
            cache_max_len=req.cache_max_len,
        )
        self.replica_obj = replica
        replica.submit(self.job)  # raises TooEarly while a SYNC swap is on

    async def first(self) -> tuple[str, Any]:
        """Wait for admission (or the error that replaces it)."""
        ev = await self.queue.get()
        if ev[0] == "start":
            self.cached, self.replica = ev[1]["cached_tokens"], ev[1]["replica"]
        return ev

    def headers(self) -> dict[str, str]:
        out = {
            "x-request-id": self.request_id,
            "fireworks-backend-host": self.replica,
            "fireworks-cached-prompt-tokens": str(
                self.cached + (self.dep.settings.block_size if self.f("CACHE-RPT-1") else 0)
            ),
            "fireworks-prompt-tokens": str(len(self.req.prompt)),
            "fireworks-deployment": self.dep.settings.deployment,
        }
        if self.f("empty-content"):
            del out["fireworks-cached-prompt-tokens"], out["fireworks-prompt-tokens"]
        return out

    def entry(
        self,
        token: int,
        logprob: float,
        sampling_logprob: float | None,
        routing: np.ndarray | None,
        prompt: bool = False,
    ) -> dict:
        f = self.f
        e: dict[str, Any] = {
            "token": self.text.piece(token),
            "logprob": -logprob if f("INF-LOGPROBS-1") and not prompt else logprob,
            "token_id": token,
        }
        if not f("INF-LOGPROBS-1a"):
            e["sampling_logprob"] = sampling_logprob
        e["top_logprobs"] = []
        if self.req.routing and routing is not None and not self._routing_dropped(prompt):
            m = np.array(routing, dtype=np.uint8)
            if f("R3-RANGE-1"):
                m.reshape(-1)[-1] = self.dep.replicas[0].model.experts
            if f("R3-DET-1"):
                m = np.random.default_rng().permuted(m, axis=-1)
            if f("NUM-ROUTE-1"):
                m = m[::-1]
            raw = np.ascontiguousarray(m).tobytes()
            e["routing_matrix"] = base64.b64encode(raw[:-1] if f("R3-SHAPE-1") else raw).decode()
        return e

    def _routing_dropped(self, prompt: bool) -> bool:
        f = self.f
        if (self.req.chat and f("R3-CHAT-1")) or (not self.req.chat and not self.req.stream and f("R3-COMP-1")):
            return True
        if prompt and f("R3-ECHO-1") and self.req.echo:
            return True
        if prompt or not (self.req.stream and f("R3-STREAM-1")):
            return False
        self._streamed += 1
        return self._streamed % 2 == 0

    def prompt_part(self, logprobs: np.ndarray, routing: np.ndarray) -> tuple[list[int], list[dict]]:
        p = self.req.prompt
        start = 0 if self.req.echo or self.f("R3-ECHOLAST-1") else max(0, len(p) - (self.req.echo_last or 0))
        ids = p[start:]
        entries = [self.entry(p[i], float(logprobs[i]), None, routing[i], prompt=True) for i in range(start, len(p))]
        return ids, entries

    def choice(self, text: str, entries: list[dict] | None, finish: str | None) -> dict:
        c: dict[str, Any] = {"index": 0}
        if self.req.chat:
            c["delta" if self.req.stream else "message"] = {"role": "assistant", "content": text}
        else:
            c["text"] = text
        c["logprobs"] = {"content": entries} if self.req.logprobs and entries is not None else None
        c["finish_reason"] = finish
        return c

    def model_name(self, version: str) -> str:
        if self.req.stream and self.f("VER-STREAM-1") and version != self.admitted_version:
            return self.req.model
        if not self.req.stream and self.f("VER-NONSTREAM-1"):  # a version cached at start-up
            return f"{self.req.model}@{self.dep.settings.base_identity}"
        if self.req.stream and self.f("SWAP-ASYNC-2:stale"):  # the label of the stream's start
            return f"{self.req.model}@{self.admitted_version}"
        return f"{self.req.model}@{version}"

    def chunk(self, choice: dict | None, version: str, **extra) -> bytes:
        """One SSE event; `choice` None: a chunk without choices (a usage-only chunk)."""
        body = {"id": self.id, "object": "chat.completion.chunk" if self.req.chat else "text_completion",
                "created": self.created, "model": self.model_name(version),
                "choices": [] if choice is None else [choice], **extra}  # fmt: skip
        return f"data: {json.dumps(body)}\n\n".encode()

    def completion_ids(self, prompt_ids: list[int]) -> list[int]:
        return prompt_ids + [t.id for t in self.tokens]

    def usage(self) -> dict:
        n = len(self.tokens) + (1 if self.f("INF-USAGE-1") else 0)
        p = len(self.req.prompt)
        return {
            "prompt_tokens": p,
            "completion_tokens": n,
            "total_tokens": p + n,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }

    def perf(self) -> dict:
        out = {
            "prompt-tokens": len(self.req.prompt),
            "cached-prompt-tokens": self.cached,
            "server-time-to-first-token": round(self.ttft if self.ttft is not None else time.monotonic() - self.t0, 6),
            "server-processing-time": round(time.monotonic() - self.t0, 6),
            "backend-host": self.replica,
        }
        if self.f("INF-PERF-1"):
            del out["cached-prompt-tokens"]
        return out

    def final_extra(self, prompt_ids: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.req.raw_output:
            out["raw_output"] = {
                "prompt_token_ids": self.req.prompt,
                "completion_token_ids": self.completion_ids([] if self.f("INF-RAW-1") else prompt_ids),
                "completion": self.text_so_far,
            }
        if self.req.return_token_ids:
            out["prompt_token_ids"] = self.req.prompt
            out["token_ids"] = [t.id for t in self.tokens][: -1 if self.f("INF-TOKENIDS-1") else None]
        return out

    def _stop_hit(self, before: int) -> bool:
        """Whether a stop string ends in the text added after `before`; only that tail (and what
        a stop string can straddle) is searched, not the whole text at every token."""
        for s in self.req.stop:
            at = self.text_so_far.find(s, max(0, before - len(s) + 1))
            if at >= 0:
                self.text_so_far = self.text_so_far[:at]
                return True
        return False

    async def events(self) -> AsyncIterator[tuple[str, Any]]:
        while True:
            ev = await self.queue.get()
            yield ev
            if ev[0] in ("end", "error"):
                return

    def take(self, tok: Token) -> str:
        """Record a token; returns the new text it adds (stop strings cut it short)."""
        if self.ttft is None:
            self.ttft = time.monotonic() - self.t0
        self.tokens.append(tok)
        self.version = tok.version
        if tok.id in self.text.stop_ids:
            return ""
        before = len(self.text_so_far)
        self.text_so_far += self._decode(tok.id)
        if self.req.stop and self._stop_hit(before):
            self.finish = "stop"
        return self.text_so_far[before:]

    async def stream(self) -> AsyncIterator[bytes]:
        prompt_ids: list[int] = []
        if self.f("empty-content"):
            async for _ in self.events():
                pass
            yield self.chunk(self.choice("", None, "stop"), self.version)
            yield b"data: [DONE]\n\n"
            return
        try:
            async for kind, value in self.events():
                if kind == "prompt":
                    prompt_ids, entries = self.prompt_part(*value)
                    ptext = self.text.decode(prompt_ids) if not self.req.chat else ""
                    yield self.chunk(self.choice(ptext, entries, None), self.version)
                elif kind == "token":
                    piece = self.take(value)
                    entry = self.entry(value.id, value.logprob, value.sampling_logprob, value.routing)
                    yield self.chunk(self.choice(piece, [entry], None), value.version)
                    if self.finish:
                        self.job.cancelled.set()
                        break
                elif kind == "end":
                    self.finish = self.finish or value
                elif kind == "abort":  # SWAP-ASYNC-1 fault: the stream is cut at the swap
                    yield self.chunk(self.choice("", None, "abort"), self.version)
                    return
                elif kind == "error":
                    yield self.error_event(*value)
                    return
            extra: dict[str, Any] = {"usage": self.usage()}
            if self.req.perf_metrics:
                extra["perf_metrics"] = self.perf()
            final = self.choice("", [] if self.req.logprobs else None, self.finish or "stop") | self.final_extra(
                prompt_ids
            )
            if self.f("usage-only-chunk"):  # as OpenAI streams usage: a chunk of its own, with no choice
                yield self.chunk(final, self.version)
                yield self.chunk(None, self.version, **extra)
            else:
                yield self.chunk(final, self.version, **extra)
            if self.f("INF-SSE-1"):
                yield self.chunk(self.choice("", None, None), self.version, usage=None)
            yield b"data: [DONE]\n\n"
        except Exception as e:  # the headers are out: the stream ends with an error event, not a reset
            log.exception("a stream failed")
            yield self.error_event(500, f"internal error: {type(e).__name__}")
        finally:
            self.job.cancelled.set()

    @staticmethod
    def error_event(status: int, message: str) -> bytes:
        return f"data: {json.dumps({'error': {'message': message, 'status_code': status}})}\n\n".encode()

    async def body(self) -> dict:
        prompt_ids: list[int] = []
        entries: list[dict] = []
        async for kind, value in self.events():
            if kind == "prompt":
                prompt_ids, pentries = self.prompt_part(*value)
                entries += pentries
            elif kind == "token":
                self.take(value)
                entries.append(self.entry(value.id, value.logprob, value.sampling_logprob, value.routing))
                if self.finish:
                    self.job.cancelled.set()
                    break
            elif kind == "end":
                self.finish = self.finish or value
            elif kind == "error":
                raise BadRequest(value[1], status=value[0])
            elif kind == "abort":
                self.finish = "abort"
                break
        text = (self.text.decode(prompt_ids) if prompt_ids and not self.req.chat else "") + self.text_so_far
        choice = self.choice(text, entries, self.finish or "stop") | self.final_extra(prompt_ids)
        out = {"id": self.id, "object": "chat.completion" if self.req.chat else "text_completion", "created": self.created,
               "model": self.model_name(self.version), "choices": [choice], "usage": self.usage()}  # fmt: skip
        if self.req.perf_metrics:
            out["perf_metrics"] = self.perf()
        if self.f("empty-content"):
            out.update(choices=[self.choice("", None, "stop")])
            for field in ("usage", "perf_metrics"):
                out.pop(field, None)
        return out


# --------------------------------------------------------------------------- the app


def create_app(dep: Deployment) -> Starlette:
    s = dep.settings
    base_dir = dep.full_dirs[s.base_identity]
    text = Text(base_dir, dep.config)
    vocab = dep.config["vocab_size"]
    names = {s.model, s.deployment, f"{s.model}#{s.deployment}"}

    def authorized(request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        key = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
        return key == s.api_key

    def auth_error() -> JSONResponse:
        return error(401, "invalid or missing API key", "UNAUTHENTICATED")

    async def off_loop(fn: Callable[[], T], executor: Any = None) -> T:
        """`fn()` on a worker thread: decoding, validating and tokenizing a request, or validating
        a snapshot, must not hold up the event loop every other stream is served from."""
        return await asyncio.get_running_loop().run_in_executor(executor or dep.workers, fn)

    async def read_body(request: Request) -> bytes:
        """The whole body, refused (and the connection closed) once it grows past the size limit
        or has not arrived within the body timeout."""
        limit, chunks, size = s.max_body_bytes, [], 0
        try:
            async with asyncio.timeout(s.body_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise BadRequest(f"the request body exceeds {limit} bytes", 413, close=True)
                    chunks.append(chunk)
        except TimeoutError:
            raise BadRequest(f"the request body did not arrive within {s.body_timeout:g} s", 408, close=True) from None
        except ClientDisconnect:
            raise BadRequest("the client closed the connection before the body arrived", close=True) from None
        # checked once the body is read, so the connection can carry the client's next request
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media and media != "application/json" and not media.endswith("+json"):
            raise BadRequest(quoted(f"the request body must be application/json, not {media}"), 415)
        return b"".join(chunks)

    def hot_load_headers(request: Request) -> JSONResponse | None:
        if not authorized(request) and not s.fault("HL-AUTH-1"):
            return auth_error()
        if request.headers.get("fireworks-deployment") != s.deployment:
            return error(404, f"fireworks-deployment must name {s.deployment}", "NOT_FOUND")
        if request.headers.get("fireworks-model") not in (s.model, s.deployment):
            return error(400, f"fireworks-model must name {s.model}", "INVALID_ARGUMENT")
        return None

    async def hot_load(request: Request) -> Response:
        if (bad := hot_load_headers(request)) is not None:
            return bad
        if request.method == "GET":
            return Json(dep.status())
        try:
            raw = await read_body(request)
            # one signal at a time, on a thread of its own: a snapshot's validation may take
            # seconds and must hold up neither the event loop nor the request workers
            answer = await off_loop(lambda: dep.hot_load(decode_json(raw)), dep.signals)
            return Response(b"", 200) if s.fault("HL-POST-1") else Json(answer)
        except BadRequest as e:
            return refusal(e)
        except HotLoadError as e:
            return error(e.status, e.message, **e.extra)

    async def hint(request: Request) -> Response:
        if (bad := hot_load_headers(request)) is not None:
            return bad
        try:
            raw = await read_body(request)
            return Json(await off_loop(lambda: dep.hint(decode_json(raw))))
        except BadRequest as e:
            return refusal(e)
        except HotLoadError as e:
            return error(e.status, e.message, **e.extra)

    async def accounts(request: Request) -> Response:
        if not authorized(request):
            return auth_error()
        return Json({"accounts": [{"name": f"accounts/{s.account}", "displayName": s.account}], "totalSize": 1})

    def _deployment_path_ok(request: Request) -> bool:
        return request.path_params["account"] == s.account and request.path_params["deployment"] == s.deployment_id

    async def deployment(request: Request) -> Response:
        if not authorized(request):
            return auth_error()
        if not _deployment_path_ok(request):
            return error(404, "deployment not found", "NOT_FOUND")
        return Json({
            "name": s.deployment, "state": "READY", "baseModel": s.model, "enableHotLoad": True,
            "hotLoadBucketType": "MINIO", "hotLoadBucketUrl": s.bucket.resolve().as_uri(),
            "hotLoadTransitionType": s.transition, "minReplicaCount": s.replicas, "maxReplicaCount": s.replicas,
        })  # fmt: skip

    async def ledger(request: Request) -> Response:
        if not authorized(request):
            return auth_error()
        if not _deployment_path_ok(request):
            return error(404, "deployment not found", "NOT_FOUND")
        if request.method == "DELETE":
            if s.fault("HL-LEDGER-1"):
                return error(405, "method not allowed", "UNIMPLEMENTED")
            return Json(dep.reset_ledger())
        return Json({"entries": dep.ledger})

    def inference(chat: bool):
        def parse(raw: bytes) -> Inference:
            return parse_inference(decode_json(raw), chat, text, vocab, s.max_context, names)

        async def handler(request: Request) -> Response:
            if not authorized(request):
                return auth_error()
            try:
                raw = await read_body(request)
                req = await off_loop(lambda: parse(raw))
                run = Run(dep, text, req, {k.lower(): v for k, v in request.headers.items()})
            except BadRequest as e:
                if s.fault("INF-ERR-1") and "not valid JSON" in str(e):
                    return error(500, "internal error", "INTERNAL")
                return refusal(e)
            except Unavailable as e:
                return error(503, str(e), "UNAVAILABLE")
            except TooEarly as e:
                return error(425, str(e), "TOO_EARLY", headers={"Retry-After": "1"})
            kind, value = await run.first()
            if kind == "error":
                status, message = value
                return error(
                    status,
                    message,
                    "TOO_EARLY" if status == 425 else "INTERNAL",
                    headers={"Retry-After": "1"} if status == 425 else None,
                )
            if req.stream:
                return StreamingResponse(run.stream(), media_type="text/event-stream", headers=run.headers())
            try:
                return Json(await run.body(), headers=run.headers())
            except BadRequest as e:  # the request failed in a decode step (500) or was cut short
                return error(e.status, str(e), "INTERNAL" if e.status >= 500 else "invalid_request_error")

        return handler

    async def not_found(request: Request, exc: HTTPException) -> Response:
        return error(
            exc.status_code, exc.detail or "not found", "NOT_FOUND" if exc.status_code == 404 else "INVALID_ARGUMENT"
        )

    async def crash(request: Request, exc: Exception) -> Response:
        return error(500, f"internal error: {type(exc).__name__}", "INTERNAL")

    async def openapi(request: Request) -> Response:
        from pytest_rlrollout.reference.openapi import document

        return Json(
            document(s.deployment, s.model, s.max_body_bytes, s.body_timeout, s.max_context, s.max_header_bytes)
        )

    routes = [
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/hot_load/v1/models/hot_load", hot_load, methods=["GET", "POST"]),
        Route("/hot_load/v1/models/hot_load/hint", hint, methods=["POST"]),
        Route("/v1/accounts", accounts, methods=["GET"]),
        Route("/v1/accounts/{account}/deployments/{deployment}", deployment, methods=["GET"]),
        Route("/v1/accounts/{account}/deployments/{deployment}/ledger", ledger, methods=["GET", "DELETE"]),
    ]
    for prefix in ("/inference/v1", "/v1"):
        routes += [
            Route(f"{prefix}/completions", inference(False), methods=["POST"]),
            Route(f"{prefix}/chat/completions", inference(True), methods=["POST"]),
        ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: not_found, Exception: crash})
    return _Guarded(app, dep.requests, s.max_body_bytes, s.max_header_bytes)


class _Guarded:
    """What wraps the app: keeps (method, path) of every request (tests check what a client did,
    e.g. that a read-only run sent no POST to the hot-load API); refuses headers over their limit
    (431), and a body whose declared length is over the limit (413) before a byte of it is read;
    and keeps the connection when an exception escapes the app (Starlette answers it 500, then
    re-raises it, and uvicorn resets a connection whose app raised)."""

    def __init__(self, app: Any, log: Any, max_body: int, max_head: int):
        self.app, self.log, self.max_body, self.max_head = app, log, max_body, max_head

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.log.append((scope["method"], scope["path"]))
        head = sum(len(name) + len(value) + 4 for name, value in scope["headers"])  # + ": " and CRLF
        if head > self.max_head:
            message = f"the request headers ({head} bytes) exceed {self.max_head} bytes"
            await error(431, message, headers={"Connection": "close"})(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            message = f"the request body ({declared} bytes) exceeds {self.max_body} bytes"
            await error(413, message, headers={"Connection": "close"})(scope, receive, send)
            return
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("%s %s failed", scope["method"], scope["path"])
            if not started:
                await error(500, "internal error", "INTERNAL")(scope, receive, send)


def _content_length(scope: dict) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:  # the server's HTTP parser refuses such a header first
                return None
    return None
