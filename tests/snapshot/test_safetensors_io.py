import json

import numpy as np
import pytest
import safetensors.numpy

from pytest_rlrollout.snapshot import dtypes
from pytest_rlrollout.snapshot import safetensors_io as st


def raw_file(path, header: dict | bytes, data: bytes = b"", length: int | None = None):
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(body) if length is None else length
    path.write_bytes(n.to_bytes(8, "little") + body + data)
    return path


def test_writer_matches_the_safetensors_library_byte_for_byte(tmp_path):
    arrays = {"b": np.arange(6, dtype=np.uint8), "a": np.ones((2, 3), np.float32), "c": np.zeros(4, np.int64)}
    safetensors.numpy.save_file(arrays, tmp_path / "lib.safetensors", metadata={"format": "pt"})
    st.write_file(
        tmp_path / "ours.safetensors", st.entries_of({k: st.Tensor.of(v) for k, v in arrays.items()}), {"format": "pt"}
    )
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "lib.safetensors").read_bytes()


def test_reader_agrees_with_the_library(tmp_path):
    arrays = {"w": np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32), "i": np.arange(7)}
    safetensors.numpy.save_file(arrays, tmp_path / "x.safetensors")
    h = st.read_header(tmp_path / "x.safetensors")
    assert {n: (t.dtype, t.shape) for n, t in h.tensors.items()} == {"w": ("F32", (3, 5)), "i": ("I64", (7,))}
    loaded = st.load_file(tmp_path / "x.safetensors")
    np.testing.assert_array_equal(loaded["w"].data, arrays["w"])


def test_bf16_rounds_to_nearest_even_and_widens_exactly():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, 3.1415926], np.float32)
    t = st.Tensor.bf16(x)
    assert t.dtype == "BF16" and t.data.dtype == np.uint16
    assert t.float32().tolist() == [1.0, 1.0, 1.015625, -2.5, 3.140625]
    assert np.array_equal(st.Tensor.bf16(t.float32()).data, t.data)


@pytest.mark.parametrize(
    ("header", "data", "length", "message"),
    [
        (b"", b"", 2**63, "exceeds the file"),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, 10_000, "exceeds the file"),
        (b"[1, 2]", b"", None, "not an object"),
        (b"\xff\xfe{", b"", None, "not UTF-8"),
        ({"t": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, None, "unknown dtype"),
        ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, None, "unsigned"),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, None, "needs 8"),
        ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, None, "leaves a gap"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
            },
            b"\0" * 8,
            None,
            "overlaps",
        ),
        ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 9, None, "account for 4"),
        ({"__metadata__": {"a": 1}}, b"", None, "map of strings"),
        ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, True]}}, b"\0" * 4, None, "pair of unsigned"),
    ],
)
def test_malformed_headers_name_the_problem(tmp_path, header, data, length, message):
    path = raw_file(tmp_path / "bad.safetensors", header, data, length)
    with pytest.raises(st.HeaderError, match=message):
        st.read_header(path)


def test_short_file(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(st.HeaderError, match="shorter than the 8-byte"):
        st.read_header(tmp_path / "x.safetensors")


def test_library_opinion_reports_what_the_library_refuses(tmp_path):
    ok = tmp_path / "ok.safetensors"
    safetensors.numpy.save_file({"x": np.zeros(2, np.float32)}, ok)
    assert st.library_opinion(ok) is None
    bad = raw_file(tmp_path / "bad.safetensors", b"{", b"")
    assert st.library_opinion(bad) is not None


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("bfloat16", "BF16"),
        ("torch.float16", "F16"),
        ("F8_E4M3", "F8_E4M3"),
        ("float8_e4m3fn", "F8_E4M3"),
        ("float32", "F32"),
        ("int64", "I64"),
        ("nope", None),
    ],
)
def test_dtype_names_normalise(name, code):
    assert dtypes.normalise(name) == code


def test_sub_byte_sizes():
    assert dtypes.nbytes("F4", [3, 5]) == 8  # 15 nibbles round up to 8 bytes
    assert dtypes.nbytes("BF16", [2, 3]) == 12
