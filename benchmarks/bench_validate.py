"""Structural validation of a Qwen3-30B-A3B-shaped snapshot (48 layers, 128 experts, hidden 2048,
expert intermediate 768, vocab 151936) made of sparse files: ~61 GB declared, no disk used.

    python benchmarks/bench_validate.py

Prints the median of 5 runs of `rlrollout validate` in a fresh process (interpreter start and
imports included; transformers installed and asked about the config's model_type) beside the
floor, parsing the headers' JSON and nothing else, and their ratio. Target: <= 0.5 s.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot import tiny_moe

ROUNDS = 5
LAYERS, EXPERTS, HIDDEN, MOE_I, VOCAB, HEADS, KV, HEAD_DIM = 48, 128, 2048, 768, 151936, 32, 4, 128


def shapes() -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": (HIDDEN,),
            p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": (KV * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": (KV * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": (HEAD_DIM,),
            p + "self_attn.k_norm.weight": (HEAD_DIM,),
            p + "mlp.gate.weight": (EXPERTS, HIDDEN),
        }
        for e in range(EXPERTS):
            out |= {
                p + f"mlp.experts.{e}.gate_proj.weight": (MOE_I, HIDDEN),
                p + f"mlp.experts.{e}.up_proj.weight": (MOE_I, HIDDEN),
                p + f"mlp.experts.{e}.down_proj.weight": (HIDDEN, MOE_I),
            }
    out |= {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB, HIDDEN),
    }
    return out


def write_sparse_snapshot(root: Path) -> tuple[int, int]:
    root.mkdir()
    groups: dict[str, list[str]] = {}
    for name in shapes():
        layer = name.split(".")[2] if name.startswith("model.layers.") else "nonlayer"
        groups.setdefault(layer, []).append(name)
    weight_map, tensor_map, total = {}, {}, 0
    all_shapes = shapes()
    for i, names in enumerate(groups.values(), 1):
        file = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        entries = [st.Entry(n, "BF16", all_shapes[n], st.FileRange(Path("/dev/null"), 0, 0)) for n in names]
        raw, ordered = st.header_bytes(entries, {"format": "pt"})
        size = sum(2 * _prod(e.shape) for e in ordered)
        with open(root / file, "wb") as f:
            f.write(len(raw).to_bytes(8, "little") + raw)
            f.truncate(8 + len(raw) + size)  # sparse: the data is never written
        total += size
        for n in names:
            weight_map[n] = file
            tensor_map[n] = {"shape": list(all_shapes[n]), "dtype": "BF16"}
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (root / "model.weight.spec.json").write_text(json.dumps({"tensor_map": tensor_map}))
    cfg = tiny_moe.config(VOCAB, bos=151643, eos=151645, pad=151643)
    cfg |= {
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_local_experts": EXPERTS,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": MOE_I,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV,
        "head_dim": HEAD_DIM,
        "intermediate_size": 6144,
        "mlp_only_layers": [],
    }
    (root / "config.json").write_text(json.dumps(cfg))
    for name, data in tiny_moe.tokenizer_files().items():
        (root / name).write_bytes(data)
    return len(tensor_map), total


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def raw_parse_limit(root: Path) -> float:
    """The floor: read every header and the index and spec, and parse their JSON; nothing checked."""
    t = time.perf_counter()
    for path in sorted(root.glob("*.safetensors")):
        with open(path, "rb") as f:
            json.loads(f.read(int.from_bytes(f.read(8), "little")))
    for name in ("model.safetensors.index.json", "model.weight.spec.json", "config.json"):
        json.loads((root / name).read_bytes())
    return time.perf_counter() - t


def cli_seconds(*args: str) -> tuple[float, int]:
    """Wall time of `rlrollout validate ARGS` in a fresh interpreter (imports included), and its exit code."""
    rlrollout = Path(sys.executable).parent / "rlrollout"
    command = [str(rlrollout)] if rlrollout.exists() else [sys.executable, "-m", "pytest_rlrollout.cli"]
    t = time.perf_counter()
    done = subprocess.run([*command, "validate", *args], stdout=subprocess.DEVNULL)
    return time.perf_counter() - t, done.returncode


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "qwen3-30b-a3b-shaped"
        t = time.perf_counter()
        n, total = write_sparse_snapshot(root)
        disk = sum(p.stat().st_blocks * 512 for p in root.iterdir())
        print(
            f"snapshot: {n} tensors in {len(list(root.glob('*.safetensors')))} files, {total / 1e9:.1f} GB declared, "
            f"{disk / 1e6:.1f} MB on disk (built in {time.perf_counter() - t:.1f} s)"
        )
        has_transformers = importlib.util.find_spec("transformers") is not None
        print(
            f"transformers installed: {has_transformers} (the config check asks it about model_type, without importing it)"
        )
        floor = statistics.median(raw_parse_limit(root) for _ in range(ROUNDS))
        print(f"{'raw header + index + spec JSON parse (in process, the floor)':64} {floor:6.3f} s")
        target = 0.5
        for label, args in (
            ("rlrollout validate DIR (fresh process, end to end)", [str(root)]),
            ("rlrollout validate DIR --base BASE (a second 57 GB-shaped tree)", [str(root), "--base", str(root)]),
        ):
            runs = [cli_seconds(*args) for _ in range(ROUNDS)]
            assert all(code == 0 for _, code in runs), runs
            wall = statistics.median(s for s, _ in runs)
            verdict = "met" if wall <= target else "MISSED"
            print(f"{label:64} {wall:6.3f} s   {wall / floor:5.1f}x the floor   target <= {target} s: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
