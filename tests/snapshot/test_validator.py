import json
import os
import shutil

import pytest

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.contract.identity import identity_problem
from pytest_rlrollout.snapshot import broken, build, tiny_moe
from pytest_rlrollout.snapshot.validate import config_differences, validate

from ..support import tree_hash, write_row

SNAP = [c.id for c in catalogue().area("SNAP")]


@pytest.mark.parametrize("kind", ["full", "incremental", "lora", "quantized"])
def test_reference_cases_are_valid(reference, kind):
    report = reference[kind].validate()
    assert report.findings == []
    assert report.ok()
    assert set(report.verdicts) == set(SNAP)
    assert "fail" not in {v.outcome for v in report.verdicts.values()}


def test_base_is_valid_against_itself(reference):
    report = validate(reference.base, base=reference.base)
    assert report.findings == [] and report.kind == "full"


@pytest.mark.parametrize("clause", SNAP)
def test_broken_variant_yields_exactly_its_clause(reference, tmp_path, clause):
    """The broken snapshot variants' rows of the mutation matrix."""
    case = broken.broken_case(clause, reference, tmp_path)
    report = case.validate()
    write_row(f"variant-{clause}", "broken snapshot", {c: str(v.outcome) for c, v in report.verdicts.items()}, clause)
    assert {f.clause for f in report.findings} == {clause}, [str(f) for f in report.findings]
    assert report.verdicts[clause].outcome == "fail"
    level = catalogue()[clause].level
    assert report.ok("MUST") == (level != "MUST")
    assert not report.ok("SHOULD")


def test_validator_never_writes_to_a_snapshot(reference, tmp_path):
    case = broken.broken_case("SNAP-INC-3", reference, tmp_path)  # decoding reads every payload
    roots = [case.snapshot, case.parent, case.base]
    before = [tree_hash(r) for r in roots]
    case.validate()
    for clause in ("SNAP-INDEX-2", "SNAP-QUANT-1", "SNAP-LORA-3"):
        b = broken.broken_case(clause, reference, tmp_path / clause)
        h = tree_hash(b.snapshot)
        b.validate()
        assert tree_hash(b.snapshot) == h
    assert [tree_hash(r) for r in roots] == before
    assert not list(tmp_path.rglob("*.partial"))


# --------------------------------------------------------------------------- hostile input


def copy_full(reference, tmp_path):
    dst = tmp_path / "snap"
    shutil.copytree(reference["full"].snapshot, dst)
    return dst


def edit_index(path, fn):
    doc = json.loads((path / "model.safetensors.index.json").read_text())
    fn(doc["weight_map"])
    (path / "model.safetensors.index.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "target", ["../model-00001-of-00005.safetensors", "sub/x.safetensors", "/etc/passwd", "..", "x.bin"]
)
def test_weight_map_paths_leaving_the_snapshot(reference, tmp_path, target):
    snap = copy_full(reference, tmp_path)
    edit_index(snap, lambda wm: wm.update({next(iter(wm)): target}))
    report = validate(snap, base=reference.base)
    index1 = report.of("SNAP-INDEX-1")
    assert index1 and any(repr(target) in f.message for f in index1), [str(f) for f in report.findings]


def test_symlinks_leaving_the_snapshot_are_not_followed(reference, tmp_path):
    snap = copy_full(reference, tmp_path)
    outside = tmp_path / "outside.safetensors"
    shard = sorted(snap.glob("model-0000*.safetensors"))[0]
    shutil.move(shard, outside)
    shard.symlink_to(outside)
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to("/etc/hostname")
    report = validate(snap, base=reference.base)
    messages = {f.clause: f.message for f in report.findings}
    assert "symlink leaving the snapshot" in messages["SNAP-SAFETENSORS-1"]
    assert "symlink leaving the snapshot" in messages["SNAP-CONFIG-1"]


def test_symlinks_inside_the_snapshot_are_fine(reference, tmp_path):
    snap = copy_full(reference, tmp_path)
    (snap / "tokenizer.json").rename(snap / "tok-real.json")
    (snap / "tokenizer.json").symlink_to("tok-real.json")
    assert [str(f) for f in validate(snap, base=reference.base).findings] == []


def test_fifo_and_huge_header_lengths_do_not_hang_or_crash(reference, tmp_path):
    snap = copy_full(reference, tmp_path)
    shard = sorted(snap.glob("model-0000*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes((2**63).to_bytes(8, "little") + data[8:])
    (snap / "tokenizer_config.json").unlink()
    os.mkfifo(snap / "tokenizer_config.json")
    report = validate(snap, base=reference.base)
    saf = report.of("SNAP-SAFETENSORS-1")
    assert any("header length 9223372036854775808 exceeds the file" in f.message for f in saf)


def test_unknown_signal_field_uses_the_sdk_wording(reference):
    report = validate(
        reference.base, signal={"identity": tiny_moe.BASE_IDENTITY, "reset_prompt_cache": True, "force": 1}
    )
    [f] = report.findings
    assert f.clause == "HL-POST-2" and f.message == "Extra inputs are not permitted, field: 'force'"
    report = validate(reference.base, signal={"identity": tiny_moe.BASE_IDENTITY, "reset_prompt_cache": "sometimes"})
    assert [f.clause for f in report.findings] == ["HL-POST-3"]


@pytest.mark.parametrize(
    ("identity", "why"),
    [
        ("", "empty"),
        (".", "relative"),
        ("..", "relative"),
        ("a/b", "'/'"),
        ("a\\b", "'\\'"),
        ("a\x00b", "NUL"),
        ("a\nb", "control"),
        ("a\x7fb", "control"),
        (5, "not a string"),
    ],
)
def test_identity_rule(identity, why):
    assert why in identity_problem(identity)


@pytest.mark.parametrize("identity", ["step-1", "version_001", "a..b", "ünïcode", "x" * 200])
def test_identity_rule_accepts_segments(identity):
    assert identity_problem(identity) is None


def test_config_differences_use_the_documented_wording():
    base = {"model_type": "qwen3_moe", "hidden_size": 64, "torch_dtype": "bfloat16", "transformers_version": "4"}
    assert config_differences({"model_type": "qwen3_moe", "hidden_size": 64, "dtype": "bfloat16"}, base) == []
    assert config_differences({"model_type": "llama", "hidden_size": 64}, base)[0].startswith("Types mismatch")
    diffs = config_differences({"model_type": "qwen3_moe", "hidden_size": 32, "extra": 1}, base)
    assert diffs == [
        "Extra snapshot model config options: ['extra']",
        "Extra base model config options: ['dtype']",
        "Config value mismatch for hidden_size: snapshot 32, base 64",
    ]
    assert (
        config_differences({"model_type": "qwen3_moe", "hidden_size": 32, "dtype": "bfloat16"}, base, ["hidden_size"])
        == []
    )
    assert config_differences({**base, "quantization_config": {"quant_method": "fp8"}}, base) == []


def test_extra_fields_ignore_in_the_signal_lets_a_config_difference_pass(reference, tmp_path):
    case = broken.broken_case("SNAP-CONFIG-2", reference, tmp_path)
    signal = {"identity": case.snapshot.name, "validation": {"extra_fields_ignore": ["rms_norm_eps"]}}
    assert validate(case.snapshot, base=reference.base, signal=signal).findings == []


def test_without_a_base_the_comparisons_are_not_applicable(reference):
    report = validate(reference["full"].snapshot)
    for clause in ("SNAP-CONFIG-2", "SNAP-COVER-1", "SNAP-TOK-1a"):
        assert report.verdicts[clause].outcome == "not-applicable"
        assert "base" in report.verdicts[clause].reason


def test_a_diff_without_its_parent_still_gets_structural_checks(reference):
    inc = reference["incremental"]
    report = validate(inc.snapshot, signal=inc.signal)
    assert report.kind == "incremental" and report.findings == []
    assert report.verdicts["SNAP-INC-3"].outcome == "not-applicable"


def test_served_identities_decide_snap_inc_5(reference):
    inc = reference["incremental"]
    ok = inc.validate(served=(tiny_moe.BASE_IDENTITY, tiny_moe.BASE_IDENTITY))
    assert ok.findings == []
    mixed = inc.validate(served=(tiny_moe.BASE_IDENTITY, "step-1"))
    assert [f.clause for f in mixed.findings] == ["SNAP-INC-5"]


def test_mixed_layer_checkpoint_names_files_and_layers(reference, tmp_path):
    case = broken.broken_case("SNAP-INDEX-2", reference, tmp_path)
    [finding] = case.validate().of("SNAP-INDEX-2")
    assert finding.file.startswith("model-") and "layers 1, 2" in finding.message


def test_report_json_and_text(reference, tmp_path):
    case = broken.broken_case("SNAP-SIZE-1", reference, tmp_path)
    report = case.validate()
    doc = report.as_dict("MUST")
    assert doc["valid"] is True and doc["findings"][0]["clause"] == "SNAP-SIZE-1"
    assert report.as_dict()["valid"] is False  # a SHOULD finding fails at the default level, as the exit code does
    assert "valid with SHOULD findings" in report.text()
    json.dumps(doc)


def test_incremental_inherits_files_it_omits(reference, tmp_path):
    inc = reference["incremental"]
    dst = tmp_path / "diff"
    shutil.copytree(inc.snapshot, dst)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.weight.spec.json"):
        (dst / name).unlink()
    assert validate(dst, base=reference.base, parent=inc.parent, signal=inc.signal).findings == []


def test_lora_shape_mismatch_and_unknown_module(reference, tmp_path):
    lora = reference["lora"]
    dst = tmp_path / "lora"
    build.make_lora(reference.base, dst, base_model=tiny_moe.MODEL_NAME, rank=4)
    cfg = json.loads((dst / "adapter_config.json").read_text())
    cfg["r"] = 8
    cfg["target_modules"] = ["q_proj", "v_proj", "wq"]
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    report = validate(dst, base=lora.base, base_model=lora.base_model)
    msgs = [f.message for f in report.of("SNAP-LORA-3")]
    assert any("['wq'] match no module" in m for m in msgs)
    assert any("rank 8" in m and "needs [8, 64]" in m for m in msgs)
    assert {f.clause for f in report.findings} == {"SNAP-LORA-3"}


def test_context_and_loose_fields_do_not_mix(reference):
    inc = reference["incremental"]
    with pytest.raises(TypeError, match="either context"):
        validate(inc.snapshot, context=inc.context(), signal=inc.signal)


def test_a_diff_missing_files_without_parent_says_how_to_check_it(reference, tmp_path):
    dst = tmp_path / "diff"
    shutil.copytree(reference["incremental"].snapshot, dst)
    (dst / "config.json").unlink()
    [finding] = validate(dst, signal=reference["incremental"].signal).of("SNAP-CONFIG-1")
    assert "pass --parent" in finding.message


def test_target_modules_match_as_peft_matches_them(reference):
    """The set lookup SNAP-LORA-3 uses (bounded whatever adapter_config lists) answers what PEFT's
    substring rule does: `.{t}.weight` inside a base tensor name, or a name starting with `{t}.`."""
    from pytest_rlrollout.snapshot.validate.lora import _module_names

    base = list(json.loads((reference.base / "model.safetensors.index.json").read_text())["weight_map"])
    pieces = {p for name in base for p in name.split(".")}
    candidates = pieces | {".".join(name.split(".")[i:j]) for name in base for i in range(6) for j in range(i, 7)}
    candidates |= {"q_pro", "proj", "weight", "", "layers.0.self", "model.layers"}
    modules = _module_names(base)
    for t in candidates:
        assert (t in modules) == any(f".{t}.weight" in b or b.startswith(f"{t}.") for b in base), t
