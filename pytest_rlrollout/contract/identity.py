"""SNAP-ID-1: a snapshot identity is one path segment (it names a directory of the bucket)."""

from __future__ import annotations

NAME_MAX = 255  # bytes of one file name (ext4, xfs, APFS...): the longest identity a bucket can hold


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
    try:
        size = len(identity.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    if size > NAME_MAX:
        return f"is {size} bytes long in UTF-8, more than a file name can be ({NAME_MAX})"
    return None
