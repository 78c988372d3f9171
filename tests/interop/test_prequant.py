"""fireworks-prequant mxfp8_bw128 output, exported into the hot-load layout."""

import json

import pytest

from pytest_rlrollout.snapshot import broken, build
from pytest_rlrollout.snapshot.validate import validate

from ..support import LazyModule

prequant = LazyModule("fireworks_prequant")


@pytest.fixture(scope="module")
def quantized(reference, tmp_path_factory):
    out = tmp_path_factory.mktemp("prequant") / "q"
    prequant.quantize_checkpoint_dir(str(reference.base), str(out), fmt="mxfp8_bw128", device="cpu")
    return out


def test_prequant_output_needs_export_then_is_valid(reference, quantized, tmp_path):
    raw = validate(quantized, base=reference.base)
    # prequant copies the old spec verbatim: it still describes bf16 expert weights
    assert "SNAP-SPEC-2" in {f.clause for f in raw.findings}
    (quantized / "model.weight.spec.json").unlink()
    out = build.export_checkpoint(quantized, tmp_path / "exported")
    report = validate(out, base=reference.base)
    assert [str(f) for f in report.findings] == []
    assert report.verdicts["SNAP-QUANT-1"].outcome == "pass"
    spec = json.loads((out / "model.weight.spec.json").read_text())["tensor_map"]
    assert sum(e["dtype"] == "F8_E4M3" for e in spec.values()) == 72
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "fp8"


def test_removing_one_scale_is_snap_quant_1(reference, quantized, tmp_path):
    src = tmp_path / "src"
    import shutil

    shutil.copytree(quantized, src)
    (src / "model.weight.spec.json").unlink(missing_ok=True)
    out = build.export_checkpoint(src, tmp_path / "exported")
    scale, file = broken._file_of(out, "experts.5.down_proj.weight_scale_inv")
    broken._rewrite(out, file, lambda ts: ts.pop(scale))
    findings = validate(out, base=reference.base).findings
    assert [f.clause for f in findings] == ["SNAP-QUANT-1"]
    assert "experts.5.down_proj.weight" in findings[0].message


def test_our_numpy_fp8_matches_prequant_layout(reference, quantized):
    ours = build.read_snapshot(reference["quantized"].snapshot)
    theirs = build.read_snapshot(quantized)
    assert {n for n, t in ours.items() if t.dtype == "F8_E4M3"} == {
        n for n, t in theirs.items() if t.dtype == "F8_E4M3"
    }
    assert {n: t.shape for n, t in ours.items()} == {n: t.shape for n, t in theirs.items()}
