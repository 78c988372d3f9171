"""The clause catalogue: every clause of the contract with its level, area, rule and sources.

`schemas/clauses.json` is the one source of truth; the validator, the reference deployment, the
suite, the reports and `docs/contract.md` all read it through `catalogue()`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal, cast

from pytest_rlrollout.engines import ENGINES, Engine, spec
from pytest_rlrollout.shipped import shipped

Level = Literal["MUST", "SHOULD", "MAY"]
LEVELS: tuple[Level, ...] = ("MUST", "SHOULD", "MAY")
DATA = shipped("schemas")  # the catalogue and the JSON Schemas, at the project's top level


@dataclass(frozen=True)
class Clause:
    id: str
    level: Level
    area: str
    rule: str
    source: tuple[str, ...]
    # engine -> how that engine expresses the clause (its binding); an engine without one is
    # not judged on the clause: the intent has no form on its wire
    bindings: dict[Engine, str] = field(hash=False)
    refines: str | None = None
    decision: str | None = None

    @property
    def engines(self) -> tuple[Engine, ...]:
        """The engines the clause binds to, in catalogue order."""
        return tuple(e for e in ENGINES if e in self.bindings)

    def binds(self, engine: Engine) -> bool:
        return self.binding(engine) is not None

    def binding(self, engine: Engine) -> str | None:
        """How `engine` expresses the clause: its own binding, else (a gateway over engines of
        another kind) its engines' one; None when it has none."""
        # a cast: binds_like is a plain string in the engine modules (the registry imports them), and
        # each spells it by another engine module's NAME, a registered engine
        like = cast("Engine | None", spec(engine).binds_like)
        return self.bindings.get(engine) or (self.bindings.get(like) if like is not None else None)


class Catalogue:
    """The clauses in catalogue order, looked up by ID."""

    def __init__(
        self,
        clauses: list[Clause],
        *,
        sources: dict[str, str],
        levels: dict[str, str],
        areas: dict[str, dict[str, str]],
        engines: dict[str, str],
        version: str = "",
    ):
        self._by_id = {c.id: c for c in clauses}
        self.version = version  # reports judged by different catalogues do not compare
        if len(self._by_id) != len(clauses):
            raise ValueError("clause catalogue has duplicate IDs")
        self.sources, self.levels, self.areas, self.engines = sources, levels, areas, engines

    def __getitem__(self, clause_id: str) -> Clause:
        try:
            return self._by_id[clause_id]
        except KeyError:
            raise KeyError(f"unknown clause ID {clause_id!r}") from None

    def __contains__(self, clause_id: object) -> bool:
        return clause_id in self._by_id

    def __iter__(self) -> Iterator[Clause]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def area(self, area: str) -> list[Clause]:
        return [c for c in self if c.area == area]


def load_json(name: str) -> Any:
    """A data file of the contract, e.g. `load_json("clauses.json")`."""
    return json.loads((DATA / name).read_text())


@cache
def catalogue() -> Catalogue:
    doc = load_json("clauses.json")
    clauses = [
        Clause(
            id=c["id"],
            level=c["level"],
            area=c["area"],
            rule=c["rule"],
            source=tuple(c["source"]),
            bindings=dict(c["bindings"]),
            refines=c.get("refines"),
            decision=c.get("decision"),
        )
        for c in doc["clauses"]
    ]
    if tuple(doc["engines"]) != ENGINES:  # the registry lists the engines; the catalogue describes each
        raise ValueError(f"clauses.json describes the engines {list(doc['engines'])}, the registry has {list(ENGINES)}")
    for c in clauses:
        if stray := sorted(set(c.bindings) - set(ENGINES)):
            raise ValueError(f"clauses.json: {c.id} binds {', '.join(stray)}, no engine of the registry")
    # the catalogue's number, and a digest of the clauses (ID, level, area, rule): two reports compare
    # only when they were judged by the same contract. An engine's binding is how that engine is
    # asked, documented beside the clause; a binding added for another engine changes no verdict.
    rules = [[c["id"], c["level"], c["area"], c["rule"]] for c in doc["clauses"]]
    digest = hashlib.sha256(json.dumps(rules).encode()).hexdigest()[:12]
    return Catalogue(
        clauses,
        sources=doc["sources"],
        levels=doc["levels"],
        areas=doc["areas"],
        engines=doc["engines"],
        version=f"{doc['version']}+{digest}",
    )
