"""FP8 E4M3 block quantization in numpy (the `mxfp8_bw128` layout of fireworks-prequant)."""

from __future__ import annotations

from functools import cache

import numpy as np

E4M3_MAX = 448.0


@cache
def e4m3_table() -> np.ndarray:
    """float32 value of each of the 256 E4M3 (fn) codes; the two NaN codes are NaN."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = (codes & 0x7).astype(np.float64)
    normal = (1 + man / 8) * np.exp2(exp.astype(np.float64) - 7)
    subnormal = (man / 8) * 2.0**-6
    values = sign * np.where(exp == 0, subnormal, normal)
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values.astype(np.float32)


@cache
def _positive_grid() -> tuple[np.ndarray, np.ndarray]:
    table = e4m3_table()
    codes = np.arange(128, dtype=np.uint8)[:127]  # 0x00..0x7E: every finite non-negative value, ascending
    return table[codes], codes


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """Round float32 values (|x| ≤ 448) to the nearest E4M3 code."""
    values, codes = _positive_grid()
    mag = np.minimum(np.abs(x.astype(np.float32)), E4M3_MAX)
    hi = np.clip(np.searchsorted(values, mag), 1, len(values) - 1)
    lo = hi - 1
    pick = np.where(mag - values[lo] <= values[hi] - mag, lo, hi)
    out = codes[pick]
    return np.where(np.signbit(x) & (out != 0), out | 0x80, out).astype(np.uint8)


def scale_shape(shape: tuple[int, ...], block: tuple[int, int] = (128, 128)) -> tuple[int, int]:
    """The shape of a 2-D weight's block scales: [ceil(M/bm), ceil(K/bn)]."""
    (m, k), (bm, bn) = shape, block
    return -(-m // bm), -(-k // bn)


def quantize_blockwise(w: np.ndarray, block: tuple[int, int] = (128, 128)) -> tuple[np.ndarray, np.ndarray]:
    """(E4M3 codes, float32 dequant multipliers of shape `scale_shape`) for a 2-D weight."""
    bm, bn = block
    rows, cols = scale_shape(w.shape, block)
    scale = np.ones((rows, cols), dtype=np.float32)
    codes = np.empty(w.shape, dtype=np.uint8)
    for i in range(rows):
        for j in range(cols):
            tile = w[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn].astype(np.float32)
            amax = float(np.abs(tile).max()) if tile.size else 0.0
            s = amax / E4M3_MAX if amax > 0 else 1.0  # an all-zero tile keeps multiplier 1.0, as prequant does
            scale[i, j] = s
            codes[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn] = encode_e4m3(tile / s)
    return codes, scale


def dequantize_blockwise(codes: np.ndarray, scale: np.ndarray, block: tuple[int, int] = (128, 128)) -> np.ndarray:
    values = e4m3_table()[codes]
    bm, bn = block
    expanded = np.repeat(np.repeat(scale, bm, axis=0), bn, axis=1)[: codes.shape[0], : codes.shape[1]]
    return values * expanded
