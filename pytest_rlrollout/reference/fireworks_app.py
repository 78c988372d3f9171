"""The Fireworks dialect's routes: hot-load control, a control-plane stub the official SDK can
discover, and OpenAI-compatible completions and chat completions with the Fireworks extensions.
A thin router: the engine core (`controller.Deployment`) does the work, `FireworksRun` shapes
the answers."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pytest_rlrollout.reference.controller import Deployment, HotLoadError
from pytest_rlrollout.reference.fireworks_answers import FireworksRun
from pytest_rlrollout.reference.inference_request import BadRequest, Inference, decode_json, parse_inference
from pytest_rlrollout.reference.replica import TooEarly, Unavailable
from pytest_rlrollout.reference.text import Text
from pytest_rlrollout.reference.wire import Guarded, Json, off_loop, on_http_errors, read_body


def error(
    status: int, message: str, code: str = "invalid_request_error", headers: dict | None = None, **extra
) -> JSONResponse:
    return Json({"error": {"message": message, "code": code, "type": code, **extra}}, status, headers=headers)


def refusal(e: BadRequest) -> JSONResponse:
    # a body left unread (too large, too slow) leaves the connection mid-request: close it
    return error(e.status, str(e), headers={"Connection": "close"} if e.close else None)


def guard_error(status: int, message: str) -> Response:
    """The answer of the guard around the app (431, 413, 500)."""
    return error(status, message, "INTERNAL" if status == 500 else "invalid_request_error")


class FireworksRoutes:
    """The handlers, over one deployment."""

    def __init__(self, dep: Deployment):
        self.dep, self.s = dep, dep.settings
        self.text = Text(dep.full_dirs[self.s.base_identity], dep.config)
        self.vocab = dep.config["vocab_size"]
        self.names = {self.s.model, self.s.deployment, f"{self.s.model}#{self.s.deployment}"}

    # ----------------------------------------------------------------------- who may call

    def authorized(self, request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        key = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
        return key == self.s.api_key

    @staticmethod
    def auth_error() -> JSONResponse:
        return error(401, "invalid or missing API key", "UNAUTHENTICATED")

    def hot_load_headers(self, request: Request) -> JSONResponse | None:
        s = self.s
        if not self.authorized(request) and not s.fault("HL-AUTH-1"):
            return self.auth_error()
        if request.headers.get("fireworks-deployment") != s.deployment:
            return error(404, f"fireworks-deployment must name {s.deployment}", "NOT_FOUND")
        if request.headers.get("fireworks-model") not in (s.model, s.deployment):
            return error(400, f"fireworks-model must name {s.model}", "INVALID_ARGUMENT")
        return None

    def _deployment_path_ok(self, request: Request) -> bool:
        return request.path_params["account"] == self.s.account and request.path_params["deployment"] == (
            self.s.deployment_id
        )

    # ----------------------------------------------------------------------- hot load

    async def hot_load(self, request: Request) -> Response:
        dep = self.dep
        if (bad := self.hot_load_headers(request)) is not None:
            return bad
        if request.method == "GET":
            return Json(dep.status())
        try:
            raw = await read_body(request, self.s)
            # one signal at a time, on a thread of its own: a snapshot's validation may take
            # seconds and must hold up neither the event loop nor the request workers
            answer = await off_loop(lambda: dep.hot_load(decode_json(raw)), dep.signals)
            return Response(b"", 200) if self.s.fault("HL-POST-1") else Json(answer)
        except BadRequest as e:
            return refusal(e)
        except HotLoadError as e:
            return error(e.status, e.message, **e.extra)

    async def hint(self, request: Request) -> Response:
        if (bad := self.hot_load_headers(request)) is not None:
            return bad
        try:
            raw = await read_body(request, self.s)
            return Json(await off_loop(lambda: self.dep.hint(decode_json(raw)), self.dep.workers))
        except BadRequest as e:
            return refusal(e)
        except HotLoadError as e:
            return error(e.status, e.message, **e.extra)

    # ----------------------------------------------------------------------- control-plane stub

    async def accounts(self, request: Request) -> Response:
        if not self.authorized(request):
            return self.auth_error()
        s = self.s
        return Json({"accounts": [{"name": f"accounts/{s.account}", "displayName": s.account}], "totalSize": 1})

    async def deployment(self, request: Request) -> Response:
        if not self.authorized(request):
            return self.auth_error()
        if not self._deployment_path_ok(request):
            return error(404, "deployment not found", "NOT_FOUND")
        s = self.s
        return Json(
            {
                "name": s.deployment,
                "state": "READY",
                "baseModel": s.model,
                "enableHotLoad": True,
                "hotLoadBucketType": "MINIO",
                "hotLoadBucketUrl": s.bucket.resolve().as_uri(),
                "hotLoadTransitionType": s.transition,
                "minReplicaCount": s.replicas,
                "maxReplicaCount": s.replicas,
            }
        )

    async def ledger(self, request: Request) -> Response:
        if not self.authorized(request):
            return self.auth_error()
        if not self._deployment_path_ok(request):
            return error(404, "deployment not found", "NOT_FOUND")
        if request.method == "DELETE":
            if self.s.fault("HL-LEDGER-1"):
                return error(405, "method not allowed", "UNIMPLEMENTED")
            return Json(self.dep.reset_ledger())
        return Json({"entries": self.dep.ledger})

    async def openapi(self, request: Request) -> Response:
        from pytest_rlrollout.reference.openapi import document

        s = self.s
        return Json(
            document(s.deployment, s.model, s.max_body_bytes, s.body_timeout, s.max_context, s.max_header_bytes)
        )

    # ----------------------------------------------------------------------- inference

    def inference(self, chat: bool) -> Any:
        s, dep, text = self.s, self.dep, self.text

        def parse(raw: bytes) -> Inference:
            return parse_inference(decode_json(raw), chat, text, self.vocab, s.max_context, self.names)

        async def handler(request: Request) -> Response:
            if not self.authorized(request):
                return self.auth_error()
            try:
                raw = await read_body(request, s)
                req = await off_loop(lambda: parse(raw), dep.workers)
                run = FireworksRun(dep, text, req, {k.lower(): v for k, v in request.headers.items()})
            except BadRequest as e:
                if "not valid JSON" in str(e) and s.fault("INF-ERR-1"):
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

    # ----------------------------------------------------------------------- the app

    def routes(self) -> list[Route]:
        routes = [
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/hot_load/v1/models/hot_load", self.hot_load, methods=["GET", "POST"]),
            Route("/hot_load/v1/models/hot_load/hint", self.hint, methods=["POST"]),
            Route("/v1/accounts", self.accounts, methods=["GET"]),
            Route("/v1/accounts/{account}/deployments/{deployment}", self.deployment, methods=["GET"]),
            Route("/v1/accounts/{account}/deployments/{deployment}/ledger", self.ledger, methods=["GET", "DELETE"]),
        ]
        for prefix in ("/inference/v1", "/v1"):
            routes += [
                Route(f"{prefix}/completions", self.inference(False), methods=["POST"]),
                Route(f"{prefix}/chat/completions", self.inference(True), methods=["POST"]),
            ]
        return routes


async def _not_found(request: Request, exc: HTTPException) -> Response:
    return error(
        exc.status_code, exc.detail or "not found", "NOT_FOUND" if exc.status_code == 404 else "INVALID_ARGUMENT"
    )


async def _crash(request: Request, exc: Exception) -> Response:
    return error(500, f"internal error: {type(exc).__name__}", "INTERNAL")


def create_fireworks_app(dep: Deployment) -> Guarded:
    s = dep.settings
    app = Starlette(
        routes=FireworksRoutes(dep).routes(), exception_handlers={**on_http_errors(_not_found), Exception: _crash}
    )
    return Guarded(app, dep.requests, s.max_body_bytes, s.max_header_bytes, guard_error)
