"""SOAK — the contract at rollout concurrency, across many swaps (`rlrollout soak`, `-o rl_soak=true`).

One soak per run (the `soak` fixture): simulated agentic rollouts on Locust (multi-turn sessions
with growing prefixes, streamed, with logprobs) while a trainer swaps a snapshot in every few
seconds through the same swap path as the SWAP tests. Every turn is judged as it comes in
(`pytest_rlrollout.soak.judge`); each clause the soak judges is a test here that reads its
verdict: how many streams (or swaps) it judged, and on a failure how many broke it, with up to
five of their exchanges. Left out of every run that does not ask for it.
"""

import pytest

from pytest_rlrollout.suite.marks import clause, requires
from pytest_rlrollout.suite.outcomes import inconclusive, not_applicable

pytestmark = pytest.mark.rl_soak

# clause -> what one of its judgements is; the transition a clause needs, where it needs one
JUDGED = {
    "SWAP-NEW-1": "streams sent after every replica served a swap, answered by that snapshot or a later one",
    "SWAP-ASYNC-1": "streams across a swap that ended whole",
    "SWAP-ASYNC-2": "streams across a swap whose policy version only moved forward and named every swap served",
    "SWAP-ASYNC-3": "requests sent during a swap, queued and answered 200",
    "SWAP-SYNC-1": "streams in flight at a swap that kept their snapshot",
    "SWAP-SYNC-2": "425 answers, each inside a swap",
    "VER-STREAM-1": "streams whose every chunk named a snapshot the trainer loaded",
    "VER-SPAN-1": "streams whose version spans covered their output once, each naming a snapshot the trainer loaded",
    "INF-SSE-1": "streams that ended whole",
    "CACHE-MATRIX-ALL-SAME": "turns after a reset_prompt_cache 'all' swap that reused nothing cached before it",
    "FID-SWAP-1": "replicas whose fingerprint moved with a swap",
    "HL-GET-2": "swaps every replica served",
}
TRANSITION = {
    "SWAP-ASYNC-1": "ASYNC",
    "SWAP-ASYNC-2": "ASYNC",
    "SWAP-ASYNC-3": "ASYNC",
    "SWAP-SYNC-1": "SYNC",
    "SWAP-SYNC-2": "SYNC",
}
# the clauses judged by the policy version each chunk names (the judge reads nothing else for them)
VERSIONED = {"SWAP-NEW-1", "SWAP-ASYNC-2", "VER-STREAM-1", "VER-SPAN-1", "CACHE-MATRIX-ALL-SAME"}


def needs(clause_id: str) -> list[str]:
    return ([f"transition:{TRANSITION[clause_id]}"] if clause_id in TRANSITION else []) + (
        ["policy_version"] if clause_id in VERSIONED else []
    )


@pytest.fixture(scope="session")
def soak(request, rl_deployment, rl_snapshots, tmp_path_factory):
    """The run's one soak (`soak.in_suite`): every clause below reads its verdicts."""
    from pytest_rlrollout.soak.in_suite import soaked

    if rl_deployment.mode == "replay":
        not_applicable("a soak runs against a deployment, not a recording")
    if rl_snapshots is None:
        inconclusive("the soak swaps snapshots in: it needs --rl-bucket-url and --rl-base-snapshot")
    return soaked(request.config, rl_deployment, rl_snapshots, tmp_path_factory)


@pytest.mark.parametrize(
    "clause_id",
    [pytest.param(c, marks=[clause(c), *([requires(*needs(c))] if needs(c) else [])], id=c) for c in JUDGED],
)
def test_soak(soak, clause_id, rl_observe):
    v = soak.verdicts.get(clause_id)
    what = JUDGED[clause_id]
    if v is not None and not v.judged and v.uncounted:
        inconclusive(
            f"{v.uncounted} streams crossed a swap and ended, but none carried both usage "
            "(stream_options.include_usage) and logprobs entries: whether any restarted cannot be counted"
        )
    if v is None or not v.judged:
        inconclusive(
            f"the soak met no occasion to judge: no {what.split(',')[0]} ({len(soak.swaps)} swaps, "
            f"{soak.figures.turns} turns)"
        )
    assert not v.violations, (
        f"{v.violations} of {v.judged} judged broke {clause_id} in a {soak.seconds:.0f} s soak ({len(soak.swaps)} "
        f"swaps, {soak.figures.turns} turns); the first {len(v.examples)}:\n\n" + "\n\n".join(v.examples)
    )
    rl_observe(v.judged, what)


def test_soak_books(soak, rl_soak_summary):
    """The soak's own books, and its figures for the report: every turn a worker counted reached the
    judge (the verdicts above rest on all of them). A failure here is the soak's, not the deployment's."""
    from pytest_rlrollout.soak.summary import summary

    rl_soak_summary(summary(soak))
    assert soak.figures.turns, "no rollout turn came back from Locust"
    counted = soak.summed()
    assert counted.to_json() == soak.figures.to_json(), (
        f"{len(soak.workers)} workers counted {counted.turns} turns and {counted.tokens} tokens; the judge saw "
        f"{soak.figures.turns} turns and {soak.figures.tokens} tokens"
    )
