"""The docs' training loop (docs/examples/training_loop.py) against a real vLLM server (0.32, CPU
build), with the bucket a directory the server reads: the loop's own check shows vLLM's reload
finding (test_vllm.py's docstring) as a weight gap at the first reload.

One server, started from the reference base. At step 0 it scores the canary as the trainer does
(its start-up load); step 1's snapshot, reloaded through vLLM's RL API (`reload_weights`), scores
unlike the weights the trainer exported, under the label of step 1: `reload_weights` leaves the
MoE experts in the checkpoint's layout. The second observation, outside the loop: the directory
the server started from, and scored right from, scores unlike those same weights once reloaded;
and the numpy engine scores step 1's directory as the trainer does (the export is right).

Measured here (2026-11-28): 86-92 s in all, about 77 s of it the server's start; reloading the
start directory gives the same gap as step 1 (0.732 at canary token 93, mean 0.197).
"""

from __future__ import annotations

import pytest

from pytest_rlrollout import WeightSync, WeightSyncError
from pytest_rlrollout.numerics.scorer import NumpyScorer
from pytest_rlrollout.snapshot import tiny_moe
from tests.engines.vllm_server import DTYPE, vllm_server
from tests.examples import Logged, training_loop

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.interop]  # one server at a time; torch

RUN = "vllm-loop"
STEP_1 = f"{RUN}-step-0001"
# What the check finds at step 1, measured (deterministic here: the same on every run): the gap's
# size and where it is largest, as a conformance run's CTL-LABEL-1 gives them for its canary
GAP, WORST_TOKEN, MEAN_GAP = 0.734, 93, 0.197


@pytest.fixture(scope="module")
def looped(tmp_path_factory):
    """The loop run against a fresh server until its check stops it; the server, the bucket and
    what each step logged."""
    loop = training_loop()
    root = tmp_path_factory.mktemp("vllm-loop")
    bucket = root / "bucket"
    base = tiny_moe.make_base(bucket / tiny_moe.BASE_IDENTITY)
    with vllm_server(base, root / "vllm.log") as server:
        logged = Logged()
        where = loop.Deployment(server.url, server.model, "vllm", server.key, bucket, dtype=DTYPE)
        with pytest.raises(WeightSyncError) as stopped:
            loop.main(where, 3, log=logged, run=RUN)
        yield loop, server, bucket, logged, str(stopped.value)


def test_the_first_reload_shows_as_a_weight_gap(looped):
    """Step 0 (the server's start-up load) in sync to 1e-6; step 1, the first reload, out of sync
    by 0.73 at canary token 93 (mean 0.20) under step 1's label, and not stale either: it serves
    neither step's weights. The loop stops there."""
    _, _, _, logged, stopped = looped
    assert logged.steps == [0, 1]
    start, reload = logged.results
    assert start.ok and start.max_abs < 1e-4, start.lines()
    [replica] = reload.replicas
    assert not replica.in_sync and not replica.stale, reload.lines()
    assert replica.label == STEP_1, replica  # vLLM says it serves step 1
    assert replica.previous_max_abs > 0.5, replica  # nor is it step 0's weights
    assert replica.worst_token == WORST_TOKEN and abs(replica.max_abs - GAP) < 0.02, replica
    assert abs(replica.mean_abs - MEAN_GAP) < 0.02, replica
    assert f"(label {STEP_1}): out of sync: max |Δlogprob| {GAP:.3g} at canary token {WORST_TOKEN}" in stopped
    assert logged.figures[1]["weight_sync/replicas_out_of_sync"] == 1.0


def test_the_gap_is_the_reload_not_the_snapshot(looped):
    """The second observation: reloading the directory the server started from (whose start-up
    load scored within 1e-6 of the trainer at step 0) moves the same weights' numbers by more
    than 0.05 (0.73 measured); and the numpy engine scores step 1's directory as the trainer did."""
    loop, server, bucket, logged, _ = looped
    base = bucket / tiny_moe.BASE_IDENTITY
    trainer = loop.Trainer(base)  # step 0's weights again
    with WeightSync.connect(server.url, server.model, engine="vllm", api_key=server.key, bucket=str(bucket)) as sync:
        step0 = trainer.canary_logprobs(sync.canary)
        loop.hot_load(sync, tiny_moe.BASE_IDENTITY, timeout=300, poll=0.5)
        reloaded = sync.check(step0, label=tiny_moe.BASE_IDENTITY, step=0)
        canary = sync.canary
    assert max(abs(a - b) for a, b in zip(logged.results[0].replicas[0].served, step0, strict=True)) < 1e-4
    print("\n".join(reloaded.lines()))
    assert not reloaded.ok and reloaded.max_abs > 0.05, reloaded.lines()
    assert reloaded.replicas[0].label == tiny_moe.BASE_IDENTITY
    trainer.step()  # step 1 again: the training is deterministic
    numpy = NumpyScorer(bucket / STEP_1).score(canary).logprobs[1:]
    assert max(abs(a - b) for a, b in zip(numpy, trainer.canary_logprobs(canary), strict=True)) < 1e-5
