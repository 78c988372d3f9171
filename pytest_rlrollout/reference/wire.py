"""What every dialect's HTTP layer shares: ASCII JSON answers, request bodies read within their
limits, work moved off the event loop, and the guard around the app (header and body limits,
the request log, a connection kept when the app fails). Each dialect says how its errors look."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar, cast

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from pytest_rlrollout.reference.inference_request import BadRequest, quoted
from pytest_rlrollout.reference.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")
# how a dialect answers an error the guard raises: (status, message) -> response
ErrorAnswer = Callable[[int, str], Response]


class Json(JSONResponse):
    """A JSON response whose text is ASCII: an error message may quote what a client sent, lone
    surrogates included, and those have no UTF-8 encoding."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


async def off_loop(fn: Callable[[], T], executor: Any) -> T:
    """`fn()` on a worker thread: decoding, validating and tokenizing a request, validating a
    snapshot or waiting for a pause must not hold up the event loop every stream is served from."""
    return await asyncio.get_running_loop().run_in_executor(executor, fn)


async def read_body(request: Request, s: Settings, media: bool = True) -> bytes:
    """The whole body, refused (and the connection closed) once it grows past the size limit or
    has not arrived within the body timeout; with `media`, a stated Content-Type other than
    JSON is refused (415)."""
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
    stated = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media and stated and stated != "application/json" and not stated.endswith("+json"):
        raise BadRequest(quoted(f"the request body must be application/json, not {stated}"), 415)
    return b"".join(chunks)


def on_http_errors(
    handler: Callable[[Request, HTTPException], Awaitable[Response]],
) -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    """Starlette's exception_handlers answering an HTTPException (a path not routed, a method not
    taken) with `handler`."""
    # a cast: Starlette calls a handler with the exceptions of the class it is registered for,
    # though its type says any Exception
    return {HTTPException: cast("Callable[[Request, Exception], Awaitable[Response]]", handler)}


class Logged(NamedTuple):
    """One request as the deployment's log keeps it."""

    method: str
    path: str
    at: float  # when it arrived (time.monotonic())


class Guarded:
    """What wraps the app: keeps (method, path, when) of every request (tests check what a client did,
    e.g. that a read-only run sent no POST to the hot-load API); refuses headers over their limit
    (431), and a body whose declared length is over the limit (413) before a byte of it is read;
    and keeps the connection when an exception escapes the app (Starlette answers it 500, then
    re-raises it, and uvicorn resets a connection whose app raised). A stream that raises after
    its headers went out ends there: its connection is dropped (as a crashed server's would be)."""

    def __init__(self, app: Any, log: Any, max_body: int, max_head: int, error: ErrorAnswer):
        self.app, self.log, self.max_body, self.max_head, self.error = app, log, max_body, max_head, error

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.log.append(Logged(scope["method"], scope["path"], time.monotonic()))
        head = sum(len(name) + len(value) + 4 for name, value in scope["headers"])  # + ": " and CRLF
        if head > self.max_head:
            message = f"the request headers ({head} bytes) exceed {self.max_head} bytes"
            await _closing(self.error(431, message))(scope, receive, send)
            return
        declared = content_length(scope)
        if declared is not None and declared > self.max_body:
            message = f"the request body ({declared} bytes) exceeds {self.max_body} bytes"
            await _closing(self.error(413, message))(scope, receive, send)
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
                await self.error(500, "internal error")(scope, receive, send)


def _closing(response: Response) -> Response:
    response.headers["Connection"] = "close"
    return response


def content_length(scope: dict) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:  # the server's HTTP parser refuses such a header first
                return None
    return None
