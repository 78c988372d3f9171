"""Checks on the tensors as a whole: SNAP-COVER-1 (they cover the base), SNAP-QUANT-1/2 (quantization)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from pytest_rlrollout.snapshot import dtypes, untrusted
from pytest_rlrollout.snapshot.layout import CONFIG, INDEX, SPEC
from pytest_rlrollout.snapshot.validate.core import (
    WEIGHTS,
    Inconclusive,
    NotApplicable,
    Problem,
    Subject,
    check,
    names,
)


def _is_scale_of_quantized(name: str, table: Mapping[str, tuple[str, tuple[int, ...]]]) -> bool:
    for suffix in ("_scale_inv", "_scale"):
        if name.endswith(suffix):
            owner = table.get(name[: -len(suffix)])
            if owner is not None and dtypes.BY_CODE[owner[0]].quantized:
                return True
    return False


@check("SNAP-COVER-1", WEIGHTS)
def _covers_base(s: Subject) -> Iterator[Problem]:
    if s.base is None:
        raise NotApplicable("no base snapshot given")
    mine = s.tensors
    try:
        theirs = s.base.tensors
    except Inconclusive:
        raise Inconclusive("the base snapshot's tensors could not be read") from None
    if not theirs:
        raise Inconclusive("the base snapshot has no readable tensors")
    unknown = s.unreadable_tensors
    missing = [t for t in theirs if t not in mine and t not in unknown]
    extra = [t for t in mine if t not in theirs and not _is_scale_of_quantized(t, mine)]
    if missing:
        yield Problem(None, f"{len(missing)} base tensor(s) missing: {names(missing)}")
    if extra:
        yield Problem(None, f"{len(extra)} tensor(s) not in the base: {names(extra)}")
    for name in sorted(set(mine) & set(theirs)):
        (dt, shape), (bdt, bshape) = mine[name], theirs[name]
        if shape != bshape:
            hint = (
                " (a tensor-parallel slice?)"
                if len(shape) == len(bshape) and math.prod(shape) < math.prod(bshape)
                else ""
            )
            yield Problem(None, f"{name}: shape {list(shape)}, the base has {list(bshape)}{hint}")
        elif dt != bdt and not dtypes.BY_CODE[dt].quantized:
            yield Problem(None, f"{name}: dtype {dt}, the base has {bdt}")


# --------------------------------------------------------------------------- quantization


@check("SNAP-QUANT-1", WEIGHTS)
def _quantized_has_scales(s: Subject) -> Iterator[Problem]:
    q = s.quantization_config()
    if q is None:
        raise NotApplicable("config.json declares no quantization_config")
    table = s.tensor_map()
    try:
        indexed = set(s.weight_map())
    except Inconclusive:
        indexed = set(table)  # an unreadable index is SNAP-INDEX-1's finding
    quantized = {n: v for n, v in table.items() if dtypes.BY_CODE[v[0]].quantized}
    if not quantized:
        yield Problem(SPEC, "config.json declares quantization_config but no tensor is 8-bit or narrower")
        return
    block = q.get("weight_block_size")
    ok = isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block)
    pair: list[int] | None = block if ok else None  # [bm, bn], when weight_block_size is one
    if block is not None and pair is None:
        yield Problem(
            CONFIG,
            f"quantization_config.weight_block_size is {untrusted.shown(block)}, not a pair of positive integers "
            "[bm, bn], so no scale shape can be checked",
        )
    for name, (_, shape) in sorted(quantized.items()):
        scale = next((name + sfx for sfx in ("_scale_inv", "_scale") if name + sfx in table), None)
        if scale is None:
            yield Problem(SPEC, f"{name} is quantized but has no {name}_scale_inv (or _scale) tensor")
            continue
        if scale not in indexed:
            yield Problem(INDEX, f"{scale} is in the spec but not in weight_map")
        if pair is not None and len(shape) >= 2:
            bm, bn = pair
            want = [*shape[:-2], -(-shape[-2] // bm), -(-shape[-1] // bn)]
            got = list(table[scale][1])
            if got != want:
                yield Problem(SPEC, f"{scale} has shape {got}; weight_block_size {block} on {list(shape)} needs {want}")


@check("SNAP-QUANT-2", WEIGHTS)
def _quantized_only_when_declared(s: Subject) -> Iterator[Problem]:
    if s.quantization_config() is not None:
        raise NotApplicable("config.json declares quantization_config")
    quantized = sorted(n for n, (dt, _) in s.tensors.items() if dtypes.BY_CODE[dt].quantized)
    if quantized:
        dts = sorted({s.tensors[n][0] for n in quantized})
        yield Problem(None, f"{names(quantized)} are {'/'.join(dts)}, but config.json declares no quantization_config")
