"""A real peft adapter laid out as a LoRA snapshot."""

import json

import pytest

from pytest_rlrollout.snapshot import build, tiny_moe
from pytest_rlrollout.snapshot.validate import validate

from ..support import LazyModule

torch = LazyModule("torch")
transformers = LazyModule("transformers")
peft = LazyModule("peft")

NAMES = (tiny_moe.MODEL_NAME,)


@pytest.fixture(scope="module")
def adapter_dir(reference, tmp_path_factory):
    base = transformers.AutoModelForCausalLM.from_pretrained(reference.base, dtype=torch.float32)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"])
    model = peft.get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    out = tmp_path_factory.mktemp("peft") / "adapter"
    model.save_pretrained(out)
    return out


def test_peft_adapter_is_a_valid_lora_snapshot(reference, adapter_dir, tmp_path):
    snap = build.lora_snapshot(adapter_dir, tmp_path / "lora-1", base_model=tiny_moe.MODEL_NAME)
    report = validate(snap, base=reference.base, base_model=NAMES)
    assert report.kind == "lora" and [str(f) for f in report.findings] == []
    assert report.verdicts["SNAP-LORA-3"].outcome == "pass"


def test_base_name_wrong_or_missing(reference, adapter_dir, tmp_path):
    as_saved = build.lora_snapshot(adapter_dir, tmp_path / "as-saved")  # peft wrote a local path
    assert [f.clause for f in validate(as_saved, base=reference.base, base_model=NAMES).findings] == ["SNAP-LORA-3"]
    missing = build.lora_snapshot(adapter_dir, tmp_path / "missing")
    cfg = json.loads((missing / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = None
    (missing / "adapter_config.json").write_text(json.dumps(cfg))
    [f] = validate(missing, base=reference.base, base_model=NAMES).findings
    assert f.clause == "SNAP-LORA-3" and "base_model_name_or_path" in f.message


def test_shape_mismatch(reference, adapter_dir, tmp_path):
    snap = build.lora_snapshot(adapter_dir, tmp_path / "r8", base_model=tiny_moe.MODEL_NAME)
    cfg = json.loads((snap / "adapter_config.json").read_text())
    cfg["r"] = 8
    (snap / "adapter_config.json").write_text(json.dumps(cfg))
    findings = validate(snap, base=reference.base, base_model=NAMES).findings
    assert findings and {f.clause for f in findings} == {"SNAP-LORA-3"}
    assert any("rank 8" in f.message for f in findings)
