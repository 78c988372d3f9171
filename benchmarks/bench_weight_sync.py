"""What the training loop's weight-sync check costs, measured side by side in one run on the
reference deployment (in process, 2 replicas, no pacing).

    python benchmarks/bench_weight_sync.py [ROUNDS]

Prints, per replica: one call of the check (each replica scores the 128-token canary: an echo with
max_tokens 1) beside a plain completion of the same tokens on the same replica (the canary as the
prompt, max_tokens 1, no echo) and beside a completion generating as many tokens as the canary has;
the wall time of each, the median of ROUNDS rounds (default 15) after a warm-up, and their ratios.
Then what one call sends and receives, counted at the transport (requests, bytes each way), beside
one plain completion's bytes. Every request carries a prompt-cache isolation key no request used
before, as the check's do, so no side is served from the cache. The client shares this process
(and its GIL) with the deployment; `OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1` steadies the figures
on a shared machine (see bench_fidelity.py).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_rlrollout.numerics.scorer import NumpyScorer
from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.remote.counting import CountingTransport
from pytest_rlrollout.remote.fingerprint import ISOLATION
from pytest_rlrollout.runs.weight_sync import SESSION, WeightSync
from pytest_rlrollout.snapshot import tiny_moe

ROUNDS = 15
REPLICAS = 2


@dataclass(frozen=True)
class Measured:
    """Medians over `rounds`, in seconds; bytes and requests of one call of the check."""

    replicas: int
    rounds: int
    canary: int  # the canary's tokens
    check: float  # one call of the check (every replica)
    one_token: float  # one plain completion of the canary, max_tokens 1, no echo
    generating: float  # one completion of the canary generating `canary` tokens
    requests: int  # requests one call sent (the transport's count)
    sent: int  # bytes one call sent
    received: int  # bytes one call received
    one_token_bytes: int  # bytes of one plain completion, both ways

    @property
    def per_replica(self) -> float:
        return self.check / self.replicas

    @property
    def ratio_one_token(self) -> float:
        return self.per_replica / self.one_token

    @property
    def ratio_generating(self) -> float:
        return self.per_replica / self.generating


def side_by_side(*runs: Callable[[], object], rounds: int) -> list[float]:
    """Per run, the median wall time of `run()` over `rounds` rounds after one warm-up. The runs
    take turns within each round, so a neighbour's load on the shared cores slows them alike and
    the ratios hold better than the absolute figures."""
    for run in runs:
        run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for i, run in enumerate(runs):
            t = time.perf_counter()
            run()
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times]


def measure(sync: WeightSync, counted: CountingTransport, expected: list[float], rounds: int) -> Measured:
    """The check beside plain completions of its canary, on the replicas it reaches (`sync`'s
    client sends through `counted`); the first call, which finds the replicas, is made first."""
    if not sync.check(expected).ok:
        raise RuntimeError("the check is not green on the weights the trainer's numbers are of")
    canary, sessions = sync.canary, list(sync.sessions.values())

    def completions(tokens: int) -> Callable[[], None]:
        body = {"prompt": canary, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}

        def run() -> None:  # one per replica, as a call of the check sends
            for session in sessions:
                headers = {SESSION: session, ISOLATION: f"bench-{uuid.uuid4().hex}"}
                s = sync.driver.complete(body, headers=headers).expect_ok()
                produced = (s.usage or {}).get("completion_tokens")
                if produced != tokens:
                    raise RuntimeError(f"asked for {tokens} tokens, the deployment reports {produced}")

        return run

    check, one, generating = side_by_side(
        lambda: sync.check(expected).raise_for(), completions(1), completions(len(canary)), rounds=rounds
    )
    counted.take()
    sync.check(expected)
    call = counted.take()
    completions(1)()
    plain = counted.take()
    return Measured(
        replicas=len(sessions),
        rounds=rounds,
        canary=len(canary),
        check=check,
        one_token=one / len(sessions),
        generating=generating / len(sessions),
        requests=len(call),
        sent=sum(c.sent for c in call),
        received=sum(c.received for c in call),
        one_token_bytes=sum(c.sent + c.received for c in plain) // len(plain),
    )


def report(m: Measured) -> list[str]:
    return [
        f"weight-sync check, {m.replicas} replicas, canary of {m.canary} tokens; medians of {m.rounds} rounds",
        f"  one call of the check            {m.check * 1e3:8.2f} ms  ({m.requests} requests)",
        f"  per replica                      {m.per_replica * 1e3:8.2f} ms",
        f"  completion, max_tokens 1, no echo {m.one_token * 1e3:7.2f} ms  -> the check per replica: "
        f"{m.ratio_one_token:.2f}x",
        f"  completion generating {m.canary} tokens {m.generating * 1e3:7.2f} ms  -> the check per replica: "
        f"{m.ratio_generating:.3f}x",
        f"  on the wire per call: {m.sent:,} bytes sent, {m.received:,} received "
        f"({(m.sent + m.received) / m.replicas:,.0f} per replica; a plain one-token completion: "
        f"{m.one_token_bytes:,})",
        "On a production model (Qwen3-30B-A3B), a call is one prefill of the 128-token canary per replica and",
        "no decode step: the work of the prompt of a one-token completion of the same tokens, plus the output",
        "layer at every canary position instead of the last (the first ratio measures both, on the tiny model).",
        "The second ratio is the tiny model's: on GPUs serving that model each generated token is a forward",
        "pass of its own and a 128-token prefill is one, so a call weighs about what a short prompt joining",
        "the batch weighs, not what a rollout does. Its bytes do not grow with the model: the answer holds",
        "one logprob per canary token, whatever the vocabulary.",
    ]


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else ROUNDS
    if os.environ.get("OPENBLAS_NUM_THREADS") != "1":
        print("(OPENBLAS_NUM_THREADS is not 1: BLAS threads spinning beside the server make every figure swing)")
    with tempfile.TemporaryDirectory() as d:
        bucket = Path(d) / "bucket"
        bucket.mkdir()
        base = tiny_moe.make_base(bucket / tiny_moe.BASE_IDENTITY)
        counted = CountingTransport()
        with (
            reference_deployment(bucket, replicas=REPLICAS) as dep,
            WeightSync.connect(
                dep.base_url,
                dep.model,
                engine="fireworks",
                api_key=dep.api_key or "",
                deployment=dep.name,
                transport=counted,
            ) as sync,
        ):
            expected = [float(x) for x in NumpyScorer(base).score(sync.canary).logprobs[1:]]
            print("\n".join(report(measure(sync, counted, expected, rounds))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
