"""Checks on LoRA adapters: SNAP-LORA-1 (the kind), SNAP-LORA-2 (weights), SNAP-LORA-3 (fits the base)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from pytest_rlrollout.snapshot import untrusted
from pytest_rlrollout.snapshot.layout import ADAPTER_CONFIG, INDEX, UnsafePath
from pytest_rlrollout.snapshot.validate.core import Inconclusive, Problem, Subject, check, names, schema_problems


@check("SNAP-LORA-1")
def _lora_kind(s: Subject) -> Iterator[Problem]:
    if s.kind == "lora":
        stray = [
            n
            for n in s.dir.listing
            if n == INDEX or (n.endswith(".safetensors") and n not in s.dir.adapter_weight_files)
        ]
        if stray:
            yield Problem(ADAPTER_CONFIG, f"makes this a LoRA adapter, so {names(stray)} would be ignored")
    elif s.dir.adapter_weight_files:
        yield Problem(
            None,
            f"holds {names(s.dir.adapter_weight_files)} but no adapter_config.json, so it would load as a full snapshot",
        )


@check("SNAP-LORA-2", frozenset({"lora"}))
def _lora_weights(s: Subject) -> Iterator[Problem]:
    if not s.dir.adapter_weight_files:
        yield Problem(
            None,
            "no adapter weights: expected adapter_model.safetensors, adapter_model-*.safetensors or adapter_model.bin",
        )


def _module_names(tensors: Iterable[str]) -> set[str]:
    """Every name a target_modules entry `t` can have to match one of `tensors` as PEFT matches it
    (`.{t}.weight` inside a name, or a name starting with `{t}.`). Built from the base, so that
    however many entries an adapter_config lists, matching each costs one set lookup."""
    out: set[str] = set()
    for b in tensors:
        dots = [i for i, c in enumerate(b) if c == "."]
        out.update(b[:i] for i in dots)
        ends = [i for i in dots if b.startswith(".weight", i)]
        out.update(b[i + 1 : j] for j in ends for i in dots if i < j)
    return out


def _adapter_target(key: str) -> tuple[str, str] | None:
    """('model.layers.0.self_attn.q_proj', 'A') for a PEFT key, or None for other keys."""
    name = key.removeprefix("base_model.model.")
    for part in ("A", "B"):
        for marker in (f".lora_{part}.weight", f".lora_{part}.default.weight"):
            if name.endswith(marker):
                return name[: -len(marker)], part
    return None


@check("SNAP-LORA-3", frozenset({"lora"}))
def _lora_fits_base(s: Subject) -> Iterator[Problem]:
    try:
        cfg = s.dir.read_json(ADAPTER_CONFIG)
    except (ValueError, UnsafePath) as e:
        yield Problem(ADAPTER_CONFIG, str(e))
        return
    problems = list(schema_problems("adapter-config", cfg))
    for problem in problems:
        yield Problem(ADAPTER_CONFIG, problem.message)
    if not isinstance(cfg, dict):
        return
    name = cfg.get("base_model_name_or_path")
    if isinstance(name, str) and name and s.ctx.base_model and name not in s.ctx.base_model:
        yield Problem(
            ADAPTER_CONFIG,
            f"base_model_name_or_path is {untrusted.shown(name)}; the deployment serves {names(s.ctx.base_model)}",
        )
    if s.base is None:
        return  # module and shape checks need the base
    try:
        base = s.base.tensors
    except Inconclusive:
        raise Inconclusive("the base snapshot's tensors could not be read") from None
    targets = cfg.get("target_modules")
    if isinstance(targets, list):
        modules = _module_names(base)
        absent = [t for t in dict.fromkeys(t for t in targets if isinstance(t, str)) if t not in modules]
        if absent:
            yield Problem(ADAPTER_CONFIG, f"target_modules {untrusted.shown(absent)} match no module of the base model")
    r = cfg.get("r") if not cfg.get("rank_pattern") else None
    for file in s.dir.adapter_weight_files:
        h = s.headers.get(file)
        if h is None:
            continue  # unreadable safetensors are SNAP-SAFETENSORS-1's; .bin is listed, never unpickled
        for key, t in sorted(h.tensors.items()):
            target = _adapter_target(key)
            if target is None:
                continue
            module, part = target
            if module.endswith(".experts"):
                continue  # fused-expert ParamWrapper adapters have no per-module base tensor
            base_t = base.get(f"{module}.weight")
            if base_t is None:
                yield Problem(file, f"{key}: the base has no {module}.weight")
                continue
            if not (base_t[1] and t.shape):
                yield Problem(
                    file, f"{key}: shape {list(t.shape)} on {module} {list(base_t[1])}: a LoRA factor is a matrix"
                )
                continue
            out_f, in_f = base_t[1][0], base_t[1][-1]
            rank = r if isinstance(r, int) else (t.shape[0] if part == "A" else t.shape[-1])
            want = (rank, in_f) if part == "A" else (out_f, rank)
            if t.shape != want:
                yield Problem(
                    file, f"{key}: shape {list(t.shape)}, rank {rank} on {module} {list(base_t[1])} needs {list(want)}"
                )
