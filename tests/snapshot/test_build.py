import json

import numpy as np
import pytest

from pytest_rlrollout.snapshot import build, fp8, tiny_moe
from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot.layout import layer_of
from pytest_rlrollout.snapshot.validate import validate

from ..support import tree_hash


def hf_like_checkpoint(tmp_path, reference, shard_bytes=60_000):
    """A save_pretrained-style checkpoint: greedy size-based shards that mix layers."""
    src = tmp_path / "hf"
    src.mkdir()
    tensors = build.read_snapshot(reference.base)
    shards, current, size = [], {}, 0
    for name in sorted(tensors):
        if current and size + tensors[name].nbytes > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensors[name]
        size += tensors[name].nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        st.write_file(src / fname, st.entries_of(shard), {"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (src / name).write_bytes((reference.base / name).read_bytes())
    return src


def test_export_turns_a_mixed_checkpoint_into_a_valid_snapshot(reference, tmp_path):
    src = hf_like_checkpoint(tmp_path, reference)
    before = tree_hash(src)
    mixed = validate(src, base=reference.base)
    assert {f.clause for f in mixed.findings} == {"SNAP-INDEX-2", "SNAP-SPEC-1"}  # no spec yet, mixed shards
    out = build.export_checkpoint(src, tmp_path / "out")
    assert tree_hash(src) == before
    assert validate(out, base=reference.base).findings == []
    assert build.read_snapshot(out).keys() == build.read_snapshot(src).keys()
    for name, t in build.read_snapshot(out).items():
        assert np.array_equal(t.data, build.read_snapshot(src)[name].data)


def test_size_cap_splits_a_layer_but_never_mixes_layers(reference, tmp_path):
    out = build.export_checkpoint(reference.base, tmp_path / "out", max_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    groups: dict[str, set] = {}
    for tensor, file in index.items():
        groups.setdefault(file, set()).add(layer_of(tensor))
    assert all(len(g) == 1 for g in groups.values())
    assert len(groups) > 10
    assert validate(out, base=reference.base).findings == []


def test_export_refuses_bad_sources_and_non_empty_destinations(reference, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(build.SnapshotError, match=r"no config\.json"):
        build.export_checkpoint(tmp_path / "empty", tmp_path / "o1")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text("{}")
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(build.SnapshotError, match=r"pytorch_model\.bin"):
        build.export_checkpoint(tmp_path / "bin", tmp_path / "o2")
    with pytest.raises(build.SnapshotError, match="not empty"):
        build.export_checkpoint(reference.base, reference["full"].snapshot)


def test_incremental_round_trip_reproduces_the_target(reference, tmp_path):
    target = reference["full"].snapshot
    signal = build.make_incremental(reference.base, target, tmp_path / "diff")
    assert signal["incremental_snapshot_metadata"]["previous_snapshot_identity"] == tiny_moe.BASE_IDENTITY
    out = build.apply_incremental(reference.base, tmp_path / "diff", tmp_path / "applied")
    for shard in target.glob("*.safetensors"):
        assert (out / shard.name).read_bytes() == shard.read_bytes()
    diff_size = sum(p.stat().st_size for p in (tmp_path / "diff").glob("*.safetensors"))
    full_size = sum(p.stat().st_size for p in target.glob("*.safetensors"))
    assert diff_size < full_size


def test_sentinel_diff_is_tiny(reference, tmp_path):
    change = build.perturbed(reference.base, seed=5, only="layers.1.self_attn.q_norm")
    target = build.derive(reference.base, tmp_path / "t", change)
    build.make_incremental(reference.base, target, tmp_path / "d")
    diff_size = sum(p.stat().st_size for p in (tmp_path / "d").glob("*.safetensors"))
    full_size = sum(p.stat().st_size for p in target.glob("*.safetensors"))
    assert diff_size < 0.05 * full_size


def test_incremental_refuses_a_layout_change(reference, tmp_path):
    other = build.export_checkpoint(reference.base, tmp_path / "other", max_bytes=20_000)
    with pytest.raises(build.SnapshotError, match="SNAP-INC-1"):
        build.make_incremental(reference.base, other, tmp_path / "d")
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


def test_incremental_carries_the_new_config_not_the_old(reference, tmp_path):
    cfg = json.loads((reference.base / "config.json").read_text())
    cfg["note"] = "new"
    target = build.derive(reference.base, tmp_path / "t", {}, config=cfg)
    build.make_incremental(reference.base, target, tmp_path / "d")
    assert json.loads((tmp_path / "d" / "config.json").read_text())["note"] == "new"


def test_derive_refuses_dtype_changes(reference, tmp_path):
    name = "model.norm.weight"
    with pytest.raises(build.SnapshotError, match="would change"):
        build.derive(reference.base, tmp_path / "t", {name: st.Tensor.of(np.ones(64, np.float32))})


def test_fp8_table_and_quantization_error():
    table = fp8.e4m3_table()
    assert table[0x7E] == 448.0 and table[0x01] == 2.0**-9 and table[0x38] == 1.0 and np.isnan(table[0x7F])
    rng = np.random.default_rng(0)
    w = rng.standard_normal((200, 130)).astype(np.float32)
    codes, scale = fp8.quantize_blockwise(w)
    assert scale.shape == (2, 2)
    back = fp8.dequantize_blockwise(codes, scale)
    assert np.linalg.norm(back - w) / np.linalg.norm(w) < 0.04
    assert np.array_equal(fp8.encode_e4m3(table[:0x7F]), np.arange(0x7F, dtype=np.uint8))


def test_quantized_snapshot_layout(reference):
    q = reference["quantized"].snapshot
    cfg = json.loads((q / "config.json").read_text())
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    spec = json.loads((q / "model.weight.spec.json").read_text())["tensor_map"]
    fp8_names = [n for n, e in spec.items() if e["dtype"] == "F8_E4M3"]
    assert len(fp8_names) == 3 * 8 * 3
    assert all(spec[n + "_scale_inv"] == {"shape": [1, 1], "dtype": "F32"} for n in fp8_names)


def test_lora_snapshot_from_an_adapter_dir(reference, tmp_path):
    adapter = reference["lora"].snapshot
    out = build.lora_snapshot(adapter, tmp_path / "l", base_model="accounts/x/models/y")
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == "accounts/x/models/y"
    (tmp_path / "nobin").mkdir()
    (tmp_path / "nobin" / "adapter_config.json").write_text("{}")
    (tmp_path / "nobin" / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(build.SnapshotError, match="pickled"):
        build.lora_snapshot(tmp_path / "nobin", tmp_path / "l2")
