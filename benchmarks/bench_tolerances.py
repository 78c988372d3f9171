"""Where the suite's dtype-following tolerances come from (numerics/tolerances.py): how far apart
the logprobs of healthy implementations are, measured here on the reference model and on its
Qwen3-30B-A3B-shaped layout (48 layers, 128 experts, top-8: production depth).

    python benchmarks/bench_tolerances.py [prompts]

Two figures per precision, each the largest |Δlogprob| over every scored token (and its 99th
percentile), over seeded random prompts of 48 token ids:

- *itself*: one implementation (transformers on the CPU) in that precision, a prompt scored whole
  against the same prompt scored as a prefix and then the rest through the KV cache. Kernels see
  other shapes and sum in another order, as a deployment's do between load paths, batch sizes and
  cache hits: the fingerprint tolerance (FID, the deployment against itself).
- *against fp32*: that precision against the suite's local scorer (the numpy engine in float32),
  the same weights: what a healthy engine serving that precision differs from the local scorer
  by: the logprob tolerance (NUM-LOGPROB-1, CTL-LABEL-1).

Then each tolerance the suite uses beside the largest figure measured here, and their ratio.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers

from pytest_rlrollout.numerics.scorer import NumpyScorer
from pytest_rlrollout.numerics.tolerances import TOLERANCES
from pytest_rlrollout.snapshot import tiny_moe

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOKENS, SPLIT = 48, 20


def logprobs(logits: torch.Tensor, ids: list[int]) -> np.ndarray:
    lp = torch.log_softmax(logits.double(), -1).numpy()
    return lp[np.arange(len(ids) - 1), np.asarray(ids[1:])]


def measure(base: Path, prompts: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(20261127)
    vocab = transformers.AutoConfig.from_pretrained(base).vocab_size
    seqs = [[int(x) for x in rng.integers(3, vocab, TOKENS)] for _ in range(prompts)]
    local = NumpyScorer(base)
    fp32 = [local.score(s).logprobs[1:] for s in seqs]
    out = {}
    for name, dtype in DTYPES.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=dtype).eval()
        itself, against = [], []
        with torch.no_grad():
            for s, ref in zip(seqs, fp32, strict=True):
                whole = model(torch.tensor([s])).logits[0]
                first = model(torch.tensor([s[:SPLIT]]), use_cache=True)
                rest = model(torch.tensor([s[SPLIT:]]), past_key_values=first.past_key_values).logits[0]
                split = torch.cat([first.logits[0], rest])
                a, b = logprobs(whole, s), logprobs(split, s)
                itself.append(np.abs(a - b))
                against.append(np.abs(a - ref))
        out[name] = (np.concatenate(itself), np.concatenate(against))
    return out


def main() -> int:
    prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    worst: dict[str, list[float]] = {d: [0.0, 0.0] for d in DTYPES}
    with tempfile.TemporaryDirectory() as tmp:
        for layout in ("tiny", "qwen3-30b-a3b"):
            base = tiny_moe.make_base(Path(tmp) / layout, layout=layout)
            print(f"{layout}: {prompts} prompts x {TOKENS} tokens (whole vs {SPLIT} then the rest through the cache)")
            for name, (itself, against) in measure(base, prompts).items():
                print(
                    f"  {name:9} itself: max {itself.max():.2e}  p99 {np.quantile(itself, 0.99):.2e}   "
                    f"against the fp32 scorer: max {against.max():.2e}  p99 {np.quantile(against, 0.99):.2e}"
                )
                worst[name] = [max(worst[name][0], float(itself.max())), max(worst[name][1], float(against.max()))]
    print("\nthe suite's tolerances (numerics/tolerances.py) against the largest |Δ| measured here")
    for name, (itself, against) in worst.items():
        t = TOLERANCES[name]
        print(
            f"  {name:9} fingerprint {t.fingerprint:g} = {t.fingerprint / max(itself, 1e-12):.1f}x {itself:.2e};  "
            f"logprob {t.logprob:g} = {t.logprob / max(against, 1e-12):.1f}x {against:.2e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
