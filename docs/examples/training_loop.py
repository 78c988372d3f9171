"""A training loop that asks, after every weight sync, whether every replica serves the weights the
trainer just exported.

Each step: one SGD step of the reference model (torch and transformers) on a fixed token batch;
the step's weights exported as a snapshot directory in the bucket (the base's tensor names, dtypes
and shards); the snapshot hot-loaded through the deployment's driver; then `WeightSync.check`
with the trainer's own logprobs of the canary, its figures logged. A replica out of sync ends the
loop with `WeightSyncError` naming it.

Against the bundled reference deployment (2 replicas; `--fault FID-SWAP-1:one` makes the last
replica keep its old weights under the new label):

    python docs/examples/training_loop.py --steps 5

Against your own deployment: `main(Deployment(...), steps=...)`.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

# what `save_pretrained` calls to give a transformers 5 model's tensors their checkpoint names
# (it fuses each MoE layer's experts on load: `mlp.experts.gate_up_proj` is 8 experts' gate and up)
from transformers.core_model_loading import revert_weight_conversion

from pytest_rlrollout import SyncResult, WeightSync, score_canary
from pytest_rlrollout.engines import Engine
from pytest_rlrollout.snapshot.build import as_tensor, derive, tensor_map

BASE = "tiny-qwen3-moe-base"  # the reference deployment's base, in its bucket
# One step at this rate moves the canary's logprobs by 0.08 to 0.14 at most (mean 0.017 to 0.021;
# measured over the first 5 steps): 80 times the float32 tolerance (1e-3), so a replica that keeps
# the previous step's weights cannot pass for one that loaded this step's.
LR = 0.2
STORED = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}  # a snapshot's dtypes in torch


@dataclass(frozen=True)
class Deployment:
    """Where the trainer sends its weights, and what the check needs to reach every replica."""

    base_url: str
    model: str
    engine: Engine  # the driver: fireworks, vllm, sglang, coreweave, fleet, ...
    api_key: str
    bucket: Path  # where snapshots are written: a directory the deployment reads
    name: str | None = None  # accounts/<a>/deployments/<d> (Fireworks names deployments)
    dtype: str = "float32"  # what the deployment computes in: the check's tolerance


class Trainer:
    """The policy in float32 (what the optimizer steps), and its exported copy: every parameter
    rounded to the dtype the snapshot stores. The copy is what the deployment serves, so it is
    what the trainer scores: the float32 policy itself differs from its bfloat16 export by 0.006 to
    0.096 in logprob here (the first 5 steps), 6 to 96 times the tolerance."""

    def __init__(self, base: Path, *, lr: float = LR, seed: int = 0):
        self.base = base
        dtypes = {t["dtype"] for t in tensor_map(base).values()}
        if len(dtypes) != 1 or next(iter(dtypes)) not in STORED:
            raise ValueError(f"{base}: this exporter writes one floating dtype, the base stores {sorted(dtypes)}")
        self.stored = STORED[dtypes.pop()]
        self.policy = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        self.exported = copy.deepcopy(self.policy).eval()
        self.optimizer = torch.optim.SGD(self.policy.parameters(), lr=lr)
        vocab = self.policy.config.vocab_size
        # a fixed batch of token ids (no special tokens): 4 sequences of 64
        self.batch = torch.randint(10, vocab, (4, 64), generator=torch.Generator().manual_seed(seed))
        self._round()

    def step(self) -> float:
        """One SGD step on the batch's next-token loss; the loss before it."""
        self.policy.train()
        loss = self.policy(self.batch, labels=self.batch).loss
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self._round()
        return loss.item()

    def _round(self) -> None:
        with torch.no_grad():
            for kept, exported in zip(self.policy.parameters(), self.exported.parameters(), strict=True):
                exported.copy_(kept.to(self.stored))

    def export(self, dst: Path) -> Path:
        """The exported copy as a snapshot: the base's files, every tensor replaced."""
        tensors = revert_weight_conversion(self.exported, dict(self.exported.state_dict()))
        return derive(self.base, dst, {name: as_tensor(t.to(self.stored)) for name, t in tensors.items()})

    def canary_logprobs(self, canary: list[int]) -> list[float]:
        """The trainer's numbers for the check: the exported weights' logprobs of the canary."""
        return score_canary(self.exported, canary)


def print_step(step: int, loss: float | None, result: SyncResult) -> None:
    """The default logger: the check's lines, then its figures (where a trainer calls wandb.log)."""
    print("\n".join(result.lines()))
    figures = {**result.metrics(), **({"train/loss": loss} if loss is not None else {})}
    print("  " + ", ".join(f"{k}={v:.4g}" for k, v in figures.items()))


def hot_load(sync: WeightSync, name: str, *, timeout: float, poll: float) -> None:
    """Load snapshot `name` from the bucket on every replica and wait until all say they serve it."""
    answer = sync.driver.load({"identity": name, "reset_prompt_cache": "all"})
    if answer.status_code != 200:
        raise RuntimeError(f"loading {name}: HTTP {answer.status_code} {answer.text[:200]}")
    waited = sync.driver.wait(name, timeout=timeout, poll=poll)
    if not waited.ok:
        raise RuntimeError(f"{name} was not served: {waited.error}")


def main(
    deployment: Deployment,
    steps: int = 5,
    *,
    lr: float = LR,
    log: Callable[[int, float | None, SyncResult], None] = print_step,
    run: str | None = None,
    swap_timeout: float = 300.0,
    poll: float = 0.5,
) -> list[SyncResult]:
    """Train `steps` steps, syncing and checking after each; every check's result (step 0: before
    the first step, the base the deployment starts from). WeightSyncError at the first check
    that finds a replica out of sync."""
    bucket = Path(deployment.bucket)
    trainer = Trainer(bucket / BASE, lr=lr)
    run = run or f"loop-{uuid.uuid4().hex[:8]}"
    results: list[SyncResult] = []
    with WeightSync.connect(
        deployment.base_url,
        deployment.model,
        engine=deployment.engine,
        api_key=deployment.api_key,
        deployment=deployment.name,
        bucket=str(bucket),
        dtype=deployment.dtype,
        vocab=trainer.policy.config.vocab_size,
    ) as sync:
        sync.driver.load_wait = swap_timeout  # vLLM and SGLang answer a load once it is done

        def check(step: int, loss: float | None, label: str | None) -> None:
            result = sync.check(trainer.canary_logprobs(sync.canary), label=label, step=step)
            results.append(result)
            log(step, loss, result)
            result.raise_for()

        check(0, None, None)  # the deployment serves what the trainer starts from
        for step in range(1, steps + 1):
            loss = trainer.step()
            name = f"{run}-step-{step:04d}"
            trainer.export(bucket / name)
            hot_load(sync, name, timeout=swap_timeout, poll=poll)
            check(step, loss, name)
    return results


if __name__ == "__main__":
    from pytest_rlrollout import WeightSyncError, reference_deployment

    parser = argparse.ArgumentParser(description="The training loop against the bundled reference deployment")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--fault", action="append", default=[], help="a fault switch, e.g. FID-SWAP-1:one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, reference_deployment(tmp, replicas=2, faults=args.fault) as dep:
        where = Deployment(dep.base_url, dep.model, dep.settings.engine, dep.api_key or "", Path(tmp), dep.name)
        try:
            main(where, args.steps)
        except WeightSyncError as e:
            sys.exit(f"out of sync:\n{e}")
