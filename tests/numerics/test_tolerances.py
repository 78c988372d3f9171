"""The tolerances follow the precision the deployment serves in: the base's config.json by
default, `rl_served_dtype` when the deployment computes in another (the reference computes in
float32), an ini key for a figure of one's own; the report says which and where from. And the
bf16 figure covers a healthy bf16 implementation against the float32 local scorer, which the
float32 figure would fail."""

import json

import numpy as np
import pytest

from pytest_rlrollout.numerics.tolerances import TOLERANCES, dtype_name, served_dtype
from pytest_rlrollout.snapshot import tiny_moe

SHOW = "def test_x(rl_config):\n    n = rl_config.numerics\n    print('NUM', n.dtype, n.fingerprint_tolerance, n.logprob_tolerance, '|', n.source)\n"
LIVE = ["--rl-base-url=http://127.0.0.1:9", "--rl-model=m", "--rl-engine=vllm"]


def numerics(pytester, *args) -> str:
    pytester.makepyfile(test_user=SHOW)
    result = pytester.runpytest_inprocess("-s", "-p", "no:randomly", *args)
    line = next(line for line in result.outlines if "NUM " in line)
    return line[line.index("NUM ") :]


def test_the_names_of_a_precision():
    assert dtype_name("bf16") == dtype_name("torch.bfloat16") == "bfloat16" and dtype_name("half") == "float16"
    assert served_dtype({"torch_dtype": "bfloat16"}) == served_dtype({"dtype": "bfloat16"}) == "bfloat16"
    assert served_dtype({}) is None and served_dtype({"torch_dtype": "int4"}) is None
    with pytest.raises(ValueError, match="no tolerances for dtype 'int4'"):
        dtype_name("int4")


def test_the_served_dtype_decides_the_tolerances(pytester, base_snapshot, monkeypatch):
    monkeypatch.setattr("pytest_rlrollout.suite.plugin._preflight", lambda config: None)  # no deployment here
    base = f"--rl-base-snapshot={base_snapshot}"
    assert json.loads((base_snapshot / "config.json").read_text())["dtype"] == "bfloat16"
    bf16 = TOLERANCES["bfloat16"]
    assert numerics(pytester, *LIVE, base).startswith(
        f"NUM bfloat16 {bf16.fingerprint} {bf16.logprob} | bfloat16 (the base's config.json)"
    )
    assert numerics(pytester, *LIVE, base, "-o", "rl_served_dtype=float32").startswith(
        "NUM float32 0.001 0.001 | float32 (rl_served_dtype)"
    )
    mine = numerics(pytester, *LIVE, base, "-o", "rl_logprob_tolerance=0.2")
    assert mine.startswith(f"NUM bfloat16 {bf16.fingerprint} 0.2 |") and "set by rl_*_tolerance" in mine
    assert numerics(pytester, *LIVE).startswith("NUM float32 0.001 0.001 | float32 (no dtype declared)")
    # the bundled reference deployment computes in float32, whatever its config.json declares
    assert numerics(pytester).startswith("NUM float32 0.001 0.001 | float32 (the deployment's)")


def test_the_bf16_figure_covers_a_healthy_bf16_implementation_the_fp32_figure_would_fail(tmp_path):
    """transformers in bfloat16 on the CPU against the numpy engine in float32, the same weights
    (what NUM-LOGPROB-1 compares): within the bf16 figure, and beyond the float32 one (the
    measurement behind the figures: benchmarks/bench_tolerances.py)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pytest_rlrollout.numerics.scorer import NumpyScorer

    base = tiny_moe.make_base(tmp_path / "base")
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).eval()
    local = NumpyScorer(base)
    rng = np.random.default_rng(7)
    worst = 0.0
    for _ in range(4):
        ids = [int(x) for x in rng.integers(3, 512, 48)]
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1).numpy()
        served = lp[np.arange(len(ids) - 1), np.asarray(ids[1:])]
        worst = max(worst, float(np.abs(served - local.score(ids).logprobs[1:]).max()))
    assert TOLERANCES["float32"].logprob < worst <= TOLERANCES["bfloat16"].logprob, worst
