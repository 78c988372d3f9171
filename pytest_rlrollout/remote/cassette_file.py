"""A cassette file read as data: a regular file inside its directory, of bounded size, JSON of
the shape `schemas/cassette.schema.json` describes; anything else is a `CassetteError` naming
the file, the record and the field, in one line that shows at most a short excerpt."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from pytest_rlrollout.contract.schemas import check, schema
from pytest_rlrollout.contract.untrusted import kind_of, printable
from pytest_rlrollout.remote.limits import MiB
from pytest_rlrollout.remote.stream import parsed_size

MAX_FILE = 64 * MiB  # bytes of one cassette file (the shipped ones are under 100 KB)
# bytes in memory one cassette may parse to, as `parsed_size` estimates it (a shipped cassette:
# 17 times its size); a file of empty arrays would parse to 20 times its size, so it is weighed first
MAX_PARSED = 256 * MiB
MAX_DEPTH = 32  # nesting of a cassette's meta (what the session recorded about the deployment)
SHOWN = 60  # characters of a cassette's content an error may show
# the document's own nesting, under meta's: interactions[i].response.events[j].t
MAX_SHAPE_DEPTH = MAX_DEPTH + 8
TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer", float: "a number"}
SCHEMA_TYPES = {"object": "an object", "array": "an array", "string": "a string", "number": "a number"}


class CassetteError(ValueError):
    """A cassette, or a cassette directory, that is not what the recorder writes: not a regular
    file inside its directory, too large, not JSON, or not of a cassette's shape. The message
    names the file and what is wrong, and shows at most a short excerpt of its content."""


def shown_path(path: Path, root: Path) -> str:
    """`path` as a message shows it: relative to `root`, a name that is not UTF-8 escaped (a
    terminal that prints the message must not fail on it)."""
    with contextlib.suppress(ValueError):
        path = path.relative_to(root)
    return printable_path(path)


def printable_path(path: Path) -> str:
    """A path as one printable line: bytes that are not UTF-8 and control characters escaped
    (a name holding a newline could otherwise forge a line of the report)."""
    return printable(os.fsencode(path.as_posix()).decode("utf-8", "backslashreplace"))


def read_regular(path: Path, root: Path, cap: int = MAX_FILE) -> bytes:
    """The bytes of `path`: a regular file inside `root` once links are resolved, of at most
    `cap` bytes; `CassetteError` otherwise. It is opened without following a last link and
    without blocking, and checked on the open file: a FIFO is refused, never waited on, and the
    file itself cannot be swapped between the check and the read (a parent directory swapped
    for a link after the path was resolved is not caught)."""
    path, root = Path(path), Path(root)
    shown = shown_path(path, root)
    try:
        real, inside = path.resolve(strict=True), root.resolve(strict=True)
    except (OSError, RuntimeError) as e:  # RuntimeError: a loop of links
        raise CassetteError(f"{shown}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if not real.is_relative_to(inside):
        raise CassetteError(
            f"{shown}: a link out of the cassette directory {printable_path(root)} (to {printable_path(real)})"
        )
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(real, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise CassetteError(f"{shown}: cannot be opened ({e.strerror})") from None
    try:
        mode, size = (st := os.fstat(fd)).st_mode, st.st_size  # checked before a file object is made of it
        if not stat.S_ISREG(mode):
            raise CassetteError(f"{shown}: {kind_of(mode)}, not a regular file")
        if size > cap:
            raise CassetteError(f"{shown}: {size:,} bytes, more than a cassette may hold ({cap:,})")
    except CassetteError:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        data = f.read(cap + 1)  # it may have grown since fstat
    if len(data) > cap:
        raise CassetteError(f"{shown}: more than a cassette may hold ({cap:,} bytes)")
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def parse(data: bytes, shown: str) -> dict[str, Any]:
    """A cassette's document from its bytes, weighed before it is parsed and checked against
    the shape the recorder writes."""
    if (weight := parsed_size(data)) > MAX_PARSED:
        raise CassetteError(
            f"{shown}: {len(data):,} bytes that would take about {weight / MiB:,.0f} MiB in memory "
            f"once parsed, more than a cassette may ({MAX_PARSED // MiB} MiB)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CassetteError(f"{shown}: not UTF-8 (at byte {e.start:,})") from None
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except RecursionError:  # the parser gives up at Python's recursion limit, long before memory does
        raise CassetteError(f"{shown}: not a cassette: nested deeper than JSON is parsed here") from None
    except ValueError as e:
        raise CassetteError(f"{shown}: not JSON ({str(e)[:200]})") from None
    problem = shape_problem(doc)
    if problem is not None:
        raise CassetteError(f"{shown}: not a cassette: {problem}")
    return doc


def _type(value: Any) -> str:
    return "null" if value is None else TYPES.get(type(value), type(value).__name__)


def _excerpt(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in `value` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        deepest = max(deepest, d)
        if deepest > MAX_SHAPE_DEPTH:
            return deepest
        stack.extend((c, d + 1) for c in children)
    return deepest


def shape_problem(doc: Any) -> str | None:
    """What makes `doc` not a cassette (None: nothing): the first way it breaks the cassette
    schema, said as the file's reader would say it, then what the schema cannot say."""
    if isinstance(doc, dict) and _depth(doc.get("meta")) > MAX_DEPTH:
        return f"meta nests deeper than {MAX_DEPTH} levels"
    if _depth(doc) > MAX_SHAPE_DEPTH:  # deeper than any cassette: never handed to a validator
        return f"the document nests deeper than {MAX_SHAPE_DEPTH} levels"
    cassette = check("cassette")
    if not cassette.is_valid(doc):
        return _said(next(iter(cassette.errors(doc))))
    return _beyond_schema(doc)


def _said(e: Any) -> str:
    """A schema error in the loader's words: where (`interactions[0].response.status`) and what.
    The schema's `x-not`, `x-expected` and `x-either` say what a value failed to be."""
    node: dict[str, Any] = schema("cassette")
    steps, path = list(e.absolute_schema_path), list(e.absolute_path)
    where: list[str] = []  # one piece per step into the instance
    marked: tuple[int, dict[str, Any]] | None = None  # the innermost node saying what a value is not
    naming = False  # the error is about a property's name (propertyNames)
    i = 0
    while i < len(steps) - 1:
        step = steps[i]
        if step == "properties":
            node, i = node[step][steps[i + 1]], i + 2
            where.append(f".{path[len(where)]}")
        elif step in ("items", "additionalProperties"):
            node, i = node[step], i + 1
            key = path[len(where)]
            where.append(f"[{key}]" if step == "items" else f"[{_excerpt(key)}]")
        elif step == "propertyNames":
            node, i, naming = node[step], i + 1, True
        else:
            break
        if "x-not" in node or "x-expected" in node:
            marked = (len(where), node)

    def at(k: int) -> str:
        return "".join(where[:k]).lstrip(".") or "the document"

    keyword, here = steps[-1], at(len(where))
    if naming and marked is not None:
        return f"{here} has a name that is not {marked[1]['x-not']}: {_excerpt(e.instance)}"
    structural = keyword in ("type", "required", "additionalProperties") and node.get("type") == "object"
    if marked is not None and not (marked[1] is node and structural):
        k, said = marked
        if "x-expected" in said:
            return f"{at(k)} is {_type(e.instance)}, not {said['x-expected']}"
        return f"{at(k)} is not {said['x-not']}"
    if keyword == "type":
        return f"{here} is {_type(e.instance)}, not {SCHEMA_TYPES.get(node['type'], node['type'])}"
    if keyword == "required":
        return f"{here} has no {next(k for k in node['required'] if k not in e.instance)!r}"
    if keyword == "additionalProperties":
        unknown = sorted(k for k in e.instance if k not in node.get("properties", {}))
        return f"{here} has an unknown field {_excerpt(unknown[0])}"
    if keyword == "oneOf" and "x-either" in node:
        a, b = node["x-either"]
        both = a in e.instance
        return f"{here} holds {'both' if both else 'neither'} {a!r} {'and' if both else 'nor'} {b!r}"
    return f"{here}: {e.message[:SHOWN]}"


def _beyond_schema(doc: dict[str, Any]) -> str | None:
    """What the schema cannot say: a status of 200.0 (JSON Schema counts it an integer), and a
    string holding a lone surrogate (no byte the recorder kept)."""
    for i, entry in enumerate(doc["interactions"]):
        r, at = entry["response"], f"interactions[{i}].response"
        if type(r["status"]) is not int:
            return f"{at}.status is not an HTTP status (an integer from 100 to 999): {_excerpt(r['status'])}"
        if "body" in r and not _encodes(r["body"]):
            return f"{at}.body holds a lone surrogate that is no byte the recorder kept"
        for j, event in enumerate(r.get("events", ())):
            if not _encodes(event["data"]):
                return f"{at}.events[{j}].data holds a lone surrogate that is no byte the recorder kept"
    return None


def _encodes(text: str) -> bool:
    """`text` is what the recorder writes: UTF-8, with the bytes that were not kept as escapes."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True
