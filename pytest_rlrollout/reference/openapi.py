"""The reference deployment's OpenAPI document, assembled from the contract's JSON Schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_rlrollout.contract.schemas import schema
from pytest_rlrollout.reference.settings import Settings

_DEFAULTS = Settings(bucket=Path("."))  # the limits' defaults; a deployment passes its own


def _body(name: str) -> dict[str, Any]:
    s = {k: v for k, v in schema(name).items() if k not in ("$schema", "$id")}
    return {"required": True, "content": {"application/json": {"schema": s}}}


def _answers(*codes: str) -> dict[str, Any]:
    return {
        code: {"description": "see the contract: docs/contract.md (rlrollout clauses --format md)"} for code in codes
    }


def _limits(max_body_bytes: int, body_timeout: float, max_context: int, max_header_bytes: int) -> str:
    return (
        f"Request headers of more than {max_header_bytes} bytes in all get 431 (or 400 from the HTTP layer). "
        f"Request bodies are JSON (UTF-8; a Content-Type other than JSON gets 415) of at most "
        f"{max_body_bytes} bytes: a longer one gets 413 and the connection is closed, whether its "
        f"Content-Length says so or it is sent chunked; a body not received within {body_timeout:g} s "
        f"of the headers gets 408. A prompt (text or token ids) and max_tokens together fit "
        f"{max_context} tokens; every other limit is in the request schemas below. Invalid input "
        "gets a 4xx answer with an error message, never a 5xx."
    )


def document(
    deployment: str,
    model: str,
    max_body_bytes: int = _DEFAULTS.max_body_bytes,
    body_timeout: float = _DEFAULTS.body_timeout,
    max_context: int = _DEFAULTS.max_context,
    max_header_bytes: int = _DEFAULTS.max_header_bytes,
) -> dict[str, Any]:
    identity = schema("hot-load-request")["properties"]["identity"]  # the hint names snapshots alike
    hot_load_headers = [
        {
            "name": "fireworks-deployment",
            "in": "header",
            "required": True,
            "schema": {"type": "string", "example": deployment},
        },
        {"name": "fireworks-model", "in": "header", "required": True, "schema": {"type": "string", "example": model}},
    ]
    inference = {
        "parameters": [
            {"name": "x-multi-turn-session-id", "in": "header", "required": False, "schema": {"type": "string"}},
            {"name": "x-session-affinity", "in": "header", "required": False, "schema": {"type": "string"}},
            {"name": "x-prompt-cache-isolation-key", "in": "header", "required": False, "schema": {"type": "string"}},
        ],
        "responses": _answers("200", "400", "401", "404", "408", "413", "415", "425", "431"),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "pytest-rlrollout reference deployment",
            "version": "1",
            "description": _limits(max_body_bytes, body_timeout, max_context, max_header_bytes),
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            "/hot_load/v1/models/hot_load": {
                "post": {
                    "parameters": hot_load_headers,
                    "requestBody": _body("hot-load-request"),
                    "responses": _answers("200", "400", "401", "404", "408", "409", "413", "415", "431"),
                },
                "get": {
                    "parameters": hot_load_headers,
                    "responses": {
                        "200": {
                            "description": "status",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        k: v
                                        for k, v in schema("hot-load-status").items()
                                        if k not in ("$schema", "$id")
                                    }
                                }
                            },
                        }
                    },
                },
            },
            "/hot_load/v1/models/hot_load/hint": {
                "post": {
                    "parameters": hot_load_headers,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["identity", "file"],
                                    "additionalProperties": False,
                                    "properties": {"identity": identity, "file": {"type": "string"}},
                                }
                            }
                        },
                    },
                    "responses": _answers("200", "400", "401", "404", "408", "413", "415", "431"),
                },
            },
            "/inference/v1/completions": {"post": {**inference, "requestBody": _body("completion-request")}},
            "/inference/v1/chat/completions": {"post": {**inference, "requestBody": _body("chat-completion-request")}},
            "/v1/accounts": {"get": {"responses": _answers("200", "401")}},
        },
    }
