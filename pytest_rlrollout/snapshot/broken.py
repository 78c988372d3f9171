"""For every SNAP clause, a deliberately broken variant of a valid reference case.

Each breaker copies a valid case (`cases.py`) and introduces one realistic defect of exactly
one clause; the project's tests prove the validator reports that clause and no other, and the
hot-load tests use the same variants to prove a deployment refuses them.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pytest_rlrollout.snapshot import build, tiny_moe
from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot.cases import Case, ReferenceCases
from pytest_rlrollout.snapshot.layout import ADAPTER_CONFIG, CONFIG, INDEX, SPEC

# --------------------------------------------------------------------------- editing helpers


def _copy(case: Case, dst: Path) -> Case:
    """The case under `dst`, its files hard-linked (a variant of a production-sized snapshot
    writes only what it breaks): every edit below replaces a file, or owns it first."""
    shutil.copytree(case.snapshot, dst, symlinks=True, copy_function=build.link_or_copy)
    return replace(case, snapshot=dst)


def _own(path: Path) -> Path:
    """`path` as a file of its own, for an edit in place (a link shares its bytes with the case's)."""
    tmp = path.with_name(f"{path.name}.own")
    shutil.copyfile(path, tmp)
    os.replace(tmp, path)
    return path


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.new")
    tmp.write_text(text)
    os.replace(tmp, path)


def _edit_json(path: Path, edit: Callable[[Any], object]) -> None:
    doc = json.loads(path.read_text())
    edit(doc)  # edits in place; whatever it returns is ignored
    _write_text(path, json.dumps(doc, indent=2) + "\n")


def _file_of(snapshot: Path, tensor_part: str, *, many: bool = False) -> tuple[str, str]:
    """(tensor, file) of the first weight_map tensor containing `tensor_part`."""
    wm = json.loads((snapshot / INDEX).read_text())["weight_map"]
    counts: dict[str, int] = {}
    for f in wm.values():
        counts[f] = counts.get(f, 0) + 1
    for t, f in sorted(wm.items()):
        if tensor_part in t and (not many or counts[f] > 2):
            return t, f
    raise LookupError(tensor_part)


def _rewrite(snapshot: Path, file: str, edit: Callable[[dict[str, st.Tensor]], object]) -> None:
    """Load a shard, let `edit` change its tensors, write it back with the index and spec in step."""
    header = st.read_header(snapshot / file)
    tensors = st.load_file(snapshot / file)
    before = set(tensors)
    edit(tensors)
    st.write_file(snapshot / file, st.entries_of(tensors), header.metadata)

    def fix_index(doc):
        for gone in before - set(tensors):
            doc["weight_map"].pop(gone, None)
        for new in set(tensors) - before:
            doc["weight_map"][new] = file

    def fix_spec(doc):
        for gone in before - set(tensors):
            doc["tensor_map"].pop(gone, None)
        for name, t in tensors.items():
            doc["tensor_map"][name] = {"shape": list(t.shape), "dtype": t.dtype}

    _edit_json(snapshot / INDEX, fix_index)
    _edit_json(snapshot / SPEC, fix_spec)


# --------------------------------------------------------------------------- the breakers


@dataclass(frozen=True)
class Breaker:
    clause: str
    start: str  # which valid case it breaks: full, incremental, lora, quantized
    what: str
    fn: Callable[[Case, Path], Case]


BREAKERS: dict[str, Breaker] = {}


def breaker(clause: str, start: str, what: str):
    def register(fn: Callable[[Case, Path], Case]):
        BREAKERS[clause] = Breaker(clause, start, what, fn)
        return fn

    return register


def broken_case(clause: str, cases: ReferenceCases, dst: str | os.PathLike[str]) -> Case:
    """The broken variant of `clause`, built under `dst` (a new directory)."""
    b = BREAKERS[clause]
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    return b.fn(cases[b.start], dst / "snapshot")


@breaker("SNAP-ID-1", "full", "the signal names the identity '../escape'")
def _(case: Case, dst: Path) -> Case:
    return replace(_copy(case, dst), signal={"identity": "../escape"})


@breaker("SNAP-SAFETENSORS-1", "full", "a shard is cut short by 3 bytes")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    _, file = _file_of(dst, "layers.1.")
    path = _own(dst / file)
    os.truncate(path, path.stat().st_size - 3)
    return case


@breaker("SNAP-CONFIG-1", "full", "config.json is not valid JSON")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    _write_text(dst / CONFIG, '{"model_type": "qwen3_moe", ')
    return case


@breaker("SNAP-CONFIG-2", "full", "config.json changes rms_norm_eps")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    _edit_json(dst / CONFIG, lambda c: c.update(rms_norm_eps=1e-5))
    return case


@breaker("SNAP-INDEX-1", "full", "model.safetensors.index.json is missing")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    (dst / INDEX).unlink()
    return case


@breaker("SNAP-INDEX-2", "full", "layers 1 and 2 share one shard (as save_pretrained's size-based split does)")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    _, f1 = _file_of(dst, "layers.1.")
    _, f2 = _file_of(dst, "layers.2.")
    moved = st.load_file(dst / f2)
    _rewrite(dst, f1, lambda ts: ts.update(moved))
    (dst / f2).unlink()
    return case


@breaker("SNAP-INDEX-3", "full", "weight_map puts a tensor in a shard that does not hold it")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    tensor, _ = _file_of(dst, "layers.1.self_attn.q_proj", many=True)
    _, other = _file_of(dst, "layers.2.")
    _edit_json(dst / INDEX, lambda d: d["weight_map"].update({tensor: other}))
    return case


@breaker("SNAP-INDEX-3a", "full", "a stray shard no weight_map entry references")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    st.write_file(
        dst / "model-stray.safetensors", st.entries_of({"stray.weight": st.Tensor.of(np.zeros(4, np.float32))})
    )
    return case


@breaker("SNAP-SPEC-1", "full", "tensor_map leaves one weight out")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    tensor, _ = _file_of(dst, "layers.0.self_attn.k_proj")
    _edit_json(dst / SPEC, lambda d: d["tensor_map"].pop(tensor))
    return case


@breaker("SNAP-SPEC-2", "full", "the spec gives one tensor the wrong dtype")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    tensor, _ = _file_of(dst, "layers.0.self_attn.k_proj")
    _edit_json(dst / SPEC, lambda d: d["tensor_map"][tensor].update(dtype="float32"))
    return case


@breaker("SNAP-COVER-1", "full", "q_proj of layer 1 is a tensor-parallel half")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    tensor, file = _file_of(dst, "layers.1.self_attn.q_proj")

    def halve(ts: dict[str, st.Tensor]) -> None:
        t = ts[tensor]
        rows = t.shape[0] // 2
        ts[tensor] = st.Tensor(t.dtype, (rows, *t.shape[1:]), np.ascontiguousarray(t.data[:rows]))

    _rewrite(dst, file, halve)
    return case


@breaker("SNAP-SIZE-1", "full", "a 5 GiB + 8 byte shard (sparse, no disk used), without a base to compare")
def _(case: Case, dst: Path) -> Case:
    case = replace(_copy(case, dst), base=None)
    name, n = "model-huge.safetensors", 5 * 1024**3 + 8
    raw, _ = st.header_bytes([st.Entry("model.layers.0.huge.weight", "U8", (n,), st.Tensor.of(np.zeros(0, np.uint8)))])
    with open(dst / name, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + n)
    _edit_json(dst / INDEX, lambda d: d["weight_map"].update({"model.layers.0.huge.weight": name}))
    _edit_json(
        dst / SPEC, lambda d: d["tensor_map"].update({"model.layers.0.huge.weight": {"shape": [n], "dtype": "U8"}})
    )
    return case


@breaker("SNAP-TOK-1", "full", "tokenizer.json is missing")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    (dst / "tokenizer.json").unlink()
    return case


@breaker("SNAP-TOK-1a", "full", "tokenizer_config.json differs from the base's")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    _edit_json(dst / "tokenizer_config.json", lambda d: d.update(model_max_length=4096))
    return case


@breaker("SNAP-QUANT-1", "quantized", "one FP8 weight lost its weight_scale_inv")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    scale, file = _file_of(dst, "experts.3.up_proj.weight_scale_inv")
    _rewrite(dst, file, lambda ts: ts.pop(scale))
    return case


@breaker("SNAP-QUANT-2", "quantized", "FP8 tensors without quantization_config in config.json")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    _edit_json(dst / CONFIG, lambda c: c.pop("quantization_config"))
    return case


@breaker("SNAP-INC-1", "incremental", "one diff file of the parent's layout is missing")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    _, file = _file_of(dst, "layers.2.")
    (dst / file).unlink()
    return case


@breaker("SNAP-INC-2", "incremental", "the diff's spec changes a dtype (a recipe change along the chain)")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    tensor, _ = _file_of(dst, "layers.0.self_attn.q_proj")
    _edit_json(dst / SPEC, lambda d: d["tensor_map"][tensor].update(dtype="F32"))
    return case


@breaker("SNAP-INC-3", "incremental", "one byte of one ARC2 payload is flipped")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    tensor, file = _file_of(dst, "layers.1.self_attn.o_proj")
    info = st.read_header(dst / file).tensors[tensor]
    with open(_own(dst / file), "r+b") as f:
        at = info.start + info.nbytes // 2
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))
    return case


@breaker("SNAP-INC-4", "incremental", "the signal says checksum_format 'crc32'")
def _(case: Case, dst: Path) -> Case:
    signal = json.loads(json.dumps(case.signal))
    signal["incremental_snapshot_metadata"]["checksum_format"] = "crc32"
    return replace(_copy(case, dst), signal=signal)


@breaker("SNAP-INC-5", "incremental", "previous_snapshot_identity names a snapshot that is not served")
def _(case: Case, dst: Path) -> Case:
    signal = json.loads(json.dumps(case.signal))
    signal["incremental_snapshot_metadata"]["previous_snapshot_identity"] = "step-0"
    return replace(_copy(case, dst), signal=signal)


@breaker("SNAP-INC-6", "lora", "a LoRA adapter signalled with incremental metadata")
def _(case: Case, dst: Path) -> Case:
    previous = case.base.name if case.base is not None else tiny_moe.BASE_IDENTITY
    return replace(_copy(case, dst), signal=build.incremental_signal(dst.name, previous))


@breaker("SNAP-INC-7", "incremental", "an incremental signal right after a ledger reset")
def _(case: Case, dst: Path) -> Case:
    return replace(_copy(case, dst), ledger_reset=True)


@breaker("SNAP-LORA-1", "lora", "adapter weights without adapter_config.json")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    (dst / ADAPTER_CONFIG).unlink()
    return case


@breaker("SNAP-LORA-2", "lora", "adapter_config.json without adapter weights")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    (dst / "adapter_model.safetensors").unlink()
    return case


@breaker("SNAP-LORA-3", "lora", "adapter_config.json names another base model")
def _(case: Case, dst: Path) -> Case:
    case = _copy(case, dst)
    _edit_json(dst / ADAPTER_CONFIG, lambda c: c.update(base_model_name_or_path="accounts/other/models/llama"))
    return case


def diffs_the_base(case: Case, cases: ReferenceCases) -> bool:
    """Whether the variant is an ARC2 diff against the base itself: signalled, it must diff a
    served snapshot that holds exactly the base (the suite swaps to a copy of the base first)."""
    return "incremental_snapshot_metadata" in (case.signal or {}) and case.parent == cases.base
