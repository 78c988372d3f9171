"""What weight fidelity costs, measured side by side in one run on the reference deployment
(in process, 2 replicas, no pacing).

    python benchmarks/bench_fidelity.py

Prints:
(a) a canary fingerprint per replica (FID clauses): requests, prompt tokens and seconds, beside
    plain greedy sampling of as many tokens on the same replica, and their ratio; plus what a
    sweep of every replica spends finding the replicas;
(b) scorer throughput (NUM clauses) in tokens/s for the numpy engine and, when torch is
    installed, transformers (fp32, CPU), beside the deployment's plain greedy sampling tokens/s
    for the same rollouts, and their ratios.
Every figure is the median of ROUNDS rounds after a warm-up. The client shares this process (and
its GIL) with the deployment, so sampling figures are below bench_deployment.py's. On cores other
work shares, BLAS and OpenMP pools that spin while they wait make the absolute figures swing
several-fold between runs; `OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1` steadies them (the tiny
model's matrices gain nothing from a second thread).
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pytest_rlrollout.numerics.scorer import NumpyScorer, Scorer, TransformersScorer
from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.fingerprint import FIRST_ID, Fingerprint, canary, fingerprint, sweep
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.snapshot import tiny_moe

ROUNDS = 9
SESSION = "x-multi-turn-session-id"
PROMPTS, PROMPT_TOKENS, COMPLETION_TOKENS = 8, 32, 96  # the rollouts (b) samples and scores


def side_by_side(*runs: Callable[[int], object], rounds: int = ROUNDS) -> list[tuple[float, object]]:
    """Per run, the median wall time of `run(round)` over `rounds` rounds after one warm-up, and
    its last result. The runs take turns within each round, so a neighbour's load on the shared
    cores slows them alike and the ratios hold better than the absolute figures."""
    results = [run(-1) for run in runs]
    times: list[list[float]] = [[] for _ in runs]
    for r in range(rounds):
        for i, run in enumerate(runs):
            t = time.perf_counter()
            results[i] = run(r)
            times[i].append(time.perf_counter() - t)
    return [(statistics.median(t), x) for t, x in zip(times, results, strict=True)]


def greedy(client: DeploymentClient, prompts: list[list[int]], tokens: int, headers: dict[str, str]) -> list[list[int]]:
    """Plain sampling: one greedy completion of exactly `tokens` tokens per prompt, no logprobs,
    no routing, each prompt under its own isolation key (so no round reuses another's KV)."""
    out = []
    for i, prompt in enumerate(prompts):
        body = {
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
            "prompt_cache_isolation_key": f"{headers[SESSION]}-{time.perf_counter_ns()}-{i}",
        }
        s = client.complete(body, headers=headers).expect_ok()
        produced = (s.usage or {}).get("completion_tokens")
        if produced != tokens:
            raise RuntimeError(f"asked for {tokens} tokens, the deployment reports {produced}")
        out.append(s.choices()[0].get("token_ids") or [])
    return out


def fingerprint_cost(client: DeploymentClient, replicas: int) -> None:
    found = sweep(client, replicas, "bench-sweep", key=lambda n: f"bench-replica-{n}")
    print(
        f"(a) canary fingerprint, per replica ({len(found.prints)} replicas found with {found.probes} one-token "
        f"probes; a whole sweep: {found.requests} requests, {found.tokens} prompt tokens)"
    )
    print(f"    {'replica':10} {'':22} {'requests':>8} {'tokens':>7} {'seconds':>9} {'tok/s':>8}")
    canaries = canary()
    # as many tokens generated as a fingerprint sends: one request per canary, 1-token prompts
    per, prompts = len(canaries[0]), [[FIRST_ID + i] for i in range(len(canaries))]
    for n, (replica, session) in enumerate(sorted(found.sessions.items())):
        headers = {SESSION: session}
        (fp_s, fp), (plain_s, _) = side_by_side(
            lambda r, n=n, h=headers: fingerprint(client, f"bench-fp-{n}-{r}", headers=h),
            lambda r, p=prompts, k=per, h=headers: greedy(client, p, k, h),
        )
        assert isinstance(fp, Fingerprint) and fp.host == replica and fp.tokens == per * len(prompts), fp
        print(
            f"    {replica:10} {'fingerprint (prefill)':22} {fp.requests:8} {fp.tokens:7} {fp_s:9.4f} "
            f"{fp.tokens / fp_s:8.0f}"
        )
        print(
            f"    {'':10} {'greedy sampling':22} {len(prompts):8} {per * len(prompts):7} {plain_s:9.4f} "
            f"{per * len(prompts) / plain_s:8.0f}"
        )
        print(f"    {'':10} fingerprint / sampling the same tokens: {fp_s / plain_s:.2f}x the time")


def quiet_transformers(snapshot: Path) -> Scorer:
    from transformers.utils import logging

    logging.disable_progress_bar()  # its loading bar would land between the printed lines
    return TransformersScorer(snapshot)


def scorer_throughput(client: DeploymentClient, snapshot: Path) -> None:
    headers = {SESSION: "bench-scorers"}
    prompts = [[FIRST_ID + (37 * i + 11 * j) % 480 for j in range(PROMPT_TOKENS)] for i in range(PROMPTS)]
    completions = greedy(client, prompts, COMPLETION_TOKENS, headers)  # greedy: every round samples these
    sequences = [p + c for p, c in zip(prompts, completions, strict=True)]
    assert all(len(s) == PROMPT_TOKENS + COMPLETION_TOKENS for s in sequences), "token_ids missing"
    generated = PROMPTS * COMPLETION_TOKENS
    positions = sum(len(s) for s in sequences)  # a scorer forwards every position, prompt included
    makers: list[tuple[str, Callable[[], Scorer]]] = [("numpy scorer (the engine)", lambda: NumpyScorer(snapshot))]
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        makers.append(("transformers scorer (fp32, CPU)", lambda: quiet_transformers(snapshot)))
    loaded, scorers = [], []
    for _, make in makers:
        t = time.perf_counter()
        scorers.append(make())
        loaded.append(time.perf_counter() - t)
    (plain_s, _), *scored = side_by_side(
        lambda r: greedy(client, prompts, COMPLETION_TOKENS, headers),
        *[lambda r, s=s: [s.score(x) for x in sequences] for s in scorers],
    )
    sample_rate = generated / plain_s
    print(f"(b) {PROMPTS} rollouts of {PROMPT_TOKENS} prompt + {COMPLETION_TOKENS} generated tokens")
    print(f"    {'deployment, greedy sampling':34} {sample_rate:9.0f} generated tok/s   ({plain_s:.3f} s)")
    for (label, _), (score_s, _), load_s in zip(makers, scored, loaded, strict=True):
        rate = positions / score_s
        print(
            f"    {label:34} {rate:9.0f} scored tok/s      ({score_s:.3f} s; {rate / sample_rate:.1f}x sampling's "
            f"tok/s; scoring a rollout takes {score_s / plain_s:.2f}x sampling it; loaded in {load_s:.2f} s, "
            f"imports included)"
        )
    if len(makers) == 1:
        print("    transformers scorer: torch or transformers not installed, not measured")


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        bucket = Path(d) / "bucket"
        bucket.mkdir()
        snapshot = tiny_moe.make_base(bucket / tiny_moe.BASE_IDENTITY)
        with (
            reference_deployment(bucket, replicas=2) as dep,
            DeploymentClient(Target(dep.name, dep.base_url, dep.model, dep.api_key)) as client,
        ):
            fingerprint_cost(client, dep.settings.replicas)
            scorer_throughput(client, snapshot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
