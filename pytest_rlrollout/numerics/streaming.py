"""A scorer for models larger than this machine's memory: the reference engine's forward pass
(reference/model.py) reading its weights from the safetensors files as it goes, one layer at a
time, and within an MoE layer one expert at a time, only the experts its tokens were routed to.
The embeddings are read row by row and the LM head in blocks of rows, so what is held at once
is bounded by a layer's attention and one block, not by the model.

On Qwen3-30B-A3B (61 GB in bf16) the transformers scorer in float32 would need ~122 GB."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from pytest_rlrollout.reference.model import Layer, Model
from pytest_rlrollout.snapshot import build, dtypes
from pytest_rlrollout.snapshot import safetensors_io as st

HEAD_ROWS = 8192  # LM-head rows (vocabulary entries) scored per block: 64 MiB in float32 at hidden 2048


class Weights:
    """The tensors of a snapshot on this machine, read one at a time (nothing kept)."""

    def __init__(self, snapshot: Path):
        files = build.weight_map(snapshot)
        headers = {f: st.read_header(snapshot / f) for f in sorted(set(files.values()))}
        self.where = {name: (snapshot / file, headers[file].tensors[name]) for name, file in files.items()}

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def tensor(self, name: str) -> st.Tensor:
        path, info = self.where[name]
        return st.read_tensor(info, path)

    def rows(self, name: str, start: int, stop: int) -> st.Tensor:
        """Rows [start, stop) of a 2-D tensor, read alone."""
        path, info = self.where[name]
        width = int(np.prod(info.shape[1:]))
        size = dtypes.nbytes(info.dtype, (1, width))
        with open(path, "rb") as f:
            f.seek(info.start + start * size)
            raw = f.read((stop - start) * size)
        shape = (stop - start, *info.shape[1:])
        return st.Tensor(info.dtype, shape, np.frombuffer(raw, dtypes.BY_CODE[info.dtype].numpy).reshape(shape))


class _Tensors:
    """A mapping view of `Weights` for `Model.weight_reader` (each read when asked for)."""

    def __init__(self, weights: Weights):
        self.weights = weights

    def __getitem__(self, name: str) -> st.Tensor:
        return self.weights.tensor(name)

    def get(self, name: str, default: st.Tensor | None = None) -> st.Tensor | None:
        return self.weights.tensor(name) if name in self.weights else default


class _Embeddings:
    """`embed[ids]`: only the rows asked for are read."""

    def __init__(self, model: StreamedModel, name: str):
        self.model, self.name = model, name
        self.shape = tuple(model.weights.where[name][1].shape)

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        out = np.empty((len(ids), self.shape[1]), np.float32)
        for i, t in enumerate(ids):
            out[i] = self.model.weights.rows(self.name, int(t), int(t) + 1).float32()[0]
        return out


class _Head:
    """`x @ lm_head`, the head read `HEAD_ROWS` vocabulary rows at a time."""

    __array_ufunc__ = None  # `ndarray @ _Head` comes here (__rmatmul__), not to numpy

    def __init__(self, model: StreamedModel, name: str):
        self.model, self.name = model, name
        rows = model.weights.where[name][1].shape[0]
        self.shape = (model.hidden, rows)

    def __rmatmul__(self, x: np.ndarray) -> np.ndarray:
        vocab = self.shape[1]
        out = np.empty((x.shape[0], vocab), np.float32)
        for a in range(0, vocab, HEAD_ROWS):
            b = min(vocab, a + HEAD_ROWS)
            out[:, a:b] = x @ self.model.weights.rows(self.name, a, b).float32().T
        return out


class _Experts:
    """An MoE layer's experts, `[e]` read when the layer's tokens were routed to `e`."""

    def __init__(self, model: StreamedModel, layer: int, down: bool):
        self.model, self.layer, self.down = model, layer, down
        c = model.config
        inter = c.get("moe_intermediate_size") or c["intermediate_size"]
        self.shape = (model.experts, inter, model.hidden) if down else (model.experts, model.hidden, 2 * inter)

    def __getitem__(self, e: int) -> np.ndarray:
        read = Model.expert_down if self.down else Model.expert_gate_up
        return np.ascontiguousarray(read(self.model.w, self.layer, int(e)))


class _Layers(Sequence[Layer]):
    """Layer i, read when the forward pass comes to it and dropped after."""

    def __init__(self, model: StreamedModel):
        self.model = model

    def __len__(self) -> int:
        return self.model.config["num_hidden_layers"]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        m = self.model
        layer = m.build_layer(i, m.w, experts=False)
        if layer.router is not None:
            layer.w_gate_up, layer.w_down = _Experts(m, i, down=False), _Experts(m, i, down=True)
        return layer

    def __iter__(self) -> Iterator[Layer]:
        return (self[i] for i in range(len(self)))


class StreamedModel(Model):
    """`Model` over weights read from `snapshot` as they are used."""

    dense_moe_rows = 0  # every expert on every token would read every expert: only the routed ones

    def __init__(self, snapshot: str | Path):
        snapshot = Path(snapshot)
        self._configure(json.loads((snapshot / "config.json").read_text()))
        self.weights = Weights(snapshot)
        self.w = self.weight_reader(_Tensors(self.weights))  # type: ignore[arg-type]
        self.embed = _Embeddings(self, "model.embed_tokens.weight")  # type: ignore[assignment]
        self.final_norm = self.w("model.norm.weight")
        head = "model.embed_tokens.weight" if self.config.get("tie_word_embeddings") else "lm_head.weight"
        self.lm_head = _Head(self, head)  # type: ignore[assignment]
        self.layers = _Layers(self)
