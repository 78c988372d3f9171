"""JSON Schema checks whose errors carry the clause of the constraint that failed (`x-clause`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import jsonschema

from pytest_rlrollout.catalogue import schema


@dataclass(frozen=True)
class SchemaProblem:
    clause: str
    path: tuple[Any, ...]
    message: str


@cache
def _validator(name: str) -> jsonschema.protocols.Validator:
    s = schema(name)
    cls = jsonschema.validators.validator_for(s)
    cls.check_schema(s)
    return cls(s)


def _clause_of(root: dict[str, Any], schema_path) -> str | None:
    """The innermost `x-clause` on the way from the root schema to the failed keyword."""
    node: Any = root
    clause = root.get("x-clause")
    for step in schema_path:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            break
        if isinstance(node, dict) and "x-clause" in node:
            clause = node["x-clause"]
    return clause


def _where(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if re.fullmatch(r"[A-Za-z_]\w*", str(p)) else f"[{p!r}]")
    return out.lstrip(".")


def _message(e: jsonschema.ValidationError) -> str:
    where = _where(e.absolute_path)
    prefix = f"{where}: " if where else ""
    if e.validator == "additionalProperties" and isinstance(e.instance, dict):
        allowed = set(e.schema.get("properties", {}))
        extra = [k for k in e.instance if k not in allowed]
        # The wording the official SDK's reset_prompt_cache fallback matches on.
        return "; ".join(f"Extra inputs are not permitted, field: '{k}'" for k in extra)
    if e.validator == "pattern" and "description" in e.schema:
        return f"{prefix}{e.instance!r} is not {e.schema['description']}"
    return f"{prefix}{e.message}"


def problems(name: str, document: Any) -> Iterator[SchemaProblem]:
    """Every way `document` breaks `schemas/<name>.schema.json`, each tagged with its clause."""
    root = schema(name)
    for e in sorted(_validator(name).iter_errors(document), key=lambda e: list(map(str, e.absolute_path))):
        clause = _clause_of(root, e.absolute_schema_path)
        if clause is None:
            raise ValueError(f"schema {name} has no x-clause for {list(e.absolute_schema_path)}")
        yield SchemaProblem(clause, tuple(e.absolute_path), _message(e))


@cache
def _shard_name_pattern() -> re.Pattern[str]:
    return re.compile(schema("safetensors-index")["properties"]["weight_map"]["additionalProperties"]["pattern"])


def is_plain_shard_name(name: str) -> bool:
    return bool(_shard_name_pattern().search(name))
