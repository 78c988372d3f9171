"""benchmarks/bench_weight_sync.py's measurement, run with one round against the reference
deployment with two replicas (what it measures, not how fast: the figures are the script's)."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.remote.counting import CountingTransport
from pytest_rlrollout.runs.weight_sync import WeightSync
from pytest_rlrollout.snapshot import tiny_moe

from .sync_support import scored

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_weight_sync.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_weight_sync", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass is resolved through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_the_benchmark_measures_the_check_beside_completions_of_its_canary(bench, bucket):
    """One round: a call of the check is one request per replica; each side's time is positive and
    the ratios are finite; a call's bytes both ways are counted, the answers' larger than a plain
    completion's (they hold a logprob per canary token); the report prints the ratios and says
    what a production model would pay, in words."""
    counted = CountingTransport()
    with (
        reference_deployment(bucket, replicas=2, api_key="rl-reference-key") as dep,
        WeightSync.connect(
            dep.base_url,
            dep.model,
            engine="fireworks",
            api_key="rl-reference-key",
            deployment=dep.name,
            transport=counted,
        ) as sync,
    ):
        m = bench.measure(sync, counted, scored(bucket / tiny_moe.BASE_IDENTITY, sync), rounds=1)
    assert (m.replicas, m.rounds, m.canary, m.requests) == (2, 1, 128, 2)
    assert all(x > 0 and math.isfinite(x) for x in (m.check, m.one_token, m.generating, m.ratio_one_token))
    assert m.per_replica == m.check / 2 and m.generating > m.one_token
    assert m.sent > 0 and m.received / m.replicas > m.one_token_bytes
    said = "\n".join(bench.report(m))
    assert f"-> the check per replica: {m.ratio_one_token:.2f}x" in said
    assert "one prefill of the 128-token canary per replica" in said and "Qwen3-30B-A3B" in said
