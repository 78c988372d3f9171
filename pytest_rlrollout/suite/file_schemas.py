"""The JSON Schemas of the files the suite and its commands write (`schemas/`): a recorded
session's meta (`recorded-session`), a live run's state records (`run-state`), and a diagnosis
(`diagnosis`: `rlrollout diagnose --json`, the report's diagnosis section).

Each is loaded once, with the names of the package's registries filled in where a subschema
says `x-names` (the schema keeps no second list of engines or capabilities). A document is
first checked by the compiled validator (`jsonschema-rs`); only one that fails is walked again
with `jsonschema`, whose errors name the field and the constraint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any

from pytest_rlrollout.contract.schemas import SchemaCheck
from pytest_rlrollout.shipped import shipped

MESSAGE_CHARS = 200  # an error's wording quotes the value at fault: a hostile one can be megabytes
SIZES = {
    "maxItems": "more than {} items",
    "minItems": "fewer than {} items",
    "maxLength": "longer than {} characters",
    "minLength": "shorter than {} characters",
}


def _registry_names() -> dict[str, Callable[[], list[str]]]:
    """What each `x-names` stands for, imported when a schema is first loaded."""

    def engines() -> list[str]:
        from pytest_rlrollout.engines import ENGINES

        return list(ENGINES)

    def capabilities() -> list[str]:
        from pytest_rlrollout.contract.capabilities import CAPABILITIES

        return list(CAPABILITIES)

    def dtypes() -> list[str]:
        from pytest_rlrollout.numerics.tolerances import TOLERANCES

        return list(TOLERANCES)

    def profiles() -> list[str]:
        from pytest_rlrollout.suite.run_config import PROFILES

        return list(PROFILES)

    def causes() -> list[str]:
        from pytest_rlrollout.runs.diagnose import CAUSES

        return list(CAUSES)

    return {"engines": engines, "capabilities": capabilities, "dtypes": dtypes, "profiles": profiles, "causes": causes}


def _named(node: Any, names: dict[str, Callable[[], list[str]]]) -> Any:
    """`node` with every `x-names` subschema given its `enum` (null too where its type allows it)."""
    if isinstance(node, list):
        return [_named(n, names) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _named(v, names) for k, v in node.items()}
    if "x-names" in out:
        types = out.get("type", [])
        nullable = types == "null" or (isinstance(types, list) and "null" in types)
        out["enum"] = [*names[out["x-names"]](), *([None] if nullable else [])]
    return out


@cache
def schema(name: str, part: str | None = None) -> dict[str, Any]:
    """`schemas/<name>.schema.json`, its `x-names` filled in; with `part`, the schema of one of
    its `$defs` (a run-state file holds one kind of record, its name says which)."""
    if part is not None:
        root = schema(name)
        return {"$defs": root["$defs"], "$ref": f"#/$defs/{part}"}
    named: dict[str, Any] = _named(
        json.loads((shipped("schemas") / f"{name}.schema.json").read_text()), _registry_names()
    )
    return named


@cache
def _check(name: str, part: str | None) -> SchemaCheck:
    return SchemaCheck(schema(name, part))


def problems(name: str, document: Any, part: str | None = None) -> dict[tuple[Any, ...], str]:
    """How `document` breaks `<name>.schema.json` (or its `$defs` `part`): for each top-level
    field at fault (the empty path: the document itself), the most telling error, worded with
    the path inside the field; empty when it is valid."""
    check = _check(name, part)
    if check.is_valid(document):
        return {}
    import jsonschema

    by_field: dict[tuple[Any, ...], list[Any]] = {}
    for e in check.errors(document):
        by_field.setdefault(tuple(e.absolute_path)[:1], []).append(e)
    return {k: _worded(jsonschema.exceptions.best_match(v)) for k, v in sorted(by_field.items(), key=str)}


def _worded(e: Any) -> str:
    where = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in e.absolute_path).replace(".[", "[")
    if e.validator == "required":
        why = f"{', '.join(str(k) for k in e.validator_value if k not in e.instance)} missing"
    elif e.validator in SIZES:  # said without quoting the value, which may be megabytes
        why = SIZES[e.validator].format(e.validator_value)
    else:
        # a value a pattern or a choice of shapes refuses is worded by what the schema says it must be
        described = e.validator in ("pattern", "not", "anyOf", "oneOf") and "description" in e.schema
        why = f"not {e.schema['description']}" if described else e.message
    return (f"{where}: {why}" if where else why)[:MESSAGE_CHARS]
