"""SNAP-ID-1: a snapshot identity is one path segment (it names a directory of the bucket)."""

from __future__ import annotations


def identity_problem(identity: object) -> str | None:
    """Why `identity` is not one safe path segment, or None."""
    if not isinstance(identity, str):
        return "is not a string"
    if not identity:
        return "is empty"
    if identity in (".", ".."):
        return "is a relative path component"
    for ch, label in (("/", "'/'"), ("\\", "'\\'"), ("\x00", "NUL")):
        if ch in identity:
            return f"contains {label}"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in identity):
        return "contains a control character"
    return None
