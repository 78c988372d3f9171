"""Tensor dtypes: safetensors codes, the torch-style spellings seen in specs, and sizes."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np


@dataclass(frozen=True)
class DType:
    code: str  # the safetensors spelling, used as the canonical name
    bits: int
    numpy: str | None  # numpy storage dtype for the raw bytes
    quantized: bool = False  # 8 bits or narrower float/int used for weight quantization

    @property
    def itemsize(self) -> float:
        return self.bits / 8


_TABLE = [
    DType("F64", 64, "<f8"),
    DType("F32", 32, "<f4"),
    DType("F16", 16, "<f2"),
    DType("BF16", 16, "<u2"),
    DType("I64", 64, "<i8"),
    DType("I32", 32, "<i4"),
    DType("I16", 16, "<i2"),
    DType("I8", 8, "i1", quantized=True),
    DType("U64", 64, "<u8"),
    DType("U32", 32, "<u4"),
    DType("U16", 16, "<u2"),
    DType("U8", 8, "u1"),
    DType("BOOL", 8, "u1"),
    DType("F8_E4M3", 8, "u1", quantized=True),
    DType("F8_E5M2", 8, "u1", quantized=True),
    DType("F8_E8M0", 8, "u1"),  # a scale format, not a weight format
    DType("F6_E2M3", 6, None, quantized=True),
    DType("F6_E3M2", 6, None, quantized=True),
    DType("F4", 4, None, quantized=True),
]
BY_CODE = {d.code: d for d in _TABLE}

# torch / numpy spellings found in model.weight.spec.json files (the docs' example uses "float16").
_ALIASES = {
    "float64": "F64",
    "double": "F64",
    "float32": "F32",
    "float": "F32",
    "float16": "F16",
    "half": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "long": "I64",
    "int32": "I32",
    "int": "I32",
    "int16": "I16",
    "short": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e4m3": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e8m0fnu": "F8_E8M0",
    "float4_e2m1fn_x2": "F4",
    "float4_e2m1": "F4",
}


@cache
def normalise(name: str) -> str | None:
    """The safetensors code for a dtype spelling (`bfloat16`, `torch.bfloat16`, `BF16` → `BF16`), or None."""
    if name in BY_CODE:
        return name
    bare = name.removeprefix("torch.").lower()
    return _ALIASES.get(bare) or (bare.upper() if bare.upper() in BY_CODE else None)


def nbytes(code: str, shape: tuple[int, ...] | list[int]) -> int:
    """Byte size of a tensor; sub-byte dtypes pack along the whole tensor."""
    n = 1
    for d in shape:
        n *= d
    bits = BY_CODE[code].bits * n
    return (bits + 7) // 8


def numpy_code(dtype: np.dtype) -> str:
    """The safetensors code for a numpy dtype (bf16 and fp8 have no numpy dtype: use `Tensor`)."""
    table = {
        "f8": "F64",
        "f4": "F32",
        "f2": "F16",
        "i8": "I64",
        "i4": "I32",
        "i2": "I16",
        "i1": "I8",
        "u8": "U64",
        "u4": "U32",
        "u2": "U16",
        "u1": "U8",
        "b1": "BOOL",
    }
    key = dtype.kind + str(dtype.itemsize)
    if key not in table:
        raise ValueError(f"numpy dtype {dtype} has no safetensors code")
    return table[key]
