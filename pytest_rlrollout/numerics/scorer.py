"""Local scorers: teacher-forced logprobs and router top-k of a token sequence, from a snapshot
on this machine. The numpy engine is the reference deployment's own forward pass (fast for the
reference model, and exact where the deployment is); the streaming scorer is the same forward
pass reading its weights layer by layer from the safetensors files (a model larger than the
memory: numerics.streaming); the transformers scorer loads any Hugging Face snapshot in float32
with torch, on the CPU unless told otherwise.

Routing is expert *indices* per input position: row i is the top-k the router chose while
token i was the input (the order within a row is left as each scorer gives it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from pytest_rlrollout.contract.moe import moe_shape

SCORERS = ("auto", "numpy", "streaming", "transformers")
NUMPY_MAX_PARAMETERS = 200_000_000  # above this the numpy engine is too slow to be the default


@dataclass(frozen=True)
class Scored:
    logprobs: np.ndarray  # [n]: log p(ids[i] | ids[:i]); NaN at i = 0
    routing: np.ndarray | None  # [n, L_moe, k] expert indices per input position; None: dense


class Scorer(Protocol):
    name: str

    def score(self, ids: list[int]) -> Scored: ...


def _gather(logprobs: np.ndarray, ids: list[int]) -> np.ndarray:
    out = np.full(len(ids), np.nan)
    out[1:] = logprobs[np.arange(len(ids) - 1), np.asarray(ids[1:])]
    return out


class NumpyScorer:
    """The reference deployment's numpy engine (reference/model.py), one prefill per sequence."""

    name = "numpy"

    def __init__(self, snapshot: str | Path, adapter: str | Path | None = None, *, streamed: bool = False):
        from pytest_rlrollout.reference.model import Lora, Model

        if streamed:
            from pytest_rlrollout.numerics.streaming import StreamedModel

            self.name = "streaming"
            self.model: Model = StreamedModel(snapshot)
        else:
            self.model = Model.load(snapshot)
        self.lora = Lora.load(adapter) if adapter is not None else None

    def score(self, ids: list[int]) -> Scored:
        from pytest_rlrollout.reference.model import Sequence_, log_softmax

        out = self.model.step([Sequence_()], [list(ids)], self.lora)[0]
        lp = log_softmax(out.logits.astype(np.float64))
        return Scored(_gather(lp, ids), out.routing if out.routing.shape[1] else None)


class TransformersScorer:
    """transformers' AutoModelForCausalLM in float32 on `device` (`cpu`, `cuda`, `cuda:1`…)."""

    name = "transformers"

    def __init__(self, snapshot: str | Path, device: str = "cpu"):
        try:
            import torch
            import transformers
        except ImportError as e:
            raise RuntimeError(f"the transformers scorer needs torch and transformers installed ({e})") from None
        self.torch, self.device = torch, device
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(snapshot), dtype=torch.float32)
        self.model.to(device).eval()
        shape = moe_shape(json.loads((Path(snapshot) / "config.json").read_text()))
        self.k = shape.k if shape is not None else 0

    def score(self, ids: list[int]) -> Scored:
        torch = self.torch
        with torch.no_grad():
            out = self.model(torch.tensor([list(ids)], device=self.device), output_router_logits=self.k > 0)
        lp = torch.log_softmax(out.logits[0].double(), -1).cpu().numpy()
        routing = None
        if self.k and getattr(out, "router_logits", None):
            tops = [torch.topk(torch.softmax(r.float(), -1), self.k).indices.cpu().numpy() for r in out.router_logits]
            routing = np.stack([t.reshape(len(ids), self.k) for t in tops], axis=1).astype(np.int64)
        return Scored(_gather(lp, ids), routing)


def parameters(snapshot: Path) -> int:
    """The parameter count the snapshot's safetensors index (or files) declare."""
    from pytest_rlrollout.snapshot import safetensors_io as st

    total = 0
    for f in sorted(Path(snapshot).glob("*.safetensors")):
        total += sum(int(np.prod(t.shape)) for t in st.read_header(f).tensors.values())
    return total


def local_scorer(
    snapshot: str | Path, kind: str = "auto", device: str = "cpu", adapter: str | Path | None = None
) -> Scorer:
    """A scorer for `snapshot` (plus a PEFT LoRA `adapter`): `numpy` (the reference engine, the
    weights in memory), `streaming` (the same, reading them layer by layer), `transformers`, or
    `auto`: transformers on a device other than the CPU, else (or with an adapter) numpy for a
    model of at most NUMPY_MAX_PARAMETERS parameters and streaming above (its memory is a
    layer's, not the model's)."""
    if kind not in SCORERS:
        raise ValueError(f"unknown scorer {kind!r} (known: {', '.join(SCORERS)})")
    snapshot = Path(snapshot)
    if kind == "auto":
        if device != "cpu" and adapter is None:
            kind = "transformers"
        else:
            kind = "numpy" if parameters(snapshot) <= NUMPY_MAX_PARAMETERS else "streaming"
    if kind == "transformers" and adapter is not None:
        raise ValueError("the transformers scorer scores full snapshots; use the numpy scorer with an adapter")
    if kind == "transformers":
        return TransformersScorer(snapshot, device)
    return NumpyScorer(snapshot, adapter, streamed=kind == "streaming")
