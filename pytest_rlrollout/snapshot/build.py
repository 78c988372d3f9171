"""Building hot-load snapshots: from tensors, from a Hugging Face checkpoint, as ARC2 diffs,
as LoRA adapters and FP8-quantized. Every writer produces the layout the validator accepts:
one layer per shard (under a size cap), an index, a spec, config and tokenizer files."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pytest_rlrollout.snapshot import arc2, dtypes
from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot.layout import ADAPTER_CONFIG, CONFIG, INDEX, SPEC, SnapshotDir, layer_of

MAX_SHARD_BYTES = 5 * 1024**3
_NOT_CARRIED = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".partial")


class SnapshotError(ValueError):
    """A snapshot that cannot be built; the message names the problem."""


def _empty_destination(dst: Path) -> None:
    if dst.exists() and any(dst.iterdir()):
        raise SnapshotError(f"{dst} exists and is not empty; refusing to overwrite it")
    dst.mkdir(parents=True, exist_ok=True)


def plan_shards(entries: list[st.Entry], max_bytes: int = MAX_SHARD_BYTES) -> list[list[st.Entry]]:
    """Group tensors one layer per shard (non-layer tensors together), splitting a group only
    when it exceeds `max_bytes`; layers ascending, the non-layer group last."""
    groups: dict[int | None, list[st.Entry]] = defaultdict(list)
    for e in entries:
        groups[layer_of(e.name)].append(e)
    order = sorted(k for k in groups if k is not None) + ([None] if None in groups else [])
    shards: list[list[st.Entry]] = []
    for key in order:
        current: list[st.Entry] = []
        size = 0
        for e in sorted(groups[key], key=lambda e: e.name):
            n = dtypes.nbytes(e.dtype, e.shape)
            if current and size + n > max_bytes:
                shards.append(current)
                current, size = [], 0
            current.append(e)
            size += n
        if current:
            shards.append(current)
    return shards


def write_layout(
    dst: Path,
    entries: list[st.Entry],
    *,
    max_bytes: int = MAX_SHARD_BYTES,
    metadata: Mapping[str, str] | None = None,
    fill: Callable[[st.Entry], st.Entry] | None = None,
) -> None:
    """Write shards, index and spec for `entries` into `dst`. With `fill`, an entry is made
    whole (its data computed) just before its shard is written: one shard's data in memory."""
    shards = plan_shards(entries, max_bytes)
    weight_map: dict[str, str] = {}
    tensor_map: dict[str, dict[str, Any]] = {}
    total = 0
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        st.write_file(
            dst / name,
            shard if fill is None else [fill(e) for e in shard],
            metadata if metadata is not None else {"format": "pt"},
        )
        for e in shard:
            weight_map[e.name] = name
            tensor_map[e.name] = {"shape": list(e.shape), "dtype": e.dtype}
            total += dtypes.nbytes(e.dtype, e.shape)
    _write_json(dst / INDEX, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    _write_json(dst / SPEC, {"tensor_map": dict(sorted(tensor_map.items()))})


def _write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=2) + "\n")


def as_tensor(value: Any) -> st.Tensor:
    """A Tensor from a Tensor, a numpy array or a torch tensor (bf16 and fp8 kept bit-exact)."""
    if isinstance(value, st.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return st.Tensor.of(value)
    torch_dtype = str(getattr(value, "dtype", ""))
    if torch_dtype.startswith("torch."):  # duck-typed so torch stays optional
        import torch

        code = dtypes.normalise(torch_dtype)
        if code is None or dtypes.BY_CODE[code].numpy is None:
            raise SnapshotError(f"cannot store a {torch_dtype} tensor")
        t = value.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().view(dtypes.BY_CODE[code].numpy)
        return st.Tensor(code, tuple(t.shape), raw.reshape(tuple(t.shape)).copy())
    raise SnapshotError(f"cannot store a {type(value).__name__} as a tensor")


def write_snapshot(
    dst: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    config: Mapping[str, Any],
    files: Mapping[str, bytes] | None = None,
    *,
    max_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """A full snapshot from a state dict (Tensors, numpy arrays or torch tensors), a config and
    extra files (tokenizer, ...)."""
    dst = Path(dst)
    converted = {name: as_tensor(value) for name, value in tensors.items()}
    _empty_destination(dst)
    write_layout(dst, st.entries_of(converted), max_bytes=max_bytes)
    _write_json(dst / CONFIG, dict(config))
    for name, data in (files or {}).items():
        (dst / name).write_bytes(data)
    return dst


def carried_names(src: Path, *, skip: tuple[str, ...] = ()) -> list[str]:
    """The config, tokenizer and other small files of `src` a derived snapshot carries over
    (not weights, index or spec)."""
    return [
        entry.name
        for entry in sorted(src.iterdir())
        if entry.is_file()
        and not entry.name.startswith(".")
        and not entry.name.endswith(_NOT_CARRIED)
        and entry.name not in (INDEX, SPEC, *skip)
        and not entry.name.endswith(".index.json")
    ]


def carry_files(src: Path, dst: Path, *, skip: tuple[str, ...] = ()) -> list[str]:
    """Copy config, tokenizer and other small files (not weights, index or spec) from src to dst."""
    carried = carried_names(src, skip=skip)
    for name in carried:
        shutil.copyfile(src / name, dst / name)
    return carried


def checkpoint_entries(src: str | os.PathLike[str]) -> list[st.Entry]:
    """The tensors of a Hugging Face checkpoint directory (sharded or single-file safetensors),
    as file ranges: nothing is loaded into memory."""
    src = Path(src)
    files = sorted(p for p in src.glob("*.safetensors"))
    if not files:
        bins = sorted(p.name for p in src.glob("*.bin"))
        hint = f" (found {', '.join(bins)}: convert pickled checkpoints to safetensors first)" if bins else ""
        raise SnapshotError(f"{src} holds no *.safetensors files{hint}")
    entries: dict[str, st.Entry] = {}
    for path in files:
        try:
            header = st.read_header(path)
        except st.HeaderError as e:
            raise SnapshotError(f"{path.name}: {e}") from None
        for name, t in header.tensors.items():
            if name in entries:
                raise SnapshotError(f"tensor {name} is stored twice ({path.name} and another file)")
            entries[name] = st.Entry(name, t.dtype, t.shape, st.FileRange(path, t.start, t.end))
    return list(entries.values())


def weight_map(src: str | os.PathLike[str]) -> dict[str, str]:
    """Tensor name -> the file holding it: the index's weight_map, or, in a checkpoint without
    an index (a small model's single model.safetensors, as `save_pretrained` writes it), read
    from the safetensors headers."""
    src = Path(src)
    if (src / INDEX).is_file():
        return dict(json.loads((src / INDEX).read_text())["weight_map"])
    return {e.name: e.source.path.name for e in checkpoint_entries(src)}  # type: ignore[union-attr]


def tensor_map(src: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """What model.weight.spec.json says of every tensor (shape and dtype): the spec's
    tensor_map, or, in a checkpoint without one, what the safetensors headers say."""
    src = Path(src)
    if (src / SPEC).is_file():
        return dict(json.loads((src / SPEC).read_text())["tensor_map"])
    return {e.name: {"shape": list(e.shape), "dtype": e.dtype} for e in checkpoint_entries(src)}


def layout_problem(src: str | os.PathLike[str]) -> str | None:
    """Why `src` is not in the hot-load layout (index, spec, one layer per shard), or None."""
    src = Path(src)
    missing = [name for name in (INDEX, SPEC) if not (src / name).is_file()]
    if missing:
        return f"it has no {' and no '.join(missing)}"
    groups: dict[str, set[int | None]] = defaultdict(set)
    for name, file in weight_map(src).items():
        groups[file].add(layer_of(name))
    mixed = sorted(file for file, layers in groups.items() if len(layers) > 1)
    return f"{mixed[0]} holds tensors of {len(groups[mixed[0]])} layers (one layer per shard)" if mixed else None


def export_checkpoint(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], *, max_bytes: int = MAX_SHARD_BYTES
) -> Path:
    """Re-lay a Hugging Face checkpoint (e.g. `save_pretrained` output) as a hot-load snapshot:
    one layer per shard, index, spec, and the config/tokenizer files carried over. Streams
    tensor bytes file to file; `src` is only read."""
    src, dst = Path(src), Path(dst)
    if not (src / CONFIG).is_file():
        raise SnapshotError(f"{src} has no config.json")
    entries = checkpoint_entries(src)
    _empty_destination(dst)
    write_layout(dst, entries, max_bytes=max_bytes)
    carry_files(src, dst)
    return dst


def read_snapshot(src: str | os.PathLike[str]) -> dict[str, st.Tensor]:
    """All tensors of a snapshot (or checkpoint) directory, loaded into memory."""
    return {e.name: read_entry(e) for e in checkpoint_entries(src)}


def read_entry(e: st.Entry) -> st.Tensor:
    """The tensor a `checkpoint_entries` entry's file range holds, loaded into memory."""
    assert isinstance(e.source, st.FileRange)
    return st.read_tensor(st.TensorInfo(e.dtype, e.shape, e.source.start, e.source.end), e.source.path)


# --------------------------------------------------------------------------- derived snapshots


def derive(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    change: Mapping[str, st.Tensor],
    *,
    config: Mapping[str, Any] | None = None,
    link: bool = False,
) -> Path:
    """A full snapshot equal to `src` except for the tensors in `change` (same layout, same file
    names), so it can serve as the target of an incremental diff. With `link`, a shard holding
    none of `change` is a hard link to `src`'s (a copy where the filesystem cannot link): write
    nothing to such a shard in place."""
    src, dst = Path(src), Path(dst)
    _empty_destination(dst)
    files = weight_map(src)
    by_file: dict[str, list[str]] = defaultdict(list)
    for name, file in files.items():
        by_file[file].append(name)
    unknown = set(change) - set(files)
    if unknown:
        raise SnapshotError(f"cannot change tensors the snapshot does not have: {sorted(unknown)[:5]}")
    for file, names in by_file.items():
        if link and not change.keys() & set(names):
            link_or_copy(src / file, dst / file)
        else:
            derive_file(src / file, dst / file, change)
    for name in (INDEX, SPEC):  # a checkpoint as `save_pretrained` writes it may have neither
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    carry_files(src, dst)
    if config is not None:
        _write_json(dst / CONFIG, dict(config))
    return dst


def link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """`dst` as a hard link to `src`, or a copy of it across filesystems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def derive_file(src: Path, dst: Path, change: Mapping[str, st.Tensor]) -> int:
    """Shard `src` with the tensors it holds of `change` replaced (same tensors, order and
    metadata), written to `dst`; returns its size."""
    header = st.read_header(src)
    entries = []
    for name, t in header.tensors.items():
        new = change.get(name)
        if new is None:
            entries.append(st.Entry(name, t.dtype, t.shape, st.FileRange(src, t.start, t.end)))
        elif (new.dtype, new.shape) != (t.dtype, t.shape):
            raise SnapshotError(f"{name}: {new.dtype}{list(new.shape)} would change {t.dtype}{list(t.shape)}")
        else:
            entries.append(st.Entry(name, t.dtype, t.shape, new))
    st.write_file(dst, entries, header.metadata)
    return dst.stat().st_size


def derived_size(src: Path) -> int:
    """The size of the shard `derive_file` writes from `src`, whatever it changes (the same
    tensors, dtypes and shapes), without writing it: what a plan counts."""
    header = st.read_header(src)
    entries = [st.Entry(n, t.dtype, t.shape, st.FileRange(src, t.start, t.end)) for n, t in header.tensors.items()]
    raw, ordered = st.header_bytes(entries, header.metadata)
    return 8 + len(raw) + sum(dtypes.nbytes(e.dtype, e.shape) for e in ordered)


def perturbed(
    src: str | os.PathLike[str], *, seed: int, scale: float = 1e-2, only: str | None = None
) -> dict[str, st.Tensor]:
    """Training-step-like updates: every floating tensor (or those whose name contains `only`)
    plus Gaussian noise of relative size `scale`."""
    rng = np.random.default_rng(seed)
    out = {}
    for e in checkpoint_entries(src):  # only the tensors changed are read
        if e.dtype not in ("BF16", "F32", "F16") or (only is not None and only not in e.name):
            continue
        name, t = e.name, read_entry(e)
        x = t.float32()
        x = x + rng.standard_normal(x.shape, dtype=np.float32) * (scale * float(np.abs(x).mean() or 1.0))
        out[name] = st.Tensor.bf16(x) if t.dtype == "BF16" else st.Tensor(t.dtype, t.shape, x.astype(t.data.dtype))
    return out


def incremental_signal(identity: str, previous: str) -> dict[str, Any]:
    """The hot-load request body announcing an ARC2 diff (the official SDK's defaults)."""
    return {
        "identity": identity,
        "incremental_snapshot_metadata": {
            "previous_snapshot_identity": previous,
            "compression_format": "arc_v2",
            "checksum_format": "alder32",
        },
    }


def make_incremental(
    parent: str | os.PathLike[str],
    target: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    threads: int | None = None,
) -> dict[str, Any]:
    """Write the ARC2 diff from `parent` to `target` into `out` and return the signal body.

    Refuses targets whose layout differs from the parent's (SNAP-INC-1/2): a diff can only
    change tensor contents. Non-weight files come from the *target* (the new config and
    tokenizer), unlike fireworks-delta-compression's `delta_compress_dirs`, which copies the old
    tree's.
    """
    parent, target, out = Path(parent), Path(target), Path(out)
    pindex, tindex = (json.loads((d / INDEX).read_text()) for d in (parent, target))
    if pindex["weight_map"] != tindex["weight_map"]:
        moved = sorted(
            k
            for k in set(pindex["weight_map"]) | set(tindex["weight_map"])
            if pindex["weight_map"].get(k) != tindex["weight_map"].get(k)
        )
        raise SnapshotError(f"SNAP-INC-1: the target's weight_map differs from the parent's for {moved[:5]}")
    files = sorted(set(pindex["weight_map"].values()))
    for file in files:
        ph, th = st.read_header(parent / file), st.read_header(target / file)
        for name, t in th.tensors.items():
            p = ph.tensors.get(name)
            if p is None or (p.dtype, p.shape) != (t.dtype, t.shape):
                was = f"{p.dtype}{list(p.shape)}" if p else "absent"
                raise SnapshotError(
                    f"SNAP-INC-2: {name} is {t.dtype}{list(t.shape)} in the target, {was} in the parent"
                )
    _empty_destination(out)
    try:
        for file in files:
            arc2.encode_file(parent / file, target / file, out / file, threads=threads)
        shutil.copyfile(target / INDEX, out / INDEX)
        shutil.copyfile(target / SPEC, out / SPEC)
        carry_files(target, out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return incremental_signal(out.name, parent.name)


def apply_incremental(
    parent: str | os.PathLike[str],
    diff: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    threads: int | None = None,
) -> Path:
    """Materialise the full snapshot a diff describes (what a deployment does on load)."""
    parent, diff, out = Path(parent), Path(diff), Path(out)
    _empty_destination(out)
    files = sorted(p.name for p in diff.glob("*.safetensors"))
    try:
        arc2.apply_files([arc2.FilePlan(f, parent / f, diff / f, out / f) for f in files], threads=threads)
        for name in (INDEX, SPEC):
            shutil.copyfile(diff / name if (diff / name).exists() else parent / name, out / name)
        carry_files(parent, out)
        carry_files(diff, out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out


# --------------------------------------------------------------------------- LoRA


def lora_snapshot(
    adapter: str | os.PathLike[str], dst: str | os.PathLike[str], *, base_model: str | None = None
) -> Path:
    """Lay out a PEFT adapter directory (`save_pretrained` output) as a LoRA snapshot, naming the
    base model the deployment serves when `base_model` is given."""
    adapter, dst = Path(adapter), Path(dst)
    if not (adapter / ADAPTER_CONFIG).is_file():
        raise SnapshotError(f"{adapter} has no adapter_config.json")
    weights = SnapshotDir(adapter).adapter_weight_files
    safetensors = [w for w in weights if w.endswith(".safetensors")]
    if not safetensors:
        raise SnapshotError(f"{adapter} has no adapter_model*.safetensors (pickled .bin adapters are not converted)")
    _empty_destination(dst)
    cfg = json.loads((adapter / ADAPTER_CONFIG).read_text())
    if base_model is not None:
        cfg["base_model_name_or_path"] = base_model
    _write_json(dst / ADAPTER_CONFIG, cfg)
    for name in safetensors:
        shutil.copyfile(adapter / name, dst / name)
    return dst


def make_lora(
    base: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    base_model: str,
    rank: int = 4,
    alpha: int = 8,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    seed: int = 0,
) -> Path:
    """A LoRA adapter for `base` in PEFT's on-disk layout, with non-zero A and B so it changes
    outputs (numpy only; the interop tests use peft itself)."""
    base, dst = Path(base), Path(dst)
    rng = np.random.default_rng(seed)
    spec = tensor_map(base)
    tensors = {}
    for name, entry in sorted(spec.items()):
        module = name.removesuffix(".weight")
        if not name.endswith(".weight") or module.rsplit(".", 1)[-1] not in targets:
            continue
        out_f, in_f = entry["shape"]
        a = rng.standard_normal((rank, in_f), dtype=np.float32) / math.sqrt(in_f)
        b = rng.standard_normal((out_f, rank), dtype=np.float32) * 0.05
        tensors[f"base_model.model.{module}.lora_A.weight"] = st.Tensor.of(a)
        tensors[f"base_model.model.{module}.lora_B.weight"] = st.Tensor.of(b)
    if not tensors:
        raise SnapshotError(f"no base tensor matches target modules {targets}")
    _empty_destination(dst)
    st.write_file(dst / "adapter_model.safetensors", st.entries_of(tensors), {"format": "pt"})
    cfg = {
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "peft_type": "LORA",
        "r": rank,
        "target_modules": sorted(targets),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }
    _write_json(dst / ADAPTER_CONFIG, cfg)
    return dst


# --------------------------------------------------------------------------- FP8


EXPERT_WEIGHT = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
QUANTIZATION_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}


def quantize_fp8(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Pre-quantize routed expert weights to FP8 E4M3 with 128x128 block scales, in the
    `mxfp8_bw128` layout fireworks-prequant writes (`<name>_scale_inv` = dequant multiplier).
    Only one output shard's tensors are in memory at a time."""
    from pytest_rlrollout.snapshot import fp8

    src, dst = Path(src), Path(dst)
    sources = {e.name: e for e in checkpoint_entries(src)}
    planned: list[st.Entry] = []
    of: dict[str, str] = {}  # an FP8 weight or its scale -> the base's weight it quantizes
    for e in sources.values():
        if ".mlp.experts." in e.name and e.name.endswith(EXPERT_WEIGHT) and len(e.shape) == 2:
            planned += [
                st.Entry(e.name, "F8_E4M3", e.shape, e.source),
                st.Entry(f"{e.name}_scale_inv", "F32", fp8.scale_shape(e.shape), e.source),
            ]
            of[e.name] = of[f"{e.name}_scale_inv"] = e.name
        else:
            planned.append(e)

    @functools.lru_cache(maxsize=1)  # a weight's codes and its scale are written one after the other
    def quantized(name: str) -> tuple[np.ndarray, np.ndarray]:
        return fp8.quantize_blockwise(read_entry(sources[name]).float32())

    def fill(e: st.Entry) -> st.Entry:
        if e.name not in of:
            return e
        codes, scale = quantized(of[e.name])
        return st.Entry(
            e.name,
            e.dtype,
            e.shape,
            st.Tensor("F8_E4M3", e.shape, codes) if e.name == of[e.name] else st.Tensor.of(scale),
        )

    cfg = json.loads((src / CONFIG).read_text())
    cfg["quantization_config"] = dict(QUANTIZATION_CONFIG)
    _empty_destination(dst)
    write_layout(dst, planned, fill=fill)
    carry_files(src, dst)
    _write_json(dst / CONFIG, cfg)
    return dst
