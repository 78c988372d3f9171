"""A credential that never shows itself: not in a repr, a traceback, a log or a report."""

from __future__ import annotations


class Secret:
    """Wraps an API key; `reveal()` is the only way to the value (used where headers are built)."""

    __slots__ = ("_value",)

    def __init__(self, value: str | Secret):
        self._value = value.reveal() if isinstance(value, Secret) else str(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))
