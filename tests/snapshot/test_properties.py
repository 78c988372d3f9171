"""Property tests: the codec round-trips, valid snapshots pass, one mutation gives one clause,
and malformed bytes become findings, never exceptions."""

import json
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from pytest_rlrollout.snapshot import arc2, build
from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot.validate import validate

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = {"U8": np.uint8, "F32": np.float32, "BF16": np.uint16, "I64": np.int64, "F16": np.float16}


@hs.composite
def tensors(draw, dtype=None, shape=None):
    dtype = dtype or draw(hs.sampled_from(sorted(DTYPES)))
    shape = shape or tuple(draw(hs.lists(hs.integers(0, 9), min_size=1, max_size=3)))
    n = int(np.prod(shape)) * np.dtype(DTYPES[dtype]).itemsize
    raw = draw(hs.binary(min_size=n, max_size=n))
    return st.Tensor(dtype, shape, np.frombuffer(raw, DTYPES[dtype]).reshape(shape).copy())


@hs.composite
def parent_and_target(draw):
    names = draw(hs.lists(hs.text("abcdefgh.", min_size=1, max_size=8), min_size=1, max_size=5, unique=True))
    parent, target = {}, {}
    for name in names:
        t = draw(tensors())
        raw = bytearray(t.data.tobytes())
        for i in draw(hs.lists(hs.integers(0, max(0, len(raw) - 1)), max_size=8)) if raw else []:
            raw[i] ^= draw(hs.integers(1, 255))
        parent[name] = t
        target[name] = st.Tensor(t.dtype, t.shape, np.frombuffer(bytes(raw), t.data.dtype).reshape(t.shape).copy())
    return parent, target


@SETTINGS
@given(parent_and_target(), hs.sampled_from([1, 2]))
def test_arc2_round_trip(pair, threads):
    parent, target = pair
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        st.write_file(d / "p.safetensors", st.entries_of(parent))
        st.write_file(d / "t.safetensors", st.entries_of(target))
        arc2.encode_file(d / "p.safetensors", d / "t.safetensors", d / "diff.safetensors", threads=threads)
        arc2.apply_file(d / "p.safetensors", d / "diff.safetensors", d / "o.safetensors", threads=threads)
        assert (d / "o.safetensors").read_bytes() == (d / "t.safetensors").read_bytes()


# --------------------------------------------------------------------------- random snapshots


@hs.composite
def models(draw):
    """A random layered model: per layer a few named tensors, plus non-layer tensors."""
    layers = draw(hs.integers(2, 4))
    hidden = draw(hs.sampled_from([4, 8, 12]))
    kinds = draw(
        hs.lists(hs.sampled_from(["q_proj", "k_proj", "up_proj", "norm", "gate"]), min_size=1, max_size=4, unique=True)
    )
    dtype = draw(hs.sampled_from(["BF16", "F32", "F16"]))
    rng = np.random.default_rng(draw(hs.integers(0, 2**32 - 1)))
    out = {}
    for i in range(layers):
        for k in kinds:
            shape = (hidden,) if k == "norm" else (draw(hs.sampled_from([hidden, 2 * hidden])), hidden)
            out[f"model.layers.{i}.{k}.weight"] = rng.standard_normal(shape).astype(np.float32)
    out["model.embed_tokens.weight"] = rng.standard_normal((16, hidden)).astype(np.float32)
    out["lm_head.weight"] = rng.standard_normal((16, hidden)).astype(np.float32)
    conv = {"BF16": st.Tensor.bf16, "F32": st.Tensor.of, "F16": lambda a: st.Tensor.of(a.astype(np.float16))}[dtype]
    config = {"model_type": "qwen3_moe", "hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": 16}
    cap = draw(hs.sampled_from([10**9, 64 * hidden]))  # sometimes a cap small enough to split layers
    return {k: conv(v) for k, v in out.items()}, config, cap


TOKENIZER = {"tokenizer.json": b'{"version": "1.0"}', "tokenizer_config.json": b"{}"}


def base_and_snapshot(root: Path, model) -> tuple[Path, Path]:
    tensors_, config, cap = model
    base = build.write_snapshot(root / "base", tensors_, config, TOKENIZER, max_bytes=cap)
    snap = build.write_snapshot(root / "snap", tensors_, config, TOKENIZER, max_bytes=cap)
    return base, snap


@SETTINGS
@given(models())
def test_random_valid_snapshots_have_no_findings(model):
    with tempfile.TemporaryDirectory() as d:
        base, snap = base_and_snapshot(Path(d), model)
        report = validate(snap, base=base, hf_config=False)
        assert report.findings == [], [str(f) for f in report.findings]


def _wm(snap):
    return json.loads((snap / "model.safetensors.index.json").read_text())


def _put(snap, name, doc):
    (snap / name).write_text(json.dumps(doc))


def m_truncate(snap, draw):
    f = draw(hs.sampled_from(sorted(p.name for p in snap.glob("model-*.safetensors"))))
    size = (snap / f).stat().st_size
    with open(snap / f, "r+b") as fh:
        fh.truncate(size - draw(hs.integers(1, min(8, size))))


def m_spec_drop(snap, draw):
    spec = json.loads((snap / "model.weight.spec.json").read_text())
    spec["tensor_map"].pop(draw(hs.sampled_from(sorted(spec["tensor_map"]))))
    _put(snap, "model.weight.spec.json", spec)


def m_spec_dtype(snap, draw):
    spec = json.loads((snap / "model.weight.spec.json").read_text())
    name = draw(hs.sampled_from(sorted(spec["tensor_map"])))
    spec["tensor_map"][name]["dtype"] = "I32" if spec["tensor_map"][name]["dtype"] != "I32" else "F32"
    _put(snap, "model.weight.spec.json", spec)


def m_index_move(snap, draw):
    idx = _wm(snap)
    files = list(idx["weight_map"].values())
    name = draw(hs.sampled_from(sorted(t for t, f in idx["weight_map"].items() if files.count(f) > 1)))
    others = sorted(set(idx["weight_map"].values()) - {idx["weight_map"][name]})
    idx["weight_map"][name] = draw(hs.sampled_from(others))
    _put(snap, "model.safetensors.index.json", idx)


def m_config(snap, draw):
    cfg = json.loads((snap / "config.json").read_text())
    cfg[draw(hs.sampled_from(["hidden_size", "vocab_size"]))] += 1
    _put(snap, "config.json", cfg)


def m_tokenizer(snap, draw):
    (snap / "tokenizer.json").unlink()


def m_stray(snap, draw):
    st.write_file(snap / "model-stray.safetensors", st.entries_of({"x": st.Tensor.of(np.zeros(2, np.float32))}))


MUTATIONS = {
    "SNAP-SAFETENSORS-1": m_truncate,
    "SNAP-SPEC-1": m_spec_drop,
    "SNAP-SPEC-2": m_spec_dtype,
    "SNAP-INDEX-3": m_index_move,
    "SNAP-CONFIG-2": m_config,
    "SNAP-TOK-1": m_tokenizer,
    "SNAP-INDEX-3a": m_stray,
}


@SETTINGS
@given(models(), hs.sampled_from(sorted(MUTATIONS)), hs.data())
def test_one_random_mutation_gives_that_clause(model, clause, data):
    with tempfile.TemporaryDirectory() as d:
        base, snap = base_and_snapshot(Path(d), model)
        files = list(_wm(snap)["weight_map"].values())
        if clause == "SNAP-INDEX-3" and (len(set(files)) < 2 or all(files.count(f) == 1 for f in files)):
            return
        MUTATIONS[clause](snap, data.draw)
        report = validate(snap, base=base, hf_config=False)
        assert {f.clause for f in report.findings} == {clause}, [str(f) for f in report.findings]


JSON_FILES = ["config.json", "model.safetensors.index.json", "model.weight.spec.json"]


@SETTINGS
@given(models(), hs.sampled_from(["shard", *JSON_FILES]), hs.binary(max_size=300))
def test_malformed_bytes_become_findings(model, target, garbage):
    with tempfile.TemporaryDirectory() as d:
        base, snap = base_and_snapshot(Path(d), model)
        name = sorted(p.name for p in snap.glob("model-*.safetensors"))[0] if target == "shard" else target
        (snap / name).write_bytes(garbage)
        report = validate(snap, base=base, hf_config=False)
        assert report.findings, f"{name} = {garbage!r} was accepted"


@SETTINGS
@given(
    hs.recursive(
        hs.none() | hs.booleans() | hs.integers() | hs.text(max_size=5),
        lambda c: hs.lists(c, max_size=3) | hs.dictionaries(hs.text(max_size=5), c, max_size=3),
        max_leaves=10,
    ),
    hs.sampled_from([*JSON_FILES, "adapter_config.json"]),
)
def test_arbitrary_json_documents_never_crash_the_validator(doc, target):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        tensors_ = {"model.layers.0.w.weight": st.Tensor.of(np.zeros((2, 2), np.float32))}
        snap = build.write_snapshot(root / "snap", tensors_, {"model_type": "qwen3_moe"}, TOKENIZER)
        (snap / target).write_text(json.dumps(doc))
        validate(snap, base=snap, hf_config=False)
