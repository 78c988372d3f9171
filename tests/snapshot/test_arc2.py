import os
import zlib

import numpy as np
import pytest
import zstandard

from pytest_rlrollout.snapshot import arc2
from pytest_rlrollout.snapshot import safetensors_io as st


def pair(tmp_path, seed=0, shapes=((64, 33), (1000,), (0,), (7, 3, 5))):
    rng = np.random.default_rng(seed)
    parent = {f"t{i}": st.Tensor.bf16(rng.standard_normal(s).astype(np.float32)) for i, s in enumerate(shapes)}
    parent["ids"] = st.Tensor.of(np.arange(10, dtype=np.int64))
    target = {k: st.Tensor.bf16(v.float32() + 0.01) if v.dtype == "BF16" else v for k, v in parent.items()}
    p, t = tmp_path / "parent.safetensors", tmp_path / "target.safetensors"
    st.write_file(p, st.entries_of(parent), {"format": "pt"})
    st.write_file(t, st.entries_of(target), {"format": "pt"})
    return p, t


@pytest.mark.parametrize("threads", [1, 2])
def test_round_trip_is_byte_identical_and_leaves_the_parent_alone(tmp_path, threads):
    p, t = pair(tmp_path)
    before = p.read_bytes()
    arc2.encode_file(p, t, tmp_path / "diff.safetensors", threads=threads)
    arc2.apply_file(p, tmp_path / "diff.safetensors", tmp_path / "out.safetensors", threads=threads)
    assert (tmp_path / "out.safetensors").read_bytes() == t.read_bytes()
    assert p.read_bytes() == before


def test_diff_file_layout(tmp_path):
    p, t = pair(tmp_path)
    arc2.encode_file(p, t, tmp_path / "diff.safetensors")
    h = st.read_header(tmp_path / "diff.safetensors")
    target = st.load_file(t)
    assert set(h.tensors) == set(target)
    for name, info in h.tensors.items():
        assert info.dtype == "U8" and len(info.shape) == 1
        assert h.metadata[name] == str(zlib.adler32(target[name].buffer()))
    payload = st.read_tensor(h.tensors["t0"], tmp_path / "diff.safetensors").data.tobytes()
    assert payload[:4] == arc2.ZSTD_MAGIC
    assert zstandard.frame_content_size(payload) == target["t0"].nbytes
    assert h.metadata["t2"] == "1"  # empty tensor: Adler-32 of nothing


def test_verify_only_reads(tmp_path):
    p, t = pair(tmp_path)
    arc2.encode_file(p, t, tmp_path / "diff.safetensors")
    arc2.verify_file(p, tmp_path / "diff.safetensors")
    assert sorted(x.name for x in tmp_path.iterdir()) == [
        "diff.safetensors",
        "parent.safetensors",
        "target.safetensors",
    ]


def rewrite_payload(path, name, transform, metadata=None):
    h = st.read_header(path)
    tensors = st.load_file(path)
    data = transform(tensors[name].data.tobytes())
    tensors[name] = st.Tensor.of(np.frombuffer(data, np.uint8).copy())
    st.write_file(path, st.entries_of(tensors), metadata if metadata is not None else h.metadata)


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda b: b[:-3], "does not decompress|decoded payload is"),
        (lambda b: b[:5] + bytes([b[5] ^ 0xFF]) + b[6:], "does not decompress|zstd frame declares|Adler-32"),
        (lambda b: b"PK\x03\x04" + b[4:], "not a zstd frame"),
        (lambda b: arc2.ARC3_MAGIC + b, "arc_v3 pickle envelope"),
        (
            lambda b: zstandard.ZstdCompressor().compress(zstandard.ZstdDecompressor().decompress(b) + b"\0"),
            "declares|longer",
        ),
        (
            lambda b: zstandard.ZstdCompressor(write_content_size=False).compress(
                zstandard.ZstdDecompressor().decompress(b)[:-2]
            ),
            "decoded payload is",
        ),
        (lambda b: b + zstandard.ZstdCompressor().compress(b"\x01"), "longer than the parent"),
    ],
)
def test_corrupt_payloads_are_named_and_leave_no_output(tmp_path, corrupt, message):
    p, t = pair(tmp_path)
    diff = tmp_path / "diff.safetensors"
    arc2.encode_file(p, t, diff)
    rewrite_payload(diff, "t0", corrupt)
    with pytest.raises(arc2.DeltaError, match=message) as err:
        arc2.apply_file(p, diff, tmp_path / "out.safetensors")
    assert "t0" in str(err.value)
    assert not (tmp_path / "out.safetensors").exists()
    assert not list(tmp_path.glob("*.partial"))


def test_checksum_mismatch_and_missing_metadata(tmp_path):
    p, t = pair(tmp_path)
    diff = tmp_path / "diff.safetensors"
    arc2.encode_file(p, t, diff)
    meta = dict(st.read_header(diff).metadata)
    meta["t1"] = str((int(meta["t1"]) + 1) % 2**32)
    rewrite_payload(diff, "t1", lambda b: b, meta)
    with pytest.raises(arc2.DeltaError, match="Adler-32 of the result"):
        arc2.verify_file(p, diff)
    del meta["t1"]
    rewrite_payload(diff, "t1", lambda b: b, meta)
    with pytest.raises(arc2.DeltaError, match="no decimal Adler-32"):
        arc2.verify_file(p, diff)


def test_a_different_parent_is_caught(tmp_path):
    p, t = pair(tmp_path)
    arc2.encode_file(p, t, tmp_path / "diff.safetensors")
    (tmp_path / "other").mkdir()
    other, _ = pair(tmp_path / "other", seed=1)
    with pytest.raises(arc2.DeltaError, match="Adler-32"):
        arc2.verify_file(other, tmp_path / "diff.safetensors")


def test_encode_refuses_layout_changes(tmp_path):
    p, _ = pair(tmp_path)
    t = tmp_path / "t2.safetensors"
    st.write_file(t, st.entries_of({"t0": st.Tensor.of(np.zeros((64, 33), np.float32))}))
    with pytest.raises(arc2.DeltaError, match="different tensors"):
        arc2.encode_file(p, t, tmp_path / "d.safetensors")


def test_arc_v1_zlib_payloads_decode(tmp_path):
    p, t = pair(tmp_path)
    parent, target = st.load_file(p), st.load_file(t)
    payloads, meta = {}, {}
    for name in parent:
        x = np.bitwise_xor(
            np.frombuffer(parent[name].buffer(), np.uint8), np.frombuffer(target[name].buffer(), np.uint8)
        )
        payloads[name] = st.Tensor.of(np.frombuffer(zlib.compress(x.tobytes()), np.uint8).copy())
        meta[name] = str(zlib.adler32(target[name].buffer()))
    st.write_file(tmp_path / "v1.safetensors", st.entries_of(payloads), meta)
    arc2.apply_file(p, tmp_path / "v1.safetensors", tmp_path / "out.safetensors", fmt="arc_v1")
    assert (tmp_path / "out.safetensors").read_bytes() == t.read_bytes()
    with pytest.raises(arc2.DeltaError, match="not supported"):
        arc2.verify_file(p, tmp_path / "v1.safetensors", fmt="arc_v3")


def test_large_tensor_streams_in_chunks(tmp_path):
    """A tensor of several chunks decodes exactly (chunk boundaries inside one zstd frame)."""
    p, t = pair(tmp_path, shapes=((3 * arc2.CHUNK // 2 + 17,),))
    arc2.encode_file(p, t, tmp_path / "d.safetensors", threads=1)
    arc2.apply_file(p, tmp_path / "d.safetensors", tmp_path / "o.safetensors")
    assert os.path.getsize(tmp_path / "o.safetensors") == os.path.getsize(t)
    assert (tmp_path / "o.safetensors").read_bytes() == t.read_bytes()
