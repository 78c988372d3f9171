"""fireworks-delta-compression and the project codec read each other's ARC2 diffs."""

import shutil

from pytest_rlrollout.snapshot import build, tiny_moe
from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot.validate import validate

from ..support import LazyModule
from ..support import thread_pool as _pool

fdc = LazyModule("fireworks_delta_compression.compression")


def test_their_diffs_decode_with_our_codec(reference, tmp_path):
    target = reference["full"].snapshot
    diff = tmp_path / "their-diff"
    fdc.delta_compress_dirs(str(reference.base), str(target), str(diff), "arc_v2", executor=_pool())
    signal = build.incremental_signal(diff.name, tiny_moe.BASE_IDENTITY)
    report = validate(diff, base=reference.base, parent=reference.base, signal=signal)
    assert [str(f) for f in report.findings] == [] and report.verdicts["SNAP-INC-3"].outcome == "pass"
    out = build.apply_incremental(reference.base, diff, tmp_path / "applied")
    for shard in target.glob("*.safetensors"):
        assert (out / shard.name).read_bytes() == shard.read_bytes()


def test_our_diffs_decode_with_their_codec(reference, tmp_path):
    target = reference["full"].snapshot
    build.make_incremental(reference.base, target, tmp_path / "our-diff")
    for shard in target.glob("*.safetensors"):
        base_copy = tmp_path / shard.name
        shutil.copyfile(reference.base / shard.name, base_copy)
        fdc.delta_decompress_inplace(
            base_path=str(base_copy), diff_path=str(tmp_path / "our-diff" / shard.name), compression_format="arc_v2"
        )
        assert base_copy.read_bytes() == shard.read_bytes()


def test_one_corrupted_byte_in_their_diff_is_snap_inc_3(reference, tmp_path):
    diff = tmp_path / "their-diff"
    fdc.delta_compress_dirs(str(reference.base), str(reference["full"].snapshot), str(diff), "arc_v2", executor=_pool())
    shard = sorted(diff.glob("*.safetensors"))[1]
    h = st.read_header(shard)
    name, info = max(h.tensors.items(), key=lambda kv: kv[1].nbytes)
    data = bytearray(shard.read_bytes())
    data[info.start + info.nbytes // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    signal = build.incremental_signal(diff.name, tiny_moe.BASE_IDENTITY)
    findings = validate(diff, base=reference.base, parent=reference.base, signal=signal).findings
    assert [f.clause for f in findings] == ["SNAP-INC-3"]
    assert name in findings[0].message and findings[0].file == shard.name
