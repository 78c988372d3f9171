"""Reading a report's JSON back, field by field: each reader names where a document is not what
the report writes (`ReportError`), so a report on disk that is not one says why.
"""

from __future__ import annotations

from typing import Any

from pytest_rlrollout.contract import Outcome

Scalar = int | float | str | bool | None


class ReportError(ValueError):
    """A document that is not a report of the suite (what is wrong, and where)."""


def as_outcome(value: Any, where: str) -> Outcome:
    try:
        return Outcome(value)
    except ValueError:
        raise ReportError(f"{where}: {value!r} is not an outcome ({', '.join(Outcome)})") from None


def as_object(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ReportError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    return doc


def as_strings(doc: Any, where: str) -> tuple[str, ...]:
    if not isinstance(doc, list | tuple):
        raise ReportError(f"{where}: expected a list, got {type(doc).__name__}")
    return tuple(str(x) for x in doc)


def as_counts(doc: Any, where: str) -> dict[str, int] | None:
    if doc is None:
        return None
    counts = as_object(doc, where)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in counts.values()):
        raise ReportError(f"{where}: expected whole numbers")
    return {str(k): v for k, v in counts.items()}
