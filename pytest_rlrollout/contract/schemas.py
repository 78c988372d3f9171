"""The contract's JSON Schemas, and their errors tagged with the clause of the failed constraint.

Every constraint of a schema carries its clause (`x-clause`, inherited from the nearest
enclosing schema), so a violation becomes a finding of the right clause. Documents are
first checked by a compiled validator (`jsonschema-rs`): an 18,867-tensor index takes
milliseconds. Only a document that fails is walked again with `jsonschema`, whose error
messages name the path and the constraint.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from pytest_rlrollout.contract.catalogue import DATA, load_json


@dataclass(frozen=True)
class SchemaProblem:
    clause: str
    path: tuple[Any, ...]
    message: str


@cache
def schema(name: str) -> dict[str, Any]:
    """A schema of the contract, e.g. `schema("weight-spec")`, with every `$ref` inlined (the
    chat request shares the completion request's fields), so each constraint is reached by a
    plain path from the root and keeps its `x-clause`."""
    raw = load_json(f"{name}.schema.json")
    if '"$ref"' not in json.dumps(raw):
        return raw
    import jsonschema_rs

    return jsonschema_rs.dereference(raw, registry=_registry())


@cache
def _registry() -> Any:
    import jsonschema_rs

    docs = [load_json(p.name) for p in sorted(DATA.glob("*.schema.json"))]
    return jsonschema_rs.Registry([(d["$id"], d) for d in docs if "$id" in d])


class SchemaCheck:
    """One JSON Schema's two validators: the compiled one answers whether a document is valid,
    `jsonschema` (built only when a document fails) says how it is not. The contract's schemas
    and the files the suite writes (`suite.file_schemas`) are checked alike."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    @functools.cached_property
    def _compiled(self) -> Any:
        import jsonschema_rs

        return jsonschema_rs.validator_for(self.document)

    @functools.cached_property
    def _explaining(self) -> Any:
        import jsonschema

        cls = jsonschema.validators.validator_for(self.document)
        cls.check_schema(self.document)
        return cls(self.document)

    def is_valid(self, document: Any) -> bool:
        """Whether `document` satisfies the schema (the fast path)."""
        try:
            return bool(self._compiled.is_valid(document))
        except (ValueError, TypeError, OverflowError):
            # values jsonschema-rs cannot take (integers beyond 64 bits, ...): ask jsonschema
            return not any(True for _ in self.errors(document))

    def errors(self, document: Any) -> Iterator[Any]:
        """`jsonschema`'s errors, as it finds them (each names its path and its constraint)."""
        errors: Iterator[Any] = self._explaining.iter_errors(document)
        return errors


@cache
def check(name: str) -> SchemaCheck:
    """The validators of `<name>.schema.json`."""
    return SchemaCheck(schema(name))


def is_valid(name: str, document: Any) -> bool:
    """Whether `document` satisfies `<name>.schema.json` (the fast path)."""
    return check(name).is_valid(document)


def problems(name: str, document: Any, limit: int | None = None) -> Iterator[SchemaProblem]:
    """Every way `document` breaks `<name>.schema.json`, each tagged with its clause, by path.
    With `limit`, only the first `limit` errors found are listed, then one problem saying more
    were left out: a hostile document can break a schema a million times (200k bad weight_map
    entries cost 7 s and 750 MB listed whole)."""
    if is_valid(name, document):
        return
    root = schema(name)
    found = check(name).errors(document)
    errors = list(found if limit is None else itertools.islice(found, limit + 1))
    listed = errors if limit is None else errors[:limit]
    out = []
    for e in sorted(listed, key=lambda e: list(map(str, e.absolute_path))):
        clause = _clause_of(root, e.absolute_schema_path)
        if clause is None:
            raise ValueError(f"schema {name} has no x-clause for {list(e.absolute_schema_path)}")
        out.append(SchemaProblem(clause, tuple(e.absolute_path), _message(e)))
    yield from out
    if limit is not None and len(errors) > limit and out:
        more = f"more problems not listed: at most {limit} are listed per document"
        yield SchemaProblem(out[-1].clause, out[-1].path, more)


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


def _message(e: Any) -> str:
    where = _where(e.absolute_path)
    prefix = f"{where}: " if where else ""
    if e.validator == "additionalProperties" and isinstance(e.instance, dict):
        allowed = set(e.schema.get("properties", {}))
        extra = [k for k in e.instance if k not in allowed]
        # The wording the official SDK's reset_prompt_cache fallback matches on.
        return "; ".join(f"Extra inputs are not permitted, field: '{k}'" for k in extra)
    if e.validator in ("pattern", "anyOf", "oneOf") and "description" in e.schema:
        return f"{prefix}{e.instance!r} is not {e.schema['description']}"
    return f"{prefix}{e.message}"


@cache
def _shard_name_pattern() -> re.Pattern[str]:
    return re.compile(schema("safetensors-index")["properties"]["weight_map"]["additionalProperties"]["pattern"])


@lru_cache(maxsize=4096)  # bounded: the names come from untrusted indexes
def is_plain_shard_name(name: str) -> bool:
    return bool(_shard_name_pattern().search(name))
