"""The reference deployment's OpenAPI document, assembled from the contract's JSON Schemas."""

from __future__ import annotations

from typing import Any

from pytest_rlrollout.contract.schemas import schema


def _body(name: str) -> dict[str, Any]:
    s = {k: v for k, v in schema(name).items() if k not in ("$schema", "$id")}
    return {"required": True, "content": {"application/json": {"schema": s}}}


def _answers(*codes: str) -> dict[str, Any]:
    return {
        code: {"description": "see the contract: docs/contract.md (rlrollout clauses --format md)"} for code in codes
    }


def document(deployment: str, model: str) -> dict[str, Any]:
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
        "responses": _answers("200", "400", "401", "404", "425"),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "pytest-rlrollout reference deployment", "version": "1"},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            "/hot_load/v1/models/hot_load": {
                "post": {
                    "parameters": hot_load_headers,
                    "requestBody": _body("hot-load-request"),
                    "responses": _answers("200", "400", "401", "404", "409"),
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
                                    "properties": {"identity": {"type": "string"}, "file": {"type": "string"}},
                                }
                            }
                        },
                    },
                    "responses": _answers("200", "400", "404"),
                },
            },
            "/inference/v1/completions": {"post": {**inference, "requestBody": _body("completion-request")}},
            "/inference/v1/chat/completions": {"post": {**inference, "requestBody": _body("chat-completion-request")}},
            "/v1/accounts": {"get": {"responses": _answers("200", "401")}},
        },
    }
