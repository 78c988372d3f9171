"""A credential that never shows itself: not in a repr, a traceback, a log or a report.

pytest shows every local of every frame of a failure (`-l`), and junit XML and reports keep what
it shows; so the key is never held as a plain `str` where it could be on a traceback: it is a
`Secret` until a header is built, and the header value is `Redacted`.
"""

from __future__ import annotations

import hmac

HIDDEN = "<redacted>"


class Redacted(str):
    """A string that is sent as it is but never shown: httpx encodes its characters into the
    header (`str.encode` reads them), while `repr`, `str()`, `%s` and f-strings give
    `<redacted>`. Slicing or concatenating it gives a plain `str`: keep such results out of
    locals."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(HIDDEN)

    def __str__(self) -> str:
        return HIDDEN

    def __format__(self, spec: str) -> str:
        return format(HIDDEN, spec)


class Secret:
    """Wraps an API key; `reveal()` is the only way to the value (used where headers are built)."""

    __slots__ = ("_value",)

    def __init__(self, value: str | Secret):
        # str.__str__: a Redacted value's own str() would give the placeholder
        self._value = (
            value.reveal()
            if isinstance(value, Secret)
            else str.__str__(value)
            if isinstance(value, str)
            else str(value)
        )

    def reveal(self) -> str:
        return self._value

    def bearer(self) -> Redacted:
        """`Bearer <key>` as a header value that never shows."""
        return Redacted(f"Bearer {self._value}")

    def redact(self, text: str, mark: str = "<key>") -> str:
        """`text` with every occurrence of the key replaced by `mark`."""
        return text.replace(self._value, mark) if self._value else text

    def redact_bytes(self, data: bytes, mark: bytes = b"<key>") -> bytes:
        """`data` with every occurrence of the key's UTF-8 bytes replaced by `mark`."""
        return data.replace(self._value.encode("utf-8", "surrogatepass"), mark) if self._value else data

    def excerpt(self, text: str, n: int, mark: str = "<key>") -> str:
        """The first `n` characters of `text`, the key replaced first: an occurrence straddling
        the cut is replaced whole, so no prefix of the key is left at the end."""
        if not self._value:
            return text[:n]
        end = n + len(self._value)
        while (at := text.find(self._value, end - len(self._value) + 1, end + len(self._value) - 1)) >= 0:
            end = at + len(self._value)
        return self.redact(text[:end], mark)[:n]

    def matches(self, given: str) -> bool:
        """`given` is this key (compared in constant time)."""
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self._value.encode("utf-8", "surrogatepass"))

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))
