"""What a report says about its run before any verdict: where the verdicts come from
(`Provenance`), the contract they were judged by (`Contract`), the engine the deployment was
judged as (`Engine`) and what it offers (`Capability`, the rows of the capability table).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from pytest_rlrollout.suite.report.fields import ReportError, as_object, as_strings

CONTRACT_DOC = "docs/contract.md (or `rlrollout clauses --format md`)"


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where the verdicts come from: deployment, mode, recording, suite version, base digest, and
    for a live run what was served at the start and at the end (identity lists)."""

    deployment: str
    mode: str | None = None
    cassettes: str | None = None
    recorded: str | None = None
    base_url: str | None = None
    suite_version: str | None = None
    level: str | None = None
    transition: str | None = None
    snapshot: str | None = None
    base_digest: str | None = None
    numerics: str | None = None  # the served dtype, the tolerances it gave, and their source
    finished: str | None = None
    served_at_start: tuple[str, ...] | None = None
    served_at_end: tuple[str, ...] | None = None
    uploaded_and_removed: tuple[str, ...] | None = None
    uploaded_and_kept: tuple[str, ...] | None = None
    adapters_left_loaded: tuple[str, ...] | None = None
    restored: str | None = None  # how the start was served again, and whether it scores as before
    restore: str | None = None  # how to serve the start again, when the run did not

    def items(self) -> list[tuple[str, str | tuple[str, ...]]]:
        """The facts that were recorded, in order: a text, or a list of identities."""
        return [(f.name, v) for f in fields(self) if (v := getattr(self, f.name)) is not None]

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.items()}

    @classmethod
    def from_json(cls, doc: Any) -> Provenance:
        doc = as_object(doc, "provenance")
        unknown = set(doc) - {f.name for f in fields(cls)}
        if unknown:
            raise ReportError(f"provenance: unknown {', '.join(sorted(unknown))}")
        if "deployment" not in doc:
            raise ReportError("provenance: no deployment")
        facts: dict[str, Any] = {
            k: as_strings(v, f"provenance: {k}") if k in IDENTITY_LISTS and v is not None else v for k, v in doc.items()
        }
        return cls(**facts)


# the provenance's lists of snapshot identities (a live run's); every other fact is one text
IDENTITY_LISTS = frozenset(
    {"served_at_start", "served_at_end", "uploaded_and_removed", "uploaded_and_kept", "adapters_left_loaded"}
)


@dataclass(frozen=True)
class Capability:
    """A row of the capability table: whether the deployment has it, what the probe saw, and
    whether its engine requires it."""

    name: str
    has: bool
    seen: str
    about: str = ""
    required: bool = False

    @property
    def missing(self) -> bool:
        return self.required and not self.has

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "has": self.has, "seen": self.seen, "about": self.about, "required": self.required}

    @classmethod
    def from_json(cls, doc: Any) -> Capability:
        doc = as_object(doc, "capability")
        return cls(
            str(doc.get("name", "")),
            bool(doc.get("has")),
            str(doc.get("seen", "")),
            str(doc.get("about", "")),
            bool(doc.get("required")),
        )

    @classmethod
    def table(cls, discovery: dict[str, Any] | None) -> list[Capability]:
        """The rows of what the preflight discovered (`remote.discovery.Discovery.as_dict`)."""
        if not discovery:
            return []
        from pytest_rlrollout.contract.capabilities import CAPABILITIES

        engine, has, seen = discovery["engine"], discovery["capabilities"], discovery["seen"]
        return [
            cls(n, has[n], str(seen.get(n, c.probe)), c.about, c.required(engine))
            for n, c in CAPABILITIES.items()
            if n in has
        ]


@dataclass(frozen=True)
class Engine:
    name: str
    decided: str  # why the run judged the deployment as this engine
    version: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "decided": self.decided, "version": self.version}


@dataclass(frozen=True)
class Contract:
    version: str
    document: str = CONTRACT_DOC

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "document": self.document}
