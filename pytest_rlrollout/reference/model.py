"""A minimal numpy Qwen3-MoE: the reference deployment's forward pass.

RMSNorm, RoPE, grouped-query attention with QK-norm, a softmax router with top-k (and
`norm_topk_prob`), SwiGLU experts and dense layers, all in float32. A `Sequence` keeps its own
KV cache; `Model.step` advances many sequences at once (one batched matmul per projection), and
reports, per token, the top-k experts of every MoE layer (the R3 routing matrix). LoRA adapters
in PEFT's layout are applied at request time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from pytest_rlrollout.contract.moe import moe_layers, num_experts
from pytest_rlrollout.snapshot import build, fp8
from pytest_rlrollout.snapshot import safetensors_io as st

DENSE_MOE_ROWS = 64  # below this many tokens, computing every expert is cheaper than gathering


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.einsum("...i,...i->...", x, x)[..., None] / np.float32(x.shape[-1])
    return (x / np.sqrt(var + np.float32(eps))) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _float(t: st.Tensor, scale: st.Tensor | None = None, block: tuple[int, int] = (128, 128)) -> np.ndarray:
    if t.dtype == "F8_E4M3":
        if scale is None:
            raise ValueError("an FP8 tensor needs its scale")
        return fp8.dequantize_blockwise(t.data.reshape(t.shape), scale.float32(), block).astype(np.float32)
    return np.ascontiguousarray(t.float32(), dtype=np.float32)


@dataclass
class Layer:
    input_norm: np.ndarray
    post_norm: np.ndarray
    wqkv: np.ndarray  # [H, (nh + 2 nkv) hd]: one matmul for q, k and v
    wo: np.ndarray  # [nh hd, H]
    q_norm: np.ndarray
    k_norm: np.ndarray
    router: np.ndarray | None = None  # [H, E]
    w_gate_up: np.ndarray | None = None  # MoE: [E, H, 2I]; dense: [H, 2I]
    w_down: np.ndarray | None = None  # MoE: [E, I, H]; dense: [I, H]

    def mlp(self) -> tuple[np.ndarray, np.ndarray]:
        """(w_gate_up, w_down), of a layer that runs."""
        # a cast: a layer holds them once it can run: build_layer leaves them None only to a
        # caller that gives them (numerics.streaming: objects read like arrays)
        return cast("np.ndarray", self.w_gate_up), cast("np.ndarray", self.w_down)


@dataclass
class Lora:
    """A PEFT LoRA adapter: per target module name, (A^T [in, r], B^T [r, out] * scaling)."""

    identity: str
    modules: dict[str, tuple[np.ndarray, np.ndarray]]

    @classmethod
    def load(cls, path: str | Path, identity: str | None = None) -> Lora:
        path = Path(path)
        cfg = json.loads((path / "adapter_config.json").read_text())
        r, alpha = cfg["r"], cfg.get("lora_alpha", cfg["r"])
        scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        tensors: dict[str, st.Tensor] = {}
        for f in sorted(path.glob("adapter_model*.safetensors")):
            tensors |= st.load_file(f)
        modules: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for key, t in tensors.items():
            name = key.removeprefix("base_model.model.")
            if name.endswith(".lora_A.weight"):
                module = name.removesuffix(".lora_A.weight")
                b = tensors[key.replace(".lora_A.weight", ".lora_B.weight")]
                modules[module] = (t.float32().T.copy(), (b.float32().T * scaling).astype(np.float32))
        return cls(identity or path.name, modules)


@dataclass
class Sequence_:
    """One sequence's decoding state: its KV cache per layer (preallocated, grown by doubling;
    positions from `length` on are unused) and its position."""

    k: list[np.ndarray] = field(default_factory=list)  # per layer [nkv, capacity, hd]
    v: list[np.ndarray] = field(default_factory=list)
    length: int = 0

    def reserve(self, layers: int, kv_heads: int, head_dim: int, need: int) -> None:
        capacity = self.k[0].shape[1] if self.k else 0
        if need <= capacity:
            return
        new = max(64, capacity * 2, need)
        for cache in (self.k, self.v):
            for li in range(layers):
                grown = np.zeros((kv_heads, new, head_dim), dtype=np.float32)
                if li < len(cache):
                    grown[:, : self.length] = cache[li][:, : self.length]
                    cache[li] = grown
                else:
                    cache.append(grown)


@dataclass(frozen=True)
class StepOutput:
    logits: np.ndarray  # [n_new, V] for every new token position
    routing: np.ndarray  # [n_new, L_moe, k] uint8 expert indices, top-k order


class Model:
    """The forward pass over weights held in memory (`tensors`). A subclass may give `embed`,
    `lm_head` and `layers` as objects that read the weights when they are used instead
    (numerics.streaming: a model larger than the memory)."""

    dense_moe_rows = DENSE_MOE_ROWS
    _cos: np.ndarray  # the RoPE table, built on first use and grown as positions need (_rope_table)
    _sin: np.ndarray

    def __init__(self, config: Mapping[str, Any], tensors: Mapping[str, st.Tensor]):
        self._configure(config)
        c = self.config
        w = self.weight_reader(tensors)
        self.embed = w("model.embed_tokens.weight")
        self.final_norm = w("model.norm.weight")
        self.lm_head = (
            w("model.embed_tokens.weight") if c.get("tie_word_embeddings") else w("lm_head.weight")
        ).T.copy()
        self.layers: Sequence[Layer] = [self.build_layer(i, w) for i in range(c["num_hidden_layers"])]

    def _configure(self, config: Mapping[str, Any]) -> None:
        self.config = dict(config)
        c = self.config
        self.hidden, self.heads, self.kv_heads = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or self.hidden // self.heads
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.experts, self.top_k = num_experts(c), c.get("num_experts_per_tok", 0)
        self.norm_topk = bool(c.get("norm_topk_prob", False))
        self.moe_layers = moe_layers(c)
        theta = (c.get("rope_parameters") or {}).get("rope_theta") or c.get("rope_theta", 10000.0)
        self.inv_freq = (1.0 / theta ** (np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)).astype(
            np.float32
        )
        quant = c.get("quantization_config") or {}
        self.block = tuple(quant.get("weight_block_size") or (128, 128))

    def weight_reader(self, tensors: Mapping[str, st.Tensor]) -> Callable[[str], np.ndarray]:
        """`w(name)`: the tensor `name` as float32 (FP8 ones scaled by their `_scale_inv`)."""

        def w(name: str) -> np.ndarray:
            return _float(tensors[name], tensors.get(name + "_scale_inv") or tensors.get(name + "_scale"), self.block)

        return w

    def build_layer(self, i: int, w: Callable[[str], np.ndarray], *, experts: bool = True) -> Layer:
        """Layer `i` from `w` (see `weight_reader`); without `experts`, an MoE layer's experts are
        left for the caller to give (`w_gate_up` and `w_down`, indexed by expert)."""
        p = f"model.layers.{i}."
        qkv = np.concatenate([w(p + f"self_attn.{x}_proj.weight") for x in "qkv"], axis=0).T.copy()
        layer = Layer(
            input_norm=w(p + "input_layernorm.weight"),
            post_norm=w(p + "post_attention_layernorm.weight"),
            wqkv=qkv,
            wo=w(p + "self_attn.o_proj.weight").T.copy(),
            q_norm=w(p + "self_attn.q_norm.weight"),
            k_norm=w(p + "self_attn.k_norm.weight"),
        )
        if i in self.moe_layers:
            layer.router = w(p + "mlp.gate.weight").T.copy()
            if experts:
                layer.w_gate_up = np.ascontiguousarray(
                    np.stack([self.expert_gate_up(w, i, e) for e in range(self.experts)])
                )
                layer.w_down = np.ascontiguousarray(np.stack([self.expert_down(w, i, e) for e in range(self.experts)]))
        else:
            layer.w_gate_up = np.concatenate([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]).T.copy()
            layer.w_down = w(p + "mlp.down_proj.weight").T.copy()
        return layer

    @staticmethod
    def expert_gate_up(w: Callable[[str], np.ndarray], i: int, e: int) -> np.ndarray:
        p = f"model.layers.{i}.mlp.experts.{e}."
        return np.concatenate([w(p + "gate_proj.weight"), w(p + "up_proj.weight")]).T

    @staticmethod
    def expert_down(w: Callable[[str], np.ndarray], i: int, e: int) -> np.ndarray:
        return w(f"model.layers.{i}.mlp.experts.{e}.down_proj.weight").T

    @classmethod
    def load(cls, snapshot: str | Path) -> Model:
        snapshot = Path(snapshot)
        return cls(json.loads((snapshot / "config.json").read_text()), build.read_snapshot(snapshot))

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[0]

    # ----------------------------------------------------------------------- forward

    def _rope_table(self, upto: int) -> tuple[np.ndarray, np.ndarray]:
        if getattr(self, "_cos", None) is None or self._cos.shape[0] < upto:
            n = max(upto, 2 * (0 if getattr(self, "_cos", None) is None else self._cos.shape[0]), 512)
            freqs = np.arange(n, dtype=np.float32)[:, None] * self.inv_freq[None, :]
            self._cos, self._sin = np.cos(freqs), np.sin(freqs)
        return self._cos, self._sin

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x: [N, heads, hd] at the given positions; rotate_half convention (as transformers' Qwen)."""
        cos_t, sin_t = self._rope_table(int(positions.max()) + 1)
        cos, sin = cos_t[positions][:, None, :], sin_t[positions][:, None, :]
        half = self.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def _proj(self, x: np.ndarray, weight: np.ndarray, module: str, lora: Lora | None) -> np.ndarray:
        y = x @ weight
        if lora is not None and module in lora.modules:
            a, b = lora.modules[module]
            y = y + (x @ a) @ b
        return y

    def step(
        self, seqs: Sequence[Sequence_], tokens: Sequence[Sequence[int]], lora: Lora | None = None
    ) -> list[StepOutput]:
        """Feed each sequence its new tokens (a prompt chunk or one decoded token), batched."""
        counts = [len(t) for t in tokens]
        ids = np.fromiter((t for ts in tokens for t in ts), dtype=np.int64, count=sum(counts))
        x = self.embed[ids]
        offsets = np.cumsum([0, *counts])
        nkv, hd = self.kv_heads, self.head_dim
        positions = np.concatenate([np.arange(s.length, s.length + n) for s, n in zip(seqs, counts, strict=True)])
        for seq, n in zip(seqs, counts, strict=True):
            seq.reserve(len(self.layers), nkv, hd, seq.length + n)
        decoding = [i for i, n in enumerate(counts) if n == 1]
        if decoding:  # the batched attention slices every decoding sequence to the longest one
            t_max = max(seqs[i].length + 1 for i in decoding)
            for i in decoding:
                seqs[i].reserve(len(self.layers), nkv, hd, t_max)
        routes: list[np.ndarray] = []
        for li, layer in enumerate(self.layers):
            p = f"model.layers.{li}."
            h = _rmsnorm(x, layer.input_norm, self.eps)
            if lora is None or not any(m.startswith(p) for m in lora.modules):
                qkv = h @ layer.wqkv
            else:
                qkv = np.concatenate(
                    [self._proj(h, layer.wqkv[:, s], p + f"self_attn.{n}_proj", lora) for n, s in self._qkv_slices()],
                    axis=1,
                )
            attn = self._attention(seqs, counts, offsets, positions, decoding, li, qkv, layer)
            x = x + self._proj(attn, layer.wo, p + "self_attn.o_proj", lora)
            h = _rmsnorm(x, layer.post_norm, self.eps)
            if layer.router is not None:
                out, idx = self._moe(h, layer)
                routes.append(idx)
            else:
                gu = h @ layer.w_gate_up
                inter = gu.shape[1] // 2
                out = (_silu(gu[:, :inter]) * gu[:, inter:]) @ layer.w_down
            x = x + out
        for seq, n in zip(seqs, counts, strict=True):
            seq.length += n
        logits = _rmsnorm(x, self.final_norm, self.eps) @ self.lm_head
        routing = np.stack(routes, axis=1).astype(np.uint8) if routes else np.zeros((len(ids), 0, self.top_k), np.uint8)
        return [
            StepOutput(logits[offsets[i] : offsets[i + 1]], routing[offsets[i] : offsets[i + 1]])
            for i in range(len(seqs))
        ]

    def _qkv_slices(self):
        nq, nk = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [("q", slice(0, nq)), ("k", slice(nq, nq + nk)), ("v", slice(nq + nk, nq + 2 * nk))]

    def _attention(self, seqs, counts, offsets, positions, decoding, li: int, qkv: np.ndarray, layer: Layer):
        """Causal GQA attention for every sequence; the single-token (decode) sequences run as one
        padded batch, prompt chunks one sequence at a time."""
        nh, nkv, hd = self.heads, self.kv_heads, self.head_dim
        n = qkv.shape[0]
        q = _rmsnorm(qkv[:, : nh * hd].reshape(n, nh, hd), layer.q_norm, self.eps)
        k = _rmsnorm(qkv[:, nh * hd : (nh + nkv) * hd].reshape(n, nkv, hd), layer.k_norm, self.eps)
        v = qkv[:, (nh + nkv) * hd :].reshape(n, nkv, hd)
        q, k = self._rope(q, positions), self._rope(k, positions)
        for si, seq in enumerate(seqs):
            a, b = offsets[si], offsets[si + 1]
            seq.k[li][:, seq.length : seq.length + b - a] = k[a:b].transpose(1, 0, 2)
            seq.v[li][:, seq.length : seq.length + b - a] = v[a:b].transpose(1, 0, 2)
        group, scale = nh // nkv, np.float32(1.0 / math.sqrt(hd))
        out = np.empty((n, nh * hd), dtype=np.float32)
        if decoding:
            rows = offsets[decoding]
            lengths = np.array([seqs[i].length + 1 for i in decoding])
            t_max = int(lengths.max())
            keys = np.stack([seqs[i].k[li][:, :t_max] for i in decoding])  # [B, nkv, T, hd]
            values = np.stack([seqs[i].v[li][:, :t_max] for i in decoding])
            qb = q[rows].reshape(len(decoding), nkv, group, hd)
            scores = (qb @ keys.transpose(0, 1, 3, 2)) * scale  # [B, nkv, group, T]
            pad = np.arange(t_max)[None, :] >= lengths[:, None]
            scores = np.where(pad[:, None, None, :], np.float32(-np.inf), scores)
            out[rows] = (_softmax(scores) @ values).reshape(len(decoding), nh * hd)
        batched = set(decoding)
        for si, seq in enumerate(seqs):
            t = counts[si]
            if si in batched or t == 0:
                continue
            a = offsets[si]
            total = seq.length + t
            keys, values = seq.k[li][:, :total], seq.v[li][:, :total]
            qs = q[a : a + t].transpose(1, 0, 2).reshape(nkv, group * t, hd)
            scores = (qs @ keys.transpose(0, 2, 1)) * scale  # [nkv, group*t, total]
            causal = np.arange(total)[None, :] > np.arange(seq.length, total)[:, None]
            scores = np.where(np.tile(causal, (group, 1))[None], np.float32(-np.inf), scores)
            o = _softmax(scores) @ values  # [nkv, group*t, hd]
            out[a : a + t] = o.reshape(nh, t, hd).transpose(1, 0, 2).reshape(t, nh * hd)
        return out

    def _moe(self, h: np.ndarray, layer: Layer) -> tuple[np.ndarray, np.ndarray]:
        probs = _softmax(h @ layer.router)  # [T, E]
        k = self.top_k
        # top-k by probability, descending; ties go to the lower expert index (as torch.topk)
        idx = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        weights = np.take_along_axis(probs, idx, axis=-1)
        if self.norm_topk:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        gate_up, down = layer.mlp()
        inter = gate_up.shape[2] // 2
        if h.shape[0] <= self.dense_moe_rows:
            # Few tokens: run every expert on every token in three batched calls and weight the
            # unselected ones by zero; far fewer numpy calls than gathering tokens per expert.
            gu = np.matmul(h[None], gate_up)  # [E, T, 2I]
            y = np.matmul(_silu(gu[..., :inter]) * gu[..., inter:], down)  # [E, T, H]
            mix = np.zeros((h.shape[0], gate_up.shape[0]), dtype=np.float32)
            np.put_along_axis(mix, idx, weights.astype(np.float32), axis=-1)
            return np.einsum("te,eth->th", mix, y), idx
        out = np.zeros_like(h)
        for e in np.unique(idx):
            rows, slot = np.nonzero(idx == e)
            gu = h[rows] @ gate_up[e]
            y = (_silu(gu[:, :inter]) * gu[:, inter:]) @ down[e]
            out[rows] += y * weights[rows, slot][:, None]
        return out, idx

    def clone_sequence(self, seq: Sequence_, length: int) -> Sequence_:
        """A sequence holding the first `length` positions of `seq`'s cache (prefix reuse)."""
        return Sequence_([k[:, :length].copy() for k in seq.k], [v[:, :length].copy() for v in seq.v], length)
