"""Weights as the weight-fidelity fault switches corrupt them at load time: a diff applied onto
the wrong snapshot, experts that keep the weights loaded before, experts read in the wrong
layout. The loads themselves live in the controller; these only say what a broken load serves."""

from __future__ import annotations

import copy
from dataclasses import fields, replace

import numpy as np

from pytest_rlrollout.reference.model import Model


def xor_weights(base: Model, parent: Model, target: Model) -> Model:
    """`target`'s diff applied onto `base` bit for bit: base ^ parent ^ target on every weight
    (float32 arrays widened from bfloat16 XOR as their bfloat16 bits do)."""

    def xor(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        bits = np.ascontiguousarray(a).view(np.uint32) ^ np.ascontiguousarray(b).view(np.uint32)
        return (bits ^ np.ascontiguousarray(c).view(np.uint32)).view(np.float32)

    out = copy.copy(target)
    for name in ("embed", "final_norm", "lm_head"):
        setattr(out, name, xor(getattr(base, name), getattr(parent, name), getattr(target, name)))
    out.layers = []
    for b, p, t in zip(base.layers, parent.layers, target.layers, strict=True):
        names = [f.name for f in fields(t) if getattr(t, f.name) is not None]
        out.layers.append(replace(t, **{n: xor(getattr(b, n), getattr(p, n), getattr(t, n)) for n in names}))
    return out


def moe_layers(model: Model) -> list[int]:
    """Indices of the layers with a router (the MoE layers)."""
    return [i for i, layer in enumerate(model.layers) if layer.router is not None]


def keep_experts(model: Model, kept: Model, layers: list[int]) -> Model:
    """`model` with the experts (not the router) of `layers` taken from `kept`: a reload that
    does not reach the fused expert tensors, as vLLM 0.32's CPU backend was measured to do."""
    out = copy.copy(model)
    out.layers = list(model.layers)
    for i in layers:
        out.layers[i] = replace(model.layers[i], w_gate_up=kept.layers[i].w_gate_up, w_down=kept.layers[i].w_down)
    return out


def misread_experts(model: Model, layers: list[int]) -> Model:
    """`model` with the experts of `layers` read in another layout than they were written in: each
    expert's [H, 2I] and [I, H] matrices reinterpreted as [2I, H] and [H, I] and transposed back.
    vLLM 0.32's CPU backend was measured to serve a reload so: the fused expert tensors keep the
    checkpoint's layout where its MoE kernel expects a prepacked one, so that even a reload of the
    weights it started from changes the numbers."""
    out = copy.copy(model)
    out.layers = list(model.layers)
    for i in layers:
        layer = model.layers[i]
        gate_up, down = layer.mlp()
        out.layers[i] = replace(
            layer,
            w_gate_up=np.ascontiguousarray(gate_up)
            .reshape(gate_up.shape[0], gate_up.shape[2], gate_up.shape[1])
            .transpose(0, 2, 1)
            .copy(),
            w_down=np.ascontiguousarray(down)
            .reshape(down.shape[0], down.shape[2], down.shape[1])
            .transpose(0, 2, 1)
            .copy(),
        )
    return out
