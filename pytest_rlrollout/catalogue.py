"""The clause catalogue and JSON Schemas: the one source of truth every other part reads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

Level = Literal["MUST", "SHOULD", "MAY"]


def data_dir(name: str) -> Path:
    """Where `schemas/` or `conformance/` lives: inside the wheel, or beside the package in a checkout."""
    packaged = Path(__file__).parent / "_data" / name
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).parent.parent / name
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"pytest-rlrollout is installed without its {name}/ directory")


@dataclass(frozen=True)
class Clause:
    id: str
    level: Level
    area: str
    rule: str
    source: tuple[str, ...]
    refines: str | None = None
    decision: str | None = None


class Catalogue:
    def __init__(self, clauses: list[Clause]):
        self._by_id = {c.id: c for c in clauses}
        if len(self._by_id) != len(clauses):
            raise ValueError("clause catalogue has duplicate IDs")

    def __getitem__(self, clause_id: str) -> Clause:
        try:
            return self._by_id[clause_id]
        except KeyError:
            raise KeyError(f"unknown clause ID {clause_id!r}") from None

    def __contains__(self, clause_id: object) -> bool:
        return clause_id in self._by_id

    def __iter__(self):
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def area(self, area: str) -> list[Clause]:
        return [c for c in self if c.area == area]


@cache
def schema(name: str) -> dict[str, Any]:
    """A JSON Schema from `schemas/`, e.g. `schema("weight-spec")`."""
    return json.loads((data_dir("schemas") / f"{name}.schema.json").read_text())


@cache
def catalogue() -> Catalogue:
    import jsonschema

    doc = json.loads((data_dir("schemas") / "clauses.json").read_text())
    jsonschema.validate(doc, schema("clauses"))
    clauses = [
        Clause(
            id=c["id"],
            level=c["level"],
            area=c["area"],
            rule=c["rule"],
            source=tuple(c["source"]),
            refines=c.get("refines"),
            decision=c.get("decision"),
        )
        for c in doc["clauses"]
    ]
    return Catalogue(clauses)
