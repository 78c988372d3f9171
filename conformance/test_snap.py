"""SNAP — snapshot layout. One test per clause; each asks the validator's check of that clause.

Run on your own snapshot: `pytest --rl-snapshot=DIR [--rl-base-snapshot=DIR] [-o rl_parent=DIR] [-o rl_signal=FILE]`.
"""

from pytest_rlrollout.suite.marks import clause


@clause("SNAP-ID-1")
def test_identity_is_one_path_segment(rl_snapshot_under_test, rl_observe):
    """A snapshot identity is a single non-empty path segment: no '/', no '\\\\', no NUL or control character, and
    neither '.' nor '..'."""
    rl_snapshot_under_test.expect("SNAP-ID-1", rl_observe)


@clause("SNAP-SAFETENSORS-1")
def test_safetensors_files_parse(rl_snapshot_under_test, rl_observe):
    """Every *.safetensors file parses: an 8-byte little-endian header length that fits in the file, a JSON object
    header, known dtypes, and data offsets that are contiguous, in bounds and equal to shape x dtype size. A
    malformed file is reported, never a crash."""
    rl_snapshot_under_test.expect("SNAP-SAFETENSORS-1", rl_observe)


@clause("SNAP-CONFIG-1")
def test_config_loads_as_hf_config(rl_snapshot_under_test, rl_observe):
    """config.json exists, is a JSON object and loads as a Hugging Face config: its model_type is known to transformers
    when transformers is installed, and present otherwise."""
    rl_snapshot_under_test.expect("SNAP-CONFIG-1", rl_observe)


@clause("SNAP-CONFIG-2")
def test_config_equals_base_config(rl_snapshot_under_test, rl_observe):
    """config.json equals the base model's config key by key, ignoring transformers_version, _name_or_path, the keys
    listed in validation.extra_fields_ignore, and quantization_config (governed by SNAP-QUANT). torch_dtype and dtype
    count as one key. Messages use the documented wording: 'Config value mismatch for <field>', 'Extra snapshot model
    config options: [...]', 'Extra base model config options: [...]', 'Types mismatch'."""
    rl_snapshot_under_test.expect("SNAP-CONFIG-2", rl_observe)


@clause("SNAP-INDEX-1")
def test_index_maps_tensors_to_plain_files(rl_snapshot_under_test, rl_observe):
    """model.safetensors.index.json is a JSON object whose weight_map maps each tensor name to the plain name of a
    *.safetensors file (no path separator, no '..') that exists inside the snapshot."""
    rl_snapshot_under_test.expect("SNAP-INDEX-1", rl_observe)


@clause("SNAP-INDEX-2")
def test_one_layer_per_shard(rl_snapshot_under_test, rl_observe):
    """Each shard file holds the tensors of a single layer, or only non-layer tensors (embeddings, final norm, lm_head).
    The finding names the file and the groups it mixes."""
    rl_snapshot_under_test.expect("SNAP-INDEX-2", rl_observe)


@clause("SNAP-INDEX-3")
def test_index_and_files_agree(rl_snapshot_under_test, rl_observe):
    """Index and files agree: every weight_map tensor is in the file it names, every tensor of a referenced file is in
    weight_map, and no tensor is stored in two files."""
    rl_snapshot_under_test.expect("SNAP-INDEX-3", rl_observe)


@clause("SNAP-INDEX-3a")
def test_no_unreferenced_shards(rl_snapshot_under_test, rl_observe):
    """No *.safetensors file in the snapshot is left unreferenced by weight_map."""
    rl_snapshot_under_test.expect("SNAP-INDEX-3a", rl_observe)


@clause("SNAP-SPEC-1")
def test_spec_covers_every_weight(rl_snapshot_under_test, rl_observe):
    """model.weight.spec.json is a JSON object whose tensor_map covers every weight_map tensor, each entry holding shape
    (a list of non-negative integers) and dtype (a string)."""
    rl_snapshot_under_test.expect("SNAP-SPEC-1", rl_observe)


@clause("SNAP-SPEC-2")
def test_spec_equals_headers(rl_snapshot_under_test, rl_observe):
    """Spec entries equal the safetensors headers: the same shape, and the same dtype once names are normalised (BF16 =
    bfloat16, F16 = float16, F32 = float32, F8_E4M3 = float8_e4m3fn, ...)."""
    rl_snapshot_under_test.expect("SNAP-SPEC-2", rl_observe)


@clause("SNAP-COVER-1")
def test_tensors_cover_the_base(rl_snapshot_under_test, rl_observe):
    """The tensors cover the base model: the same names with the same shapes (no tensor-parallel slices) and the same
    dtypes unless SNAP-QUANT applies. Without a base snapshot the clause is not-applicable."""
    rl_snapshot_under_test.expect("SNAP-COVER-1", rl_observe)


@clause("SNAP-SIZE-1")
def test_files_at_most_5_gib(rl_snapshot_under_test, rl_observe):
    """Each *.safetensors file is at most 5 GiB."""
    rl_snapshot_under_test.expect("SNAP-SIZE-1", rl_observe)


@clause("SNAP-TOK-1")
def test_tokenizer_present(rl_snapshot_under_test, rl_observe):
    """Tokenizer files are present: tokenizer_config.json with tokenizer.json, or a tokenizer model file."""
    rl_snapshot_under_test.expect("SNAP-TOK-1", rl_observe)


@clause("SNAP-TOK-1a")
def test_tokenizer_identical_to_base(rl_snapshot_under_test, rl_observe):
    """Tokenizer files are byte-identical to the base model's."""
    rl_snapshot_under_test.expect("SNAP-TOK-1a", rl_observe)


@clause("SNAP-QUANT-1")
def test_quantized_tensors_have_scales(rl_snapshot_under_test, rl_observe):
    """When config.json declares quantization_config, the spec holds at least one quantized tensor (8-bit or narrower)
    and each has its scale tensor (<name>_scale_inv or <name>_scale) in spec and index, shaped [ceil(M/bm),
    ceil(K/bn)] for weight_block_size [bm, bn]."""
    rl_snapshot_under_test.expect("SNAP-QUANT-1", rl_observe)


@clause("SNAP-QUANT-2")
def test_quantized_dtypes_only_when_declared(rl_snapshot_under_test, rl_observe):
    """Quantized dtypes appear only when config.json declares quantization_config."""
    rl_snapshot_under_test.expect("SNAP-QUANT-2", rl_observe)


@clause("SNAP-INC-1")
def test_diff_keeps_parent_index(rl_snapshot_under_test, rl_observe):
    """An incremental snapshot keeps its parent's index: identical weight_map, file count and per-file tensor set."""
    rl_snapshot_under_test.expect("SNAP-INC-1", rl_observe)


@clause("SNAP-INC-2")
def test_diff_keeps_parent_dtypes_and_shapes(rl_snapshot_under_test, rl_observe):
    """Every tensor of an incremental snapshot has its parent's dtype and shape; the recipe, quantized or not, stays
    constant along the chain."""
    rl_snapshot_under_test.expect("SNAP-INC-2", rl_observe)


@clause("SNAP-INC-3")
def test_diff_payloads_are_arc2(rl_snapshot_under_test, rl_observe):
    """Each diff file is ARC2 (arc_v2): per tensor a 1-D U8 payload holding one zstd frame of parent XOR target bytes;
    __metadata__ maps each tensor name to the decimal Adler-32 of the target bytes; the decoded payload has the
    parent tensor's byte size and applying it yields bytes with that checksum. arc_v3 (pickle) is never decoded."""
    rl_snapshot_under_test.expect("SNAP-INC-3", rl_observe)


@clause("SNAP-INC-4")
def test_signal_names_arc_v2_and_alder32(rl_snapshot_under_test, rl_observe):
    """The signal's incremental metadata says compression_format 'arc_v2' and checksum_format 'alder32' (sic)."""
    rl_snapshot_under_test.expect("SNAP-INC-4", rl_observe)


@clause("SNAP-INC-5")
def test_previous_identity_is_the_served_one(rl_snapshot_under_test, rl_observe):
    """previous_snapshot_identity names the snapshot every replica serves now; otherwise the signal is rejected and the
    new identity is never served."""
    rl_snapshot_under_test.expect("SNAP-INC-5", rl_observe)


@clause("SNAP-INC-6")
def test_lora_is_never_incremental(rl_snapshot_under_test, rl_observe):
    """A LoRA snapshot signalled with incremental metadata is rejected."""
    rl_snapshot_under_test.expect("SNAP-INC-6", rl_observe)


@clause("SNAP-INC-7")
def test_full_snapshot_after_ledger_reset(rl_snapshot_under_test, rl_observe):
    """After a ledger reset the next signal is full: incremental metadata is rejected."""
    rl_snapshot_under_test.expect("SNAP-INC-7", rl_observe)


@clause("SNAP-LORA-1")
def test_adapter_config_decides_the_kind(rl_snapshot_under_test, rl_observe):
    """A snapshot directory holding adapter_config.json is a LoRA adapter; any other is a full snapshot. There is no
    flag."""
    rl_snapshot_under_test.expect("SNAP-LORA-1", rl_observe)


@clause("SNAP-LORA-2")
def test_adapter_weights_present(rl_snapshot_under_test, rl_observe):
    """Adapter weights exist as adapter_model.safetensors, sharded adapter_model-*.safetensors, or legacy
    adapter_model.bin (listed, never unpickled)."""
    rl_snapshot_under_test.expect("SNAP-LORA-2", rl_observe)


@clause("SNAP-LORA-3")
def test_adapter_fits_the_base(rl_snapshot_under_test, rl_observe):
    """adapter_config.json names the base model the deployment serves in base_model_name_or_path; its target modules
    exist in the base, and lora_A/lora_B shapes fit the base layer shapes and rank r."""
    rl_snapshot_under_test.expect("SNAP-LORA-3", rl_observe)
