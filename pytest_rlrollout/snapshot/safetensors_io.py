"""Safetensors files: a strict header reader (no tensor data read) and a streaming writer.

The reader reports *why* a file is malformed, which the safetensors library does only in
general terms; the validator still asks the library for a second opinion. It takes files
as untrusted: bounded header size, tensor count, name length and JSON shape (`untrusted`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, TypeGuard

import numpy as np

from pytest_rlrollout.snapshot import dtypes, untrusted

# Bounds on one header, far above real files (a 30B MoE's largest holds ~400 tensors in ~50 KB),
# so that a hostile header is refused in bounded time and memory: parsing costs ~500 bytes and
# ~1 us per tensor; one of a million tensors took 43 s and 1.8 GB before these bounds.
MAX_HEADER_BYTES = 32 * 1024 * 1024  # the safetensors library allows 100 MB
MAX_TENSORS = 65_536  # per file
MAX_TENSOR_NAME = 1024  # characters
MAX_RANK = 64  # dimensions of a shape (numpy's own limit)
_UINT64 = 1 << 64  # shapes and offsets are u64/usize to the library


class HeaderError(ValueError):
    """A safetensors file that does not parse; the message says what is wrong."""


class TensorInfo(NamedTuple):  # a tuple, not a dataclass: a 30B model's headers hold ~19k of these
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute file offsets
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Header:
    path: Path
    size: int
    data_start: int
    metadata: dict[str, str]
    tensors: dict[str, TensorInfo]


def read_header(path: str | os.PathLike[str]) -> Header:
    """Parse and check a safetensors header; raises HeaderError naming the problem. Only regular
    files are opened (a FIFO would block); the header is bounded before it is parsed."""
    try:
        with untrusted.open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            n = _header_length(f, size)
            raw = untrusted.read_exactly(f, n)
    except untrusted.Unreadable as e:
        raise HeaderError(str(e)) from None
    doc = _parse(raw)
    metadata = _metadata(doc.pop("__metadata__", None))
    if len(doc) > MAX_TENSORS:
        raise HeaderError(f"holds {len(doc)} tensors, more than the validator's limit of {MAX_TENSORS}")
    data_start = 8 + n
    tensors: dict[str, TensorInfo] = {}
    for name, entry in doc.items():
        tensors[name] = _tensor_info(name, entry, data_start)
    _check_layout(tensors, data_start, size)
    return Header(Path(path), size, data_start, metadata, tensors)


def _header_length(f: BinaryIO, size: int) -> int:
    if size < 8:
        raise HeaderError(f"file is {size} bytes, shorter than the 8-byte header length")
    n = int.from_bytes(untrusted.read_exactly(f, 8), "little")
    if n > size - 8:
        raise HeaderError(f"header length {n} exceeds the file ({size} bytes)")
    if n > MAX_HEADER_BYTES:
        raise HeaderError(f"header length {n} exceeds the validator's {MAX_HEADER_BYTES}-byte limit")
    return n


def _parse(raw: bytes) -> dict[str, Any]:
    """The header's JSON object; counts of its keys and objects before parsing bound the tensors."""
    shape = untrusted.shape_of(raw)
    # + __metadata__ (a key and an object) and the root (an object)
    if shape.depth <= untrusted.MAX_DEPTH and (shape.keys > MAX_TENSORS + 1 or shape.objects > MAX_TENSORS + 2):
        raise HeaderError(f"holds more than {MAX_TENSORS} tensors (the validator's limit); not parsed")
    try:
        doc = untrusted.loads(raw, strict=True, shape=shape)
    except untrusted.BadJSON as e:
        raise HeaderError(f"header: {e}") from None
    if not isinstance(doc, dict):
        raise HeaderError(f"header is a JSON {type(doc).__name__}, not an object")
    return doc


def _metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise HeaderError("__metadata__ is not a map of strings to strings")
    return value


def _check_layout(tensors: dict[str, TensorInfo], data_start: int, size: int) -> None:
    """Data offsets are contiguous from the data section's start and end at the end of the file."""
    expected = 0
    for start, end, name in sorted((t.start, t.end, name) for name, t in tensors.items()):
        if start - data_start != expected:
            gap = "overlaps the previous tensor" if start - data_start < expected else "leaves a gap"
            raise HeaderError(f"tensor {_name(name)}: data_offsets begin at {start - data_start}, {gap}")
        expected = end - data_start
    if data_start + expected != size:
        raise HeaderError(f"data section is {size - data_start} bytes but the tensors account for {expected}")


def _name(name: str) -> str:
    return untrusted.brief(name)


def _tensor_info(name: str, entry: object, data_start: int) -> TensorInfo:
    if len(name) > MAX_TENSOR_NAME:
        raise HeaderError(f"tensor name {_name(name)} is longer than the validator's limit of {MAX_TENSOR_NAME}")
    if not isinstance(entry, dict):
        raise HeaderError(f"tensor {_name(name)}: entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if type(dtype) is not str or dtype not in dtypes.BY_CODE:
        raise HeaderError(f"tensor {_name(name)}: unknown dtype {untrusted.brief(dtype)}")
    if not shape_ok(shape):
        raise HeaderError(
            f"tensor {_name(name)}: shape {untrusted.brief(shape)} is not a list of at most {MAX_RANK} "
            "unsigned 64-bit integers"
        )
    if not (type(offsets) is list and len(offsets) == 2 and uint_list(offsets) and offsets[1] < _UINT64):
        raise HeaderError(
            f"tensor {_name(name)}: data_offsets {untrusted.brief(offsets)} is not a pair of unsigned 64-bit integers"
        )
    begin, end = offsets
    if end < begin:
        raise HeaderError(f"tensor {_name(name)}: data_offsets end {end} before begin {begin}")
    want = dtypes.nbytes(dtype, shape)
    if end - begin != want:
        raise HeaderError(f"tensor {_name(name)}: holds {end - begin} bytes, shape {shape} x {dtype} needs {want}")
    return TensorInfo(dtype, tuple(shape), data_start + begin, data_start + end)


def uint_list(xs: object) -> bool:
    """A list of non-negative integers (bools excluded). A loop, not all(): headers hold ~20k of these."""
    if type(xs) is not list:
        return False
    for x in xs:  # noqa: SIM110
        if type(x) is not int or x < 0:
            return False
    return True


def shape_ok(xs: object) -> TypeGuard[list[int]]:
    """A shape the validator computes with: at most MAX_RANK unsigned 64-bit integers (so a
    product of dimensions stays small, however hostile the file)."""
    if type(xs) is not list or len(xs) > MAX_RANK:
        return False
    for x in xs:  # noqa: SIM110
        if type(x) is not int or x < 0 or x >= _UINT64:
            return False
    return True


def library_opinion(path: str | os.PathLike[str]) -> str | None:
    """The safetensors library's complaint about a file, or None when it opens it."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            f.keys()
    except Exception as e:  # the library raises its own SafetensorError and OS errors alike
        return f"{type(e).__name__}: {e}"
    return None


# --------------------------------------------------------------------------- tensors in memory


@dataclass(frozen=True)
class Tensor:
    """A tensor's raw storage: `data` is a contiguous numpy array of the stored bytes' elements
    (uint16 for BF16, uint8 for FP8), so dtypes numpy lacks round-trip exactly."""

    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray = field(repr=False)

    @classmethod
    def of(cls, array: np.ndarray) -> Tensor:
        array = np.ascontiguousarray(array)
        return cls(dtypes.numpy_code(array.dtype), tuple(array.shape), array)

    @classmethod
    def bf16(cls, array: np.ndarray) -> Tensor:
        """Round float32 values to bfloat16 (nearest, ties to even)."""
        bits = np.ascontiguousarray(array, dtype="<f4").view("<u4")
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
        return cls("BF16", tuple(array.shape), rounded)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def buffer(self) -> memoryview:
        return np.ascontiguousarray(self.data).reshape(-1).view(np.uint8).data

    def float32(self) -> np.ndarray:
        """The values as float32 (BF16 widened exactly)."""
        if self.dtype == "BF16":
            return (self.data.astype("<u4") << 16).view("<f4").reshape(self.shape)
        if self.dtype in ("F32", "F16", "F64"):
            return self.data.astype("<f4").reshape(self.shape)
        raise ValueError(f"{self.dtype} has no direct float32 view (dequantize it)")


@dataclass(frozen=True)
class FileRange:
    """Tensor bytes that stay in a file until written (streaming copies)."""

    path: Path
    start: int
    end: int


Source = Tensor | FileRange


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    source: Source


def entries_of(tensors: Mapping[str, Tensor]) -> list[Entry]:
    return [Entry(n, t.dtype, t.shape, t) for n, t in tensors.items()]


def header_bytes(entries: list[Entry], metadata: Mapping[str, str] | None = None) -> tuple[bytes, list[Entry]]:
    """The serialized header and the entries in data order (widest dtype first, then by name,
    as the safetensors library lays them out)."""
    ordered = sorted(entries, key=lambda e: (-dtypes.BY_CODE[e.dtype].bits, e.name))
    doc: dict[str, object] = {}
    if metadata:
        doc["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for e in ordered:
        n = dtypes.nbytes(e.dtype, e.shape)
        doc[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, ordered


def write_file(
    path: str | os.PathLike[str], entries: Iterable[Entry], metadata: Mapping[str, str] | None = None
) -> None:
    """Write a safetensors file; FileRange sources are copied in bounded chunks."""
    raw, ordered = header_bytes(list(entries), metadata)
    tmp = Path(f"{path}.partial")
    with open(tmp, "wb") as out:
        out.write(len(raw).to_bytes(8, "little"))
        out.write(raw)
        for e in ordered:
            want = dtypes.nbytes(e.dtype, e.shape)
            if isinstance(e.source, FileRange):
                if e.source.end - e.source.start != want:
                    raise ValueError(f"{e.name}: source holds {e.source.end - e.source.start} bytes, needs {want}")
                _copy_range(e.source, out)
            else:
                if e.source.nbytes != want:
                    raise ValueError(f"{e.name}: data holds {e.source.nbytes} bytes, needs {want}")
                out.write(e.source.buffer())
    os.replace(tmp, path)


def _copy_range(src: FileRange, out) -> None:
    chunk = 8 << 20
    with open(src.path, "rb") as f:
        f.seek(src.start)
        left = src.end - src.start
        while left:
            block = f.read(min(chunk, left))
            if not block:
                raise HeaderError(f"{src.path} ended early")
            out.write(block)
            left -= len(block)


def read_tensor(info: TensorInfo, path: str | os.PathLike[str]) -> Tensor:
    """Load one tensor's bytes (used by the factory and the engine, never by structural checks)."""
    np_dtype = dtypes.BY_CODE[info.dtype].numpy
    if np_dtype is None:
        raise ValueError(f"{info.dtype} tensors cannot be loaded as arrays")
    with open(path, "rb") as f:
        f.seek(info.start)
        raw = f.read(info.nbytes)
    return Tensor(info.dtype, info.shape, np.frombuffer(raw, dtype=np_dtype).reshape(info.shape))


def load_file(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    h = read_header(path)
    return {name: read_tensor(info, path) for name, info in h.tensors.items()}
