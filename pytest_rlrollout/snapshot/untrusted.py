"""What an exporter wrote, read as untrusted input: regular files only, JSON within fixed bounds,
and untrusted text made safe to print.

The bounds are far above what real snapshots need (a 30B MoE's largest header holds ~400
tensors in ~50 KB; its index ~19k entries in 1.6 MB) and low enough that a hostile file costs
at most a few hundred milliseconds and ~200 MB to refuse:

- MAX_DEPTH: JSON nesting. Python's json module recurses per level, and so do repr(),
  `==` and jsonschema on what it returns; a document nested deeper is refused before parsing.
- MAX_JSON_ITEMS: containers, keys and values of one document (what parsing allocates: ~100
  bytes each), counted before parsing.
- MAX_JSON_BYTES: the size of a JSON file the validator reads at all.
"""

from __future__ import annotations

import json
import os
import reprlib
import stat
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from pytest_rlrollout.contract.untrusted import kind_of, printable  # noqa: F401 (read here by the validator's modules)

MAX_DEPTH = 64
MAX_JSON_ITEMS = 1 << 21  # 2,097,152: a spec of ~250k tensors
MAX_JSON_BYTES = 32 << 20  # 32 MiB


class Unreadable(ValueError):
    """A file the validator does not read: not a regular file, or larger than its bound."""


class BadJSON(ValueError):
    """A document that is not JSON, or is JSON beyond the bounds; the message says which."""


# --------------------------------------------------------------------------- regular files


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """A regular file opened for reading. Anything else is refused from its stat before it is
    opened: opening a FIFO blocks until a writer comes, opening a device can have effects.
    O_NONBLOCK and the fstat after opening catch a file swapped for one of those in between."""
    before = os.stat(path)
    if not stat.S_ISREG(before.st_mode):
        raise Unreadable(f"is {kind_of(before.st_mode)}, not a regular file; not read")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise Unreadable("changed while it was being opened; not read")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_exactly(f: BinaryIO, n: int) -> bytes:
    """`n` bytes from `f`; Unreadable when the file ends first (it shrank since its size was read)."""
    data = f.read(n)
    if len(data) != n:
        raise Unreadable(f"ended after {len(data)} of {n} bytes")
    return data


def read_limited(path: str | os.PathLike[str], limit: int) -> bytes:
    """A whole regular file of at most `limit` bytes."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise Unreadable(f"is {size} bytes, more than the validator reads ({limit}); not read")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Unreadable(f"grew past {limit} bytes while it was read; not read")
    return data


# --------------------------------------------------------------------------- JSON within bounds


@dataclass(frozen=True)
class Shape:
    """What a document holds, counted without parsing it."""

    depth: int  # deepest nesting of arrays and objects (MAX_DEPTH + 1 stands for "deeper")
    objects: int  # JSON objects
    items: int  # containers plus separators (',' and ':'): bounds what parsing allocates
    keys: int  # keys of the outermost object (a safetensors header's tensors, bounded before parsing)


_OPEN, _CLOSE, _SEPARATORS = b"[{", b"]}", b",:"
_MARKS = b'"' + _OPEN + _CLOSE + _SEPARATORS
_NOT_MARKS = bytes(c for c in range(256) if c not in _MARKS)
_TO_SQUARE = bytes.maketrans(b"{}", b"[]")
_STEP = np.zeros(256, np.int8)
_STEP[list(_OPEN)] = 1
_STEP[list(_CLOSE)] = -1
_IS_SEPARATOR = np.zeros(256, bool)
_IS_SEPARATOR[list(_SEPARATORS)] = True
_CHUNK = 1 << 18  # bytes per step of the exact scan: bounds its temporaries to a few MB


def shape_of(raw: bytes, max_depth: int = MAX_DEPTH) -> Shape:
    """The shape of a JSON document, in linear time and bounded memory.

    Real snapshot files take the fast path: no backslash, and no bracket or separator inside a
    string, so the structure is what bytes.translate keeps (C speed, ~2 ms per MB). Anything
    else gets the exact scan. For malformed input the numbers are the scan's reading; the
    parser then reports the error itself."""
    if b"\\" not in raw:
        fast = _fast_shape(raw, max_depth)
        if fast is not None:
            return fast
    return _exact_shape(raw, max_depth)


def _fast_shape(raw: bytes, max_depth: int) -> Shape | None:
    # Quotes, brackets and separators only; then every string free of those is an adjacent
    # `""` pair. Removing the pairs left to right leaves a quote exactly when some string holds
    # one of them (the first such string's opening quote is never paired), so what is left
    # otherwise is the document's structure.
    bare = raw.translate(None, _NOT_MARKS).replace(b'""', b"")
    if b'"' in bare:
        return None
    depth = _balanced_depth(bare.translate(_TO_SQUARE, _SEPARATORS), max_depth)
    if depth is None:
        return None  # unbalanced: the exact scan measures how deep the parser would go
    objects = bare.count(b"{")
    items = objects + bare.count(b"[") + bare.count(b",") + bare.count(b":")
    return Shape(depth, objects, items, _top_level_keys(bare))


def _top_level_keys(structure: bytes) -> int:
    """The ':' directly inside the outermost object of a document's structure (strings removed),
    counted in chunks so that the temporaries stay a few MB."""
    marks = np.frombuffer(structure, np.uint8)
    level, keys = 0, 0
    for start in range(0, len(marks), _CHUNK):
        a = marks[start : start + _CHUNK]
        levels = np.cumsum(_STEP[a], dtype=np.int32) + level
        keys += int(np.count_nonzero((a == ord(":")) & (levels == 1)))
        level = int(levels[-1])
    return keys


def _balanced_depth(brackets: bytes, max_depth: int) -> int | None:
    """Nesting depth of a string of `[` and `]`; None when it does not balance. Each round removes
    the innermost pairs, so the rounds count the depth; deeper than max_depth stops early."""
    if b"[" * (max_depth + 1) in brackets:
        return max_depth + 1
    depth = 0
    while brackets:
        if depth > max_depth:
            return depth
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            return None
        brackets, depth = inner, depth + 1
    return depth


def _exact_shape(raw: bytes, max_depth: int) -> Shape:
    """A chunked scan with numpy: quotes escaped by an odd run of backslashes do not end a string,
    and brackets and separators inside strings do not count."""
    data = np.frombuffer(raw, np.uint8)
    inside, run, depth, deepest, objects, items, keys = 0, 0, 0, 0, 0, 0, 0
    for start in range(0, len(data), _CHUNK):
        a = data[start : start + _CHUNK]
        quote = a == ord('"')
        backslash = a == ord("\\")
        if run or backslash.any():
            escaped, run = _escaped(backslash, run)
            quote &= ~escaped
        parity = np.cumsum(quote, dtype=np.int32) & 1
        outside = parity == inside  # after this byte, the scan is outside any string
        steps = _STEP[a] * outside
        levels = np.cumsum(steps, dtype=np.int64) + depth
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
        objects += int(np.count_nonzero(outside & (a == ord("{"))))
        items += int(np.count_nonzero(steps == 1)) + int(np.count_nonzero(outside & _IS_SEPARATOR[a]))
        keys += int(np.count_nonzero(outside & (a == ord(":")) & (levels == 1)))
        inside = int(parity[-1]) ^ inside
    return Shape(min(deepest, max_depth + 1), objects, items, keys)


def _escaped(backslash: np.ndarray, run: int) -> tuple[np.ndarray, int]:
    """Which bytes follow an odd run of backslashes (`run` of them ended the previous chunk),
    and how many backslashes end this chunk."""
    index = np.arange(len(backslash))
    # the index of the last byte at or before each position that is not a backslash; the
    # previous chunk's run sits just before index 0
    last = np.maximum.accumulate(np.where(backslash, -(run + 1), index))
    before = np.empty(len(backslash), np.int64)
    before[0] = run
    before[1:] = index[:-1] - last[:-1]
    return (before & 1).astype(bool), int(index[-1] - last[-1])


def shape_problem(shape: Shape, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_JSON_ITEMS) -> str | None:
    if shape.depth > max_depth:
        return f"nested deeper than {max_depth} levels (the validator's limit); not parsed"
    if shape.items > max_items:
        return f"holds more than {max_items} JSON items (the validator's limit); not parsed"
    return None


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def loads(
    raw: bytes,
    *,
    strict: bool = False,
    shape: Shape | None = None,
    max_depth: int = MAX_DEPTH,
    max_items: int = MAX_JSON_ITEMS,
) -> Any:
    """Parse UTF-8 JSON whose shape is within the bounds; BadJSON says what is wrong.

    `strict` refuses what RFC 8259 does and Python's json accepts (NaN, Infinity, numbers out
    of float range): the safetensors library parses headers that way. Otherwise a document
    means what it means to Python's json, as for transformers reading config.json. Duplicate
    keys keep the last value either way, as both do."""
    problem = shape_problem(shape or shape_of(raw, max_depth), max_depth=max_depth, max_items=max_items)
    if problem:
        raise BadJSON(problem)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadJSON(f"not UTF-8: {e.reason} at byte {e.start}") from None
    hooks: dict[str, Any] = {"parse_constant": _refuse_constant, "parse_float": _finite} if strict else {}
    try:
        return json.loads(text, **hooks)
    except RecursionError:  # not reached below MAX_DEPTH; kept so no bound change can crash
        raise BadJSON("nested too deeply to parse") from None
    except ValueError as e:  # JSONDecodeError, and int()'s digit limit for huge numbers
        raise BadJSON(f"not valid JSON: {brief_text(str(e), 200)}") from None


# --------------------------------------------------------------------------- untrusted text in messages

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple = 3, 4, 6, 6
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 80, 40, 80


def brief(value: object) -> str:
    """repr() of an untrusted value, cut short whatever its size or nesting."""
    text = _REPR.repr(value)
    if isinstance(value, str) and len(value) > _REPR.maxstring:
        text += f" ({len(value)} characters)"
    return text


def shown(value: object, limit: int = 300) -> str:
    """repr() of an untrusted value: whole when it is short (a list of config keys, a shape),
    else cut to about `limit` characters. Costs one full repr, which the bounds on the documents
    values come from keep bounded."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond str()'s digit limit, computed from a document's numbers
        return f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else "<unprintable value>"
    return brief_text(text, limit)


def brief_text(text: str, limit: int = 160) -> str:
    """An untrusted name or message cut to about `limit` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return f"{text[:head]}...{text[head - limit :]} ({len(text)} characters)"
