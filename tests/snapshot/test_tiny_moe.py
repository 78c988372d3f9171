import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from pytest_rlrollout.snapshot import build, tiny_moe

from ..support import tree_hash


def test_make_base_is_deterministic(tmp_path):
    a = tiny_moe.make_base(tmp_path / "a" / tiny_moe.BASE_IDENTITY)
    b = tiny_moe.make_base(tmp_path / "b" / tiny_moe.BASE_IDENTITY)
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def test_architecture(reference):
    cfg = json.loads((reference.base / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe" and cfg["mlp_only_layers"] == [0]
    assert tiny_moe.moe_layers(cfg) == [1, 2, 3]
    assert tiny_moe.num_experts(cfg) == 8 and cfg["num_experts_per_tok"] == 2
    tensors = build.read_snapshot(reference.base)
    assert "model.layers.0.mlp.gate_proj.weight" in tensors
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in tensors
    assert tensors["model.embed_tokens.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    assert all(t.dtype == "BF16" for t in tensors.values())
    assert all(np.isfinite(t.float32()).all() for t in tensors.values())


def test_moe_layer_conventions():
    base = {"num_hidden_layers": 6, "num_experts": 4}
    assert tiny_moe.moe_layers(base) == [0, 1, 2, 3, 4, 5]
    assert tiny_moe.moe_layers({**base, "decoder_sparse_step": 2}) == [1, 3, 5]
    assert tiny_moe.moe_layers({**base, "first_k_dense_replace": 2}) == [2, 3, 4, 5]
    assert tiny_moe.moe_layers({**base, "num_experts": 0}) == []


def test_tokenizer_and_chat_template(reference):
    tok = Tokenizer.from_file(str(reference.base / "tokenizer.json"))
    text = "the policy samples a rollout from the deployment"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text and len(ids) < len(text) / 2  # real merges happened
    cfg = json.loads((reference.base / "config.json").read_text())
    assert max(ids) < cfg["vocab_size"]
    assert tok.token_to_id("<|im_end|>") == cfg["eos_token_id"]
    tcfg = json.loads((reference.base / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tcfg["chat_template"]


def test_base_directory_hash_is_stable_across_calls(tmp_path):
    p = tiny_moe.make_base(tmp_path / "x")
    assert tree_hash(p) == tree_hash(p)


def qwen3_30b_a3b_names() -> set[str]:
    """Qwen3-30B-A3B's published tensor names: 48 layers of attention, norms, a router and 128
    experts, then the embeddings, the final norm and the LM head."""
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(48):
        p = f"model.layers.{i}."
        names |= {
            p + n
            for n in (
                "input_layernorm.weight",
                "post_attention_layernorm.weight",
                "mlp.gate.weight",
                *(f"self_attn.{x}_proj.weight" for x in "qkvo"),
                "self_attn.q_norm.weight",
                "self_attn.k_norm.weight",
            )
        }
        names |= {p + f"mlp.experts.{e}.{m}_proj.weight" for e in range(128) for m in ("gate", "up", "down")}
    return names


def test_the_qwen3_30b_a3b_layout_has_the_published_structure_at_cpu_widths(tmp_path):
    """`make-base --layout qwen3-30b-a3b`: the 18,867 published names, one layer per shard (49
    shards), every layer MoE with 128 experts and top-8; valid as a snapshot; and the reference
    engine routes every token through 48 layers of 8 experts each."""
    from pytest_rlrollout.reference.model import Model, Sequence_
    from pytest_rlrollout.snapshot.validate import validate

    base = tiny_moe.make_base(tmp_path / "q3", layout="qwen3-30b-a3b")
    files = build.weight_map(base)
    assert set(files) == qwen3_30b_a3b_names() and len(files) == 18_867
    assert len(set(files.values())) == 49
    cfg = json.loads((base / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_experts"], cfg["num_experts_per_tok"], cfg["mlp_only_layers"]) == (
        48,
        128,
        8,
        [],
    )
    assert cfg["head_dim"] >= 32  # vLLM's CPU attention
    assert validate(base).ok("must")
    out = Model.load(base).step([Sequence_()], [[1, 2, 3, 4]])[0]
    assert out.routing.shape == (4, 48, 8) and np.isfinite(out.logits).all()


def test_engines_sharing_a_bucket_write_the_base_once(tmp_path, monkeypatch):
    """A fleet's engines start together on one bucket: the base is written beside its place and
    renamed in, so the engine that loses the race uses the winner's base (no refusal, no half
    base, no leftovers), and a base already there is used as it is."""
    dst = tmp_path / "bucket" / tiny_moe.BASE_IDENTITY
    real = tiny_moe.make_base

    def another_engine_wins(partial, **kw):  # the other engine's rename lands while this one writes
        real(dst, **kw)
        return real(partial, **kw)

    monkeypatch.setattr(tiny_moe, "make_base", another_engine_wins)
    assert tiny_moe.ensure_base(dst) == dst
    assert [p.name for p in dst.parent.iterdir()] == [dst.name]  # the loser's copy removed
    expected = real(tmp_path / "expected")
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == {p.name: p.read_bytes() for p in expected.iterdir()}
    monkeypatch.setattr(tiny_moe, "make_base", lambda *a, **k: pytest.fail("a base already there is rewritten"))
    assert tiny_moe.ensure_base(dst) == dst
