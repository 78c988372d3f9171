"""FID — weight fidelity: the weights doing the sampling are the snapshot the deployment names.

Every other clause checks what a deployment *says*; these check its numbers. A fingerprint is
the prompt logprobs of a fixed canary set (echo, `max_tokens` 1, a prompt-cache isolation key no
request used before), taken on every replica; see remote/fingerprint.py. The swaps go along
sentinel deltas (a few tensors per diff) and bucket-side copies of the base, so a live run
uploads a small fraction of a snapshot; each test's report states what it uploaded.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import pytest

from pytest_rlrollout.remote.fingerprint import (
    ECHO,
    ISOLATION,
    Fingerprint,
    FingerprintError,
    Sweep,
    largest_difference,
    prompt_logprobs,
    sweep,
)
from pytest_rlrollout.runs.plan import shared
from pytest_rlrollout.suite.marks import clause, loads, requires
from pytest_rlrollout.suite.outcomes import inconclusive
from pytest_rlrollout.suite.testing import (
    CACHED_PREFIX,
    COPY,
    LEDGER,
    cached_continued,
    completed,
    continued,
    part,
    share_for,
    shares,
)

scored = requires("logprobs", "echo", "token_id_prompts")
LOAD_STREAMS = 3  # FID-BATCH-1: requests decoding beside the one judged


@dataclass
class Fingerprints:
    """Takes fingerprints of the deployment, each replica reached by the same session key every time."""

    deployment: object
    tolerance: float
    name: str
    sessions: dict[str, str] | None = None
    taken: int = 0

    def sweep(self) -> Sweep:
        dep = self.deployment
        self.taken += 1
        try:
            # CoreWeave names its replicas once a hot-load was made, not at discovery
            replicas = max(1, dep.capabilities.replicas or len(dep.replicas()))
            s = sweep(
                dep.driver,
                replicas,
                dep.salted(f"{self.name}-iso-{self.taken}"),
                key=lambda n: dep.salted(f"{self.name}-replica-{n}"),
                sessions=self.sessions,
                vocab=(dep.base_config or {}).get("vocab_size"),
            )
        except FingerprintError as e:
            inconclusive(f"the canary set cannot be scored ({e}; see INF-LOGPROBS-1 and R3-ECHO-1)")
        if self.sessions is None:
            self.sessions = s.sessions
        return s


@pytest.fixture
def fid(rl_deployment, rl_observe) -> Fingerprints:
    return Fingerprints(rl_deployment, rl_deployment.options.numerics.fingerprint_tolerance, "fid")


def spread(s: Sweep) -> tuple[str, str, float] | None:
    """The two replicas of a sweep farthest apart, and how far (None with one replica)."""
    pairs = [(a, b, s.prints[a].distance(s.prints[b])) for a, b in itertools.combinations(sorted(s.prints), 2)]
    return max(pairs, key=lambda x: x[2]) if pairs else None


def replicas_agree(s: Sweep, what: str, tolerance: float) -> None:
    worst = spread(s)
    if worst is not None:
        a, b, _ = worst
        assert worst[2] <= tolerance, (
            f"{what}: replicas {a} and {b} serve different weights: {s.prints[a].describe(s.prints[b])} > "
            f"tolerance {tolerance:g}"
        )


# FID-SAME-1's swaps: the base in full, other weights (experts included), the base again from them
PATHS = (COPY, share_for("all"), share_for("none"))


@clause("FID-SAME-1")
@scored
@loads(*(shared() for _ in PATHS))
@shares(lambda _: list(PATHS), "fingerprints")
def test_same_weights_same_fingerprint_whatever_the_load_path(rl_deployment, rl_shared, fid, rl_observe):
    """The same weights give the same fingerprint whatever the load path (a full snapshot; the same target reached
    through a chain of ARC2 diffs; the same weights under another identity; after a ledger reset) and on every
    replica."""
    copied = rl_shared.parts(COPY, ["fingerprints", LEDGER])
    after_reset = " after a ledger reset" if copied[LEDGER] is not None and 200 <= copied[LEDGER] < 300 else ""
    paths: dict[str, Sweep] = {f"a full snapshot of the base{after_reset}": copied["fingerprints"][2]}
    away, _, changed = rl_shared(share_for("all"), "fingerprints")
    back, before_back, again = rl_shared(share_for("none"), "fingerprints")
    tol = fid.tolerance
    first, reference = next(iter(paths.items()))
    ref_replica, ref = sorted(reference.prints.items())[0]
    # from other weights where what was served before it scored unlike the base (the usual order)
    came_from = "other weights" if min(p.distance(ref) for p in before_back.prints.values()) > tol else "the base"
    how = "an ARC2 diff" if back.built.kind == "incremental" else "a full snapshot"
    paths[f"the base again, from {came_from} ({back.built.identity}: {how})"] = again
    start = rl_deployment.discovery.start  # the deployment's own start-up load of the base, if it served it
    if start is not None:
        started = Fingerprint.of(start["logprobs"])
        paths[f"the base as served when the run began ({start['identity']}, the deployment's own load)"] = Sweep(
            prints={"a replica": started}
        )
    replicas_agree(changed, f"the changed weights ({away.built.identity})", tol)
    worst = 0.0
    for path, s in paths.items():
        replicas_agree(s, path, tol)
        for replica, fp in sorted(s.prints.items()):
            d = fp.distance(ref)
            assert d <= tol, (
                f"the same weights differ: {path} on {replica} against {first} on {ref_replica}: "
                f"{fp.describe(ref)} > tolerance {tol:g}"
            )
            worst = max(worst, d)
    # (a replica is named by the session that reached it where no header names it: by each sweep's own)
    moved = min((fp.distance(ref) for fp in changed.prints.values()), default=0.0)
    if moved <= tol:
        inconclusive(
            f"other weights ({away.built.identity}: a norm vector and experts) score the canaries as the base "
            f"does (max |Δ| {moved:.2g} <= tolerance {tol:g}): these fingerprints tell no weights apart "
            "(see FID-SWAP-1)"
        )
    rl_observe.figures = {"max_abs_delta": worst, "tolerance": tol, "changed_weights_delta": moved}
    rl_observe(
        sum(len(s.prints) for s in paths.values()),
        f"fingerprints of the same weights by {len(paths)} load paths on {len(ref.logprobs)} canaries, "
        f"max |Δ| {worst:.2g} (other weights moved them by {moved:.2g})",
    )


def fingerprinted(rl_deployment, name):
    """A fingerprint taken before the swap, and the sweeps' own taker (the same sessions after)."""
    prints = Fingerprints(rl_deployment, rl_deployment.options.numerics.fingerprint_tolerance, name)
    return prints, prints.sweep()


part("fingerprints", fingerprinted, lambda _, was, swapped: (completed(swapped), was[1], was[0].sweep()))


@clause("FID-SWAP-1")
@scored
@loads(shared())
@shares(lambda _: share_for(None), "fingerprints")
def test_after_a_swap_every_replica_serves_the_new_weights(rl_deployment, rl_shared, fid, rl_observe):
    """After a swap is reported done, every replica's fingerprint is the new snapshot's, not the previous one's."""
    result, before, after = rl_shared(share_for(None), "fingerprints")
    tol = fid.tolerance
    unchanged = {r: before.prints[r].distance(after.prints[r]) for r in before.prints if r in after.prints}
    if not unchanged:
        inconclusive("no replica was reached both before and after the swap")
    stale = {r: d for r, d in unchanged.items() if d <= tol}
    assert not stale, (
        f"the swap to {result.built.identity} (a norm vector doubled) was reported done, yet "
        f"{', '.join(f'{r} (max |Δ| {d:.2g})' for r, d in sorted(stale.items()))} still score the canaries as "
        f"before, within tolerance {tol:g}: the label changed, the weights did not"
    )
    rl_observe.figures = {"min_abs_delta": min(unchanged.values()), "tolerance": tol}
    rl_observe(
        len(unchanged),
        f"replicas whose fingerprint moved after the swap (min max-|Δ| {min(unchanged.values()):.2g} > {tol:g})",
    )


def echo_logprobs(rl_deployment, ids: list[int], headers: dict[str, str]) -> tuple[list[float], int]:
    """The prompt's echoed logprobs (after the first token) and the cached tokens reported."""
    s = rl_deployment.complete({"prompt": ids, **ECHO}, headers=headers).expect_ok()
    try:
        return prompt_logprobs(s, len(ids)), s.cached or 0
    except FingerprintError as e:
        inconclusive(f"the prompt's logprobs cannot be read: {e} (see R3-ECHO-1)")


def cached_continuation(rl_deployment, name):
    """A prompt's continuation served from the prompt cache before the swap: (name, prompt, session, it)."""
    prompt = rl_deployment.token_ids(name, CACHED_PREFIX)
    session = rl_deployment.session(name)
    return name, prompt, session, cached_continued(rl_deployment, prompt, session, "the swap")


def continued_again(rl_deployment, was, swapped):
    """After the swap: the prompt repeated in its session, and under an unused isolation key."""
    name, prompt, session, old = was
    completed(swapped)
    repeated = continued(rl_deployment, prompt, session)
    fresh = continued(rl_deployment, prompt, session | {ISOLATION: rl_deployment.salted(f"{name}-fresh")})
    return swapped, old, repeated, fresh


part("kv-continuation", cached_continuation, continued_again)


@clause("FID-CACHE-1")
@requires("logprobs", "token_id_prompts", "cached_tokens")
@loads(shared())
@shares(lambda _: share_for("all"), "kv-continuation")
def test_all_leaves_no_kv_of_the_old_weights(rl_deployment, rl_shared, fid, rl_observe):
    """After a swap with reset_prompt_cache 'all', a request repeating a pre-swap prefix scores like the same request
    under an unused isolation key (stale KV is caught by its numbers, whatever the counters say)."""
    result, old, repeated, fresh = rl_shared(share_for("all"), "kv-continuation")
    moved, _ = old.difference(fresh)
    if moved <= fid.tolerance:
        inconclusive(
            f"the swap to {result.built.identity} did not change the prompt's continuation (max |Δ| "
            f"{moved:.2g}): stale KV would not show (see FID-SWAP-1)"
        )
    d, where = repeated.difference(fresh)
    assert d <= fid.tolerance, (
        f"after the swap to {result.built.identity} with reset_prompt_cache 'all', the pre-swap prompt repeated in "
        f"its session continues unlike the same prompt under an unused isolation key: {where} > tolerance "
        f"{fid.tolerance:g}; the deployment reported {repeated.cached} cached tokens"
    )
    rl_observe.figures = {"max_abs_delta": d, "swap_moved": moved, "tolerance": fid.tolerance}
    rl_observe(
        len(repeated.logprobs),
        f"tokens continuing a prompt cached before an 'all' swap scored as uncached "
        f"(max |Δ| {d:.2g}; the swap moved them {moved:.2g})",
    )


@clause("FID-DECODE-1")
@scored
def test_decode_logprobs_equal_prefill_logprobs(rl_deployment, fid, rl_observe):
    """Logprobs reported while generating equal the prefill (echo) logprobs of the same tokens within the tolerance."""
    prompt = rl_deployment.token_ids("fid-decode", 24)
    session = rl_deployment.session("fid-decode")  # one replica decodes and echoes
    # sampled, as a rollout is: tokens less likely than the greedy ones, whose logprobs are far
    # enough from 0 that a rounding of them (bf16's 2^-9) shows above the tolerance
    s = rl_deployment.complete(
        {"prompt": prompt, "max_tokens": 16, "temperature": 1, "logprobs": True, "stream": True}, headers=session
    ).expect_ok()
    generated = [(e.get("token_id"), e.get("logprob")) for e in s.entries]
    if not generated or not all(isinstance(t, int) and isinstance(x, int | float) for t, x in generated):
        inconclusive("the generated tokens carry no token_id and logprob (see INF-LOGPROBS-1)")
    ids = prompt + [t for t, _ in generated]
    prefill, _ = echo_logprobs(rl_deployment, ids, session | {ISOLATION: rl_deployment.salted("fid-decode")})
    echoed = prefill[len(prompt) - 1 :]
    d, i = largest_difference([float(x) for _, x in generated], echoed)
    assert d <= fid.tolerance, (
        f"generated token {i} (id {generated[i][0]}) was reported with logprob {generated[i][1]!r} while decoding, "
        f"and scores {echoed[i]!r} when the same tokens are echoed: |Δ| {d:.3g} > tolerance {fid.tolerance:g}"
    )
    rl_observe.figures = {"max_abs_delta": d, "tolerance": fid.tolerance}
    rl_observe(len(generated), f"generated tokens whose decode logprob equals their echoed logprob (max |Δ| {d:.2g})")


@clause("FID-BATCH-1")
@scored
def test_logprobs_alone_and_under_load_agree(rl_deployment, fid, rl_observe):
    """A request's logprobs alone and under concurrent load agree within the tolerance; the report gives the max
    |delta|."""
    prompt = rl_deployment.token_ids("fid-batch", 48)
    session = rl_deployment.session("fid-batch")  # one replica: the load shares its batches

    def judged(name: str) -> list[float]:
        return echo_logprobs(rl_deployment, prompt, session | {ISOLATION: rl_deployment.salted(name)})[0]

    alone = judged("fid-batch-alone")
    started = [threading.Event() for _ in range(LOAD_STREAMS)]
    ended: dict[int, float] = {}  # on the run's clock (the cassette's in replay), as judged overlap

    def load(i: int) -> None:
        body = {
            "prompt": rl_deployment.prompt(f"fid-batch-load-{i}", 24).body,
            "stream": True,
            "temperature": 0,
            "max_tokens": rl_deployment.long_stream_tokens,
            "ignore_eos": True,
        }
        try:
            rl_deployment.complete(body, headers=session, on_chunk=lambda _: started[i].set())
        finally:
            started[i].set()
            ended[i] = rl_deployment.mark(f"fid-batch-load-{i}-ended")

    with rl_deployment.observable_swaps():  # the reference deployment decodes at a pace the load outlasts
        threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(LOAD_STREAMS)]
        for t in threads:
            t.start()
        for e in started:
            e.wait(rl_deployment.timeouts.exchange)
        crowded = judged("fid-batch-crowded")
        answered = rl_deployment.mark("fid-batch-answered")
        for t in threads:
            t.join(rl_deployment.timeouts.exchange)
    overlapped = sum(ended.get(i, 0.0) > answered for i in range(LOAD_STREAMS))
    if overlapped == 0:
        inconclusive("every load stream had ended before the request judged was answered")
    d, i = largest_difference(alone, crowded)
    rl_observe.figures = {"max_abs_delta": d, "tolerance": fid.tolerance, "concurrent_streams": overlapped}
    assert d <= fid.tolerance, (
        f"the same prompt scores differently beside {overlapped} streams than alone: max |Δlogprob| {d:.3g} at "
        f"token {i + 1} > tolerance {fid.tolerance:g}"
    )
    rl_observe(len(alone), f"prompt logprobs alone and beside {overlapped} decoding streams, max |Δ| {d:.2g}")
