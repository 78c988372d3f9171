"""The tiny reference base model: a deterministic Qwen3-MoE-architecture snapshot made with numpy
and the `tokenizers` library only (no torch), so the reference deployment and the tests have a
real model to serve without downloading anything."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from pytest_rlrollout.contract.moe import moe_layers, num_experts
from pytest_rlrollout.snapshot.safetensors_io import Tensor

MODEL_NAME = "accounts/rlrollout/models/tiny-qwen3-moe"
BASE_IDENTITY = "tiny-qwen3-moe-base"
SEED = 20261122

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Training text for the byte-level BPE: deterministic, small, and varied enough for real merges.
_WORDS = (
    "the policy samples a rollout from the deployment and the trainer scores each token "
    "weights move to a new snapshot while streams continue on the old one until the swap an "
    "expert router picks two experts for every token in every sparse layer of the model "
    "cache blocks of sixteen tokens are reused when the same session returns with a longer "
    "prompt reward advantage value gradient step batch epoch sample temperature logit "
    "probability alpha beta gamma delta one two three four five six seven eight nine ten "
    "hello world what is the answer to this question please think step by step and explain "
    "your reasoning user assistant system tool call result stop length error retry session "
    "replica identity "
).split()


def config(vocab_size: int, *, bos: int, eos: int, pad: int) -> dict[str, Any]:
    """The config.json of this architecture as published configs (and vLLM) have it: transformers 5
    writes the expert count as `num_local_experts`, Qwen3-30B-A3B's published config and vLLM's
    loader say `num_experts`. head_dim 32: vLLM's CPU attention takes 32, 64, 80, ..., not 16."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "decoder_sparse_step": 1,
        "dtype": "bfloat16",
        "eos_token_id": eos,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 8192,
        "mlp_only_layers": [0],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "num_experts": 8,
        "output_router_logits": False,
        "pad_token_id": pad,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def tokenizer_files(vocab_size: int = 512) -> dict[str, bytes]:
    """tokenizer.json and tokenizer_config.json of a byte-level BPE trained on fixed text."""
    return dict(_trained(vocab_size))  # a dict of its own: callers add files to it


@functools.cache
def _trained(vocab_size: int) -> dict[str, bytes]:
    """The files, trained once per process: the same text gives the same tokenizer, and training
    costs 50 ms of CPU, which every reference deployment the tests start (hundreds) paid again."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rng = np.random.default_rng(SEED)
    lines = [" ".join(rng.choice(_WORDS, size=12)) for _ in range(400)]
    tok.train_from_iterator(lines, trainer=trainer)
    tok_config = {
        "add_bos_token": False,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 8192,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return {
        "tokenizer.json": tok.to_str(pretty=True).encode(),
        "tokenizer_config.json": (json.dumps(tok_config, indent=2) + "\n").encode(),
    }


# Layouts `make_base` writes: the reference model, and production models' tensor layouts at widths
# a CPU serves. "qwen3-30b-a3b" has Qwen3-30B-A3B's published structure: 48 layers, every one MoE,
# 128 experts, top-8 with normalised weights, and so its 18,867 tensor names, one layer per
# shard (49 shards, as the suite's 61 GB benchmark base). Widths stay the reference's (hidden 64,
# head_dim 32: vLLM's CPU attention needs >= 32) and the vocabulary the reference tokenizer's.
LAYOUTS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "qwen3-30b-a3b": {
        "num_hidden_layers": 48,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "mlp_only_layers": [],
        "max_window_layers": 48,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    },
}


def weights(cfg: dict[str, Any], seed: int = SEED) -> dict[str, Tensor]:
    """Per-expert hub-layout weights in bf16, as transformers saves them."""
    rng = np.random.default_rng(seed)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    e, mi, di = num_experts(cfg), cfg["moe_intermediate_size"], cfg["intermediate_size"]
    moe = set(moe_layers(cfg))

    def normal(*shape: int, std: float = 0.02) -> Tensor:
        return Tensor.bf16(rng.standard_normal(shape, dtype=np.float32) * std)

    def norm(n: int) -> Tensor:
        return Tensor.bf16(1.0 + rng.standard_normal(n, dtype=np.float32) * 0.05)

    out: dict[str, Tensor] = {"model.embed_tokens.weight": normal(v, h, std=1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(h)
        out[p + "post_attention_layernorm.weight"] = norm(h)
        out[p + "self_attn.q_proj.weight"] = normal(nh * hd, h, std=0.1)
        out[p + "self_attn.k_proj.weight"] = normal(nkv * hd, h, std=0.1)
        out[p + "self_attn.v_proj.weight"] = normal(nkv * hd, h, std=0.1)
        out[p + "self_attn.o_proj.weight"] = normal(h, nh * hd, std=0.1)
        out[p + "self_attn.q_norm.weight"] = norm(hd)
        out[p + "self_attn.k_norm.weight"] = norm(hd)
        if i in moe:
            # A wide router keeps top-k decisions far from ties, so routing comparisons are exact.
            out[p + "mlp.gate.weight"] = normal(e, h, std=0.5)
            for x in range(e):
                out[p + f"mlp.experts.{x}.gate_proj.weight"] = normal(mi, h, std=0.1)
                out[p + f"mlp.experts.{x}.up_proj.weight"] = normal(mi, h, std=0.1)
                out[p + f"mlp.experts.{x}.down_proj.weight"] = normal(h, mi, std=0.1)
        else:
            out[p + "mlp.gate_proj.weight"] = normal(di, h, std=0.1)
            out[p + "mlp.up_proj.weight"] = normal(di, h, std=0.1)
            out[p + "mlp.down_proj.weight"] = normal(h, di, std=0.1)
    out["model.norm.weight"] = norm(h)
    out["lm_head.weight"] = normal(v, h, std=0.1)
    return out


def ensure_base(dst: str | Path, *, layout: str = "tiny") -> Path:
    """The reference base at `dst`, written once: where it is missing it is written beside `dst`
    and renamed into place, so engines started together on one bucket (a fleet) write it once,
    and none reads a half-written base or refuses the one another wrote. One already there is
    used as it is."""
    dst = Path(dst)
    if dst.exists():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        make_base(partial, layout=layout)
        try:
            os.rename(partial, dst)  # atomic; refused when another engine's rename came first
        except OSError:
            if not (dst / "config.json").exists():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return dst


def make_base(dst: str | Path, *, seed: int = SEED, layout: str = "tiny") -> Path:
    """Write the reference base snapshot (hot-load layout) into `dst`, in one of `LAYOUTS`;
    returns its path."""
    from pytest_rlrollout.snapshot import build

    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
    files = tokenizer_files()
    vocab = json.loads(files["tokenizer.json"])["model"]["vocab"]
    added = {t["content"]: t["id"] for t in json.loads(files["tokenizer.json"])["added_tokens"]}
    size = max([*vocab.values(), *added.values()]) + 1
    cfg = config(size, bos=added["<|endoftext|>"], eos=added["<|im_end|>"], pad=added["<|endoftext|>"])
    cfg |= LAYOUTS[layout]
    generation = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}
    files["generation_config.json"] = (json.dumps(generation, indent=2) + "\n").encode()
    return build.write_snapshot(dst, weights(cfg, seed), cfg, files)
