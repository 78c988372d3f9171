"""SNAP — snapshot layout. One test per clause; each asks the validator's check of that clause.

Run on your own snapshot: `pytest --rl-snapshot=DIR [--rl-base-snapshot=DIR] [-o rl_parent=DIR] [-o rl_signal=FILE]`.
"""

from pytest_rlrollout.suite.marks import clause


@clause("SNAP-ID-1")
def test_identity_is_one_path_segment(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-ID-1", rl_observe)


@clause("SNAP-SAFETENSORS-1")
def test_safetensors_files_parse(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-SAFETENSORS-1", rl_observe)


@clause("SNAP-CONFIG-1")
def test_config_loads_as_hf_config(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-CONFIG-1", rl_observe)


@clause("SNAP-CONFIG-2")
def test_config_equals_base_config(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-CONFIG-2", rl_observe)


@clause("SNAP-INDEX-1")
def test_index_maps_tensors_to_plain_files(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-INDEX-1", rl_observe)


@clause("SNAP-INDEX-2")
def test_one_layer_per_shard(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-INDEX-2", rl_observe)


@clause("SNAP-INDEX-3")
def test_index_and_files_agree(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-INDEX-3", rl_observe)


@clause("SNAP-INDEX-3a")
def test_no_unreferenced_shards(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-INDEX-3a", rl_observe)


@clause("SNAP-SPEC-1")
def test_spec_covers_every_weight(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-SPEC-1", rl_observe)


@clause("SNAP-SPEC-2")
def test_spec_equals_headers(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-SPEC-2", rl_observe)


@clause("SNAP-COVER-1")
def test_tensors_cover_the_base(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-COVER-1", rl_observe)


@clause("SNAP-SIZE-1")
def test_files_at_most_5_gib(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-SIZE-1", rl_observe)


@clause("SNAP-TOK-1")
def test_tokenizer_present(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-TOK-1", rl_observe)


@clause("SNAP-TOK-1a")
def test_tokenizer_identical_to_base(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-TOK-1a", rl_observe)


@clause("SNAP-QUANT-1")
def test_quantized_tensors_have_scales(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-QUANT-1", rl_observe)


@clause("SNAP-QUANT-2")
def test_quantized_dtypes_only_when_declared(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-QUANT-2", rl_observe)


@clause("SNAP-INC-1")
def test_diff_keeps_parent_index(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-INC-1", rl_observe)


@clause("SNAP-INC-2")
def test_diff_keeps_parent_dtypes_and_shapes(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-INC-2", rl_observe)


@clause("SNAP-INC-3")
def test_diff_payloads_are_arc2(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-INC-3", rl_observe)


@clause("SNAP-INC-4")
def test_signal_names_arc_v2_and_alder32(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-INC-4", rl_observe)


@clause("SNAP-INC-5")
def test_previous_identity_is_the_served_one(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-INC-5", rl_observe)


@clause("SNAP-INC-6")
def test_lora_is_never_incremental(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-INC-6", rl_observe)


@clause("SNAP-INC-7")
def test_full_snapshot_after_ledger_reset(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-INC-7", rl_observe)


@clause("SNAP-LORA-1")
def test_adapter_config_decides_the_kind(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-LORA-1", rl_observe)


@clause("SNAP-LORA-2")
def test_adapter_weights_present(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-LORA-2", rl_observe)


@clause("SNAP-LORA-3")
def test_adapter_fits_the_base(rl_snapshot_under_test, rl_observe):
    rl_snapshot_under_test.expect("SNAP-LORA-3", rl_observe)
