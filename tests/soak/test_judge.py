"""The soak's judge on streams built by hand: each rule caught with its count and an example, and
nothing held against a deployment for what a worker heard late."""

from __future__ import annotations

import pytest

from pytest_rlrollout.contract.outcomes import Outcome
from pytest_rlrollout.remote.stream import Stream
from pytest_rlrollout.soak.judge import EXAMPLES, Heard, Judge, Turn, Verdict, merged


def stream(*identities, sent=(0, 0), ended=(0, 0), status=200, whole=True, session="s", **fields) -> Turn:
    tokens = len(identities)
    ending = {"done": True, "finish_reason": "stop", "usage_tokens": tokens} if whole else {}
    return Turn(
        "w1",
        session,
        0,
        Heard(*sent),
        Heard(*ended),
        status,
        tuple(identities),
        tokens=tokens,
        exchange=f"POST /v1/completions ({session})",
        **{**ending, **fields},
    )


def outcomes(judge: Judge) -> dict[str, str]:
    return {clause: str(v.outcome) for clause, v in judge.verdicts.items()}


def test_a_stream_across_an_async_swap_passes_every_clause_it_meets():
    judge = Judge("ASYNC", ["base", "step-1"])
    judge.judge(stream("base", "base", "step-1", "step-1", sent=(0, 0), ended=(1, 1)))
    assert outcomes(judge) == dict.fromkeys(["VER-STREAM-1", "SWAP-ASYNC-1", "SWAP-NEW-1", "SWAP-ASYNC-2"], "pass")


def test_a_request_sent_after_the_swap_was_served_answered_by_the_old_snapshot():
    judge = Judge("ASYNC", ["base", "step-1"])
    judge.judge(stream("base", "base", sent=(1, 1), ended=(1, 1), session="late"))
    v = judge.verdicts["SWAP-NEW-1"]
    assert (v.outcome, v.judged, v.violations) == (Outcome.FAIL, 1, 1)
    assert v.examples[0].startswith(
        "w1 session late turn 0: sent after every replica served step-1 (swap 1), answered by base (swap 0)"
    )
    assert "POST /v1/completions (late)" in v.examples[0]  # the exchange behind it


def test_an_async_stream_whose_snapshot_goes_back_breaks_swap_async_2():
    judge = Judge("ASYNC", ["base", "step-1"])
    judge.judge(stream("base", "step-1", "base", ended=(1, 1)))
    assert judge.verdicts["SWAP-ASYNC-2"].violations == 1
    assert "the snapshot went back: base -> step-1 -> base" in judge.verdicts["SWAP-ASYNC-2"].examples[0]


def test_a_stream_cut_by_a_swap_breaks_swap_async_1_and_one_cut_elsewhere_inf_sse_1():
    judge = Judge("ASYNC", ["base", "step-1"])
    judge.judge(stream("base", "base", ended=(1, 0), whole=False))  # overlapped swap 1 (signalled, not yet served)
    judge.judge(stream("base", "base", whole=False))  # no swap near it
    assert (judge.verdicts["SWAP-ASYNC-1"].violations, judge.verdicts["INF-SSE-1"].violations) == (1, 1)
    assert "[DONE] missing, 2 tokens streamed, usage None" in judge.verdicts["SWAP-ASYNC-1"].examples[0]


def test_a_stream_without_usage_is_judged_on_how_it_ended_and_never_counted_as_restarted():
    """Stream usage is an option (stream_options.include_usage) a server may ignore: a stream
    without it is not a fail, but a stream across a swap then cannot show a restart, so it is left
    uncounted (inconclusive if nothing else was judged); a restart that usage does show still fails."""
    judge = Judge("ASYNC", ["base", "step-1"])
    judge.judge(stream("base", "step-1", ended=(1, 1), usage_tokens=None))  # across the swap, no usage
    judge.judge(stream("base", "base", usage_tokens=None))  # no swap near it
    assert outcomes(judge)["INF-SSE-1"] == "pass"
    v = judge.verdicts["SWAP-ASYNC-1"]
    assert (v.outcome, v.judged, v.uncounted) == (Outcome.INCONCLUSIVE, 0, 1)
    judge.judge(stream("base", "step-1", ended=(1, 1), usage_tokens=5))  # two streamed, five counted: restarted
    v = judge.verdicts["SWAP-ASYNC-1"]
    assert (v.outcome, v.judged, v.violations, v.uncounted) == (Outcome.FAIL, 1, 1, 1)
    assert "2 tokens streamed, usage 5" in v.examples[0]
    assert merged([judge.verdicts, judge.verdicts])["SWAP-ASYNC-1"].uncounted == 2


def test_a_chunk_naming_no_loaded_snapshot_breaks_ver_stream_1():
    judge = Judge("ASYNC", ["base"])
    judge.judge(stream("base", None, "mystery"))
    v = judge.verdicts["VER-STREAM-1"]
    assert (
        v.violations == 1 and "chunks name mystery, no snapshot: no snapshot the trainer loaded (base)" in v.examples[0]
    )


def test_a_chunk_may_name_a_snapshot_its_worker_had_not_heard_of_yet():
    judge = Judge("ASYNC", ["base"])
    judge.swapped("step-1")  # the trainer signalled it; the worker's message had not arrived
    judge.judge(stream("base", "step-1", sent=(0, 0), ended=(0, 0)))
    assert outcomes(judge) == dict.fromkeys(["VER-STREAM-1", "SWAP-ASYNC-1", "SWAP-NEW-1", "SWAP-ASYNC-2"], "pass")


def test_sync_streams_keep_their_snapshot_and_425_is_theirs():
    judge = Judge("SYNC", ["base", "step-1"])
    judge.judge(stream("base", "base", ended=(1, 1)))  # drained on the old snapshot
    judge.judge(stream("base", "step-1", ended=(1, 1), session="moved"))
    judge.judge(stream(status=425, sent=(1, 0), ended=(1, 0)))
    assert (judge.verdicts["SWAP-SYNC-1"].judged, judge.verdicts["SWAP-SYNC-1"].violations) == (2, 1)
    assert "moved" in judge.verdicts["SWAP-SYNC-1"].examples[0]
    assert judge.verdicts["SWAP-SYNC-2"].outcome == Outcome.PASS
    assert "SWAP-ASYNC-1" not in judge.verdicts and "SWAP-ASYNC-3" not in judge.verdicts


def test_async_refuses_nothing_during_a_swap():
    judge = Judge("ASYNC", ["base", "step-1"])
    judge.judge(stream("step-1", sent=(1, 0), ended=(1, 1)))  # queued, then served: fine
    judge.judge(stream(status=425, sent=(1, 0), ended=(1, 0)))  # refused during the swap
    judge.judge(stream(status=425, session="quiet"))  # refused with no swap anywhere
    v = judge.verdicts["SWAP-ASYNC-3"]
    assert (v.judged, v.violations) == (3, 2)  # one verdict per stream, never two
    assert "sent during swap 1: answered 425, not queued" in v.examples[0]
    assert "sent under ASYNC: answered 425" in v.examples[1]


@pytest.mark.parametrize(("status", "words"), [(503, "answered 503"), (0, "nothing (the connection dropped)")])
def test_a_5xx_or_a_dropped_connection_breaks_inf_sse_1(status, words):
    judge = Judge("ASYNC", ["base"])
    judge.judge(stream(status=status))
    assert judge.verdicts["INF-SSE-1"].violations == 1 and words in judge.verdicts["INF-SSE-1"].examples[0]


def test_examples_are_capped_and_verdicts_of_several_workers_merge():
    one, two = Judge("ASYNC", ["base", "step-1"]), Judge("ASYNC", ["base", "step-1"])
    for i in range(EXAMPLES + 2):
        one.judge(stream("base", sent=(1, 1), ended=(1, 1), session=f"a{i}"))
    two.judge(stream("base", sent=(1, 1), ended=(1, 1), session="b"))
    two.judge(stream("step-1", sent=(1, 1), ended=(1, 1), session="c"))
    assert len(one.verdicts["SWAP-NEW-1"].examples) == EXAMPLES
    both = merged([one.verdicts, two.verdicts])["SWAP-NEW-1"]
    assert (both.judged, both.violations, len(both.examples)) == (EXAMPLES + 4, EXAMPLES + 3, EXAMPLES)
    with pytest.raises(ValueError, match="cannot merge SWAP-NEW-1 into VER-STREAM-1"):
        Verdict("VER-STREAM-1").merge(both)


def test_nothing_judged_is_inconclusive_never_a_pass():
    assert Verdict("SWAP-ASYNC-1").outcome == Outcome.INCONCLUSIVE


def test_what_cannot_be_judged_is_refused():
    with pytest.raises(ValueError, match="served only after it is signalled"):
        Heard(signalled=0, served=1)
    with pytest.raises(ValueError, match="ASYNC or SYNC"):
        Judge("LAZY", ["base"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="loaded\\[0\\]"):
        Judge("ASYNC", [])
    judge = Judge("ASYNC", ["base"])
    with pytest.raises(ValueError, match="base was loaded before"):
        judge.swapped("base")
    with pytest.raises(ValueError, match="heard of swap 1; the trainer made 0"):
        judge.judge(stream("base", ended=(1, 1)))


def chunk(identity, *tokens, finish=None, usage=None):
    entries = [{"token": str(t), "logprob": -0.5, "token_id": t} for t in tokens]
    out = {
        "model": f"accounts/a/models/m@{identity}" if identity else "accounts/a/models/m",
        "choices": [{"index": 0, "text": "x" * len(tokens), "logprobs": {"content": entries}, "finish_reason": finish}],
    }
    return out | ({"usage": usage} if usage else {})


def test_a_turn_is_read_from_the_stream_the_remote_client_parsed():
    parsed = Stream(
        200,
        {},
        chunks=[
            chunk("base", 5, 6),
            chunk("step-1", 7),
            chunk("step-1", finish="stop", usage={"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}),
        ],
        done=True,
    )
    turn = Turn.seen(parsed, worker="w2", session="s9", index=3, sent=Heard(0, 0), ended=Heard(1, 1))
    assert (turn.identities, turn.tokens, turn.usage_tokens, turn.finish_reason, turn.done) == (
        ("base", "step-1", "step-1"),
        3,
        3,
        "stop",
        True,
    )
    judge = Judge("ASYNC", ["base", "step-1"])
    judge.judge(turn)
    assert set(outcomes(judge).values()) == {"pass"}
    cut = Stream(200, {}, chunks=[chunk("base", 5), chunk(None, 6)])  # no [DONE], a chunk naming no snapshot
    judge.judge(Turn.seen(cut, worker="w2", session="s9", index=4, sent=Heard(0, 0), ended=Heard(1, 1)))
    assert judge.verdicts["VER-STREAM-1"].violations == judge.verdicts["SWAP-ASYNC-1"].violations == 1


def test_a_chunk_that_came_well_after_its_worker_heard_the_swap_served_must_name_it():
    judge = Judge("ASYNC", ["base", "step-1"])
    # `settled`: per chunk, the last swap its worker had heard served `grace` before the chunk came
    judge.judge(stream("base", "base", "base", sent=(0, 0), ended=(1, 1), settled=(0, 0, 1), session="stale"))
    judge.judge(stream("base", "base", "step-1", sent=(0, 0), ended=(1, 1), settled=(0, 0, 1), session="fresh"))
    v = judge.verdicts["SWAP-ASYNC-2"]
    assert (v.judged, v.violations) == (2, 1)
    assert v.examples[0].startswith(
        "w1 session stale turn 0: chunk 2 of 3 names base, though its worker had heard "
        "every replica served step-1 before it came"
    )
    sync = Judge("SYNC", ["base", "step-1"])  # SYNC drains: the old snapshot ends what it began
    sync.judge(stream("base", "base", "base", sent=(0, 0), ended=(1, 1), settled=(0, 0, 1)))
    assert "SWAP-ASYNC-2" not in sync.verdicts and sync.verdicts["SWAP-SYNC-1"].violations == 0


def turn(
    index: int, *identities: str | None, cached: int | None, settled: tuple[int, ...] = (), ended=(1, 1), **fields
) -> Turn:
    t = stream(*identities, sent=(0, 0), ended=ended, cached=cached, settled=settled, **fields)
    return Turn(**{**t.__dict__, "index": index})


def test_after_an_all_swap_a_sessions_next_turn_reuses_nothing_cached_before_it():
    judge = Judge("ASYNC", ["base"])
    judge.swapped("step-1", reset="all")
    judge.swapped("step-2", reset="none")
    judge.judge(turn(0, "base", "base", cached=0, ended=(0, 0)))
    judge.judge(turn(1, "step-1", "step-1", cached=24))  # swap 1 ('all') between the turns: 24 reused
    judge.judge(turn(2, "step-2", cached=40, ended=(2, 2)))  # only swap 2 ('none') between: reuse is allowed
    v = judge.verdicts["CACHE-MATRIX-ALL-SAME"]
    assert (v.judged, v.violations) == (1, 1)
    assert "24 prompt tokens served from the cache, though swap 1 (step-1) reset it ('all')" in v.examples[0]


def test_the_cache_is_not_judged_by_labels_caught_lying():
    judge = Judge("ASYNC", ["base"])
    judge.swapped("step-1", reset="all")
    # a stale label: the turn's last chunk came after step-1 was served everywhere yet names base,
    # so the KV it left may well be step-1's: the next turn's reuse is not held against the cache
    judge.judge(turn(0, "base", "base", cached=0, settled=(0, 1)))
    judge.judge(turn(1, "step-1", cached=24))
    assert judge.verdicts["SWAP-ASYNC-2"].violations == 1
    assert "CACHE-MATRIX-ALL-SAME" not in judge.verdicts


def test_a_previous_turn_that_overlapped_the_reset_leaves_the_next_one_unjudged_for_the_cache():
    # turn 0 ended after its worker heard swap 1 signalled, every chunk naming base: honest, or a
    # stale label inside the grace that no check can catch (seen in CI under the stale-label
    # fault: its KV was step-1's). Turn 1's reuse is not held against the cache; had turn 0 ended
    # before the worker heard of the swap, it would be.
    judge = Judge("ASYNC", ["base"])
    judge.swapped("step-1", reset="all")
    judge.judge(turn(0, "base", "base", cached=0, ended=(1, 1)))
    judge.judge(turn(1, "step-1", cached=24))
    assert "CACHE-MATRIX-ALL-SAME" not in judge.verdicts and judge.verdicts["SWAP-ASYNC-2"].violations == 0


def test_a_turn_that_cannot_be_dated_leaves_the_next_one_unjudged_for_the_cache():
    # turn 1 came after the 'all' swap and left step-1's KV, but one of its chunks names nothing
    # (a gap in its spans): turn 2's reuse is of turn 1's KV, not of turn 0's, and is no violation
    judge = Judge("ASYNC", ["base"])
    judge.swapped("step-1", reset="all")
    judge.judge(turn(0, "base", "base", cached=0, ended=(0, 0)))
    judge.judge(turn(1, "step-1", None, cached=0))
    judge.judge(turn(2, "step-1", cached=24))
    assert judge.verdicts["VER-STREAM-1"].violations == 1
    assert "CACHE-MATRIX-ALL-SAME" not in judge.verdicts
    # spans with a gap gave turn 1's first chunk the next span's snapshot: admitted (and served
    # its cached prefix) before the swap, it reads as begun after it (seen in a soak's CI run)
    judge = Judge("ASYNC", ["base"])
    judge.swapped("step-1", reset="all")
    judge.judge(turn(0, "base", "base", cached=0, ended=(0, 0)))
    judge.judge(turn(1, "step-1", "step-1", cached=128, span_problems=("span 1 starts at 1, not at 0 (a gap)",)))
    assert judge.verdicts["VER-SPAN-1"].violations == 1
    assert "CACHE-MATRIX-ALL-SAME" not in judge.verdicts
    # a failed turn may have left KV of its own too; a 425 left none
    for status, judged in ((503, 0), (425, 1)):
        judge = Judge("SYNC", ["base"])
        judge.swapped("step-1", reset="all")
        judge.judge(turn(0, "base", cached=0, ended=(0, 0)))
        judge.judge(stream(status=status, sent=(1, 1), ended=(1, 1)))
        judge.judge(turn(2, "step-1", cached=24))
        assert judge.verdicts.get("CACHE-MATRIX-ALL-SAME", Verdict("")).judged == judged


def test_a_deployment_without_policy_versions_is_judged_on_how_its_streams_end_only():
    """No version to read: a stream crossed a swap by what its worker heard (SWAP-ASYNC-1), any
    other is judged by how it ended (INF-SSE-1); nothing that needs a version is judged."""
    judge = Judge("ASYNC", ["base", "step-1"], versions=False)
    judge.judge(stream(None, None, sent=(0, 0), ended=(1, 1)))
    judge.judge(stream(None, None, sent=(0, 0), ended=(1, 1), whole=False))
    judge.judge(stream(None, None, whole=False))
    assert outcomes(judge) == {"SWAP-ASYNC-1": "fail", "INF-SSE-1": "fail"}
    assert (judge.verdicts["SWAP-ASYNC-1"].judged, judge.verdicts["INF-SSE-1"].judged) == (2, 1)


def test_a_turn_record_travels_as_json_and_a_stranger_is_refused():
    t = turn(3, "base", "step-1", cached=7, settled=(0, 1))
    assert Turn.from_json(t.to_json()) == t
    with pytest.raises(ValueError, match="a turn record with fields"):
        Turn.from_json({**t.to_json(), "extra": 1})


def test_versions_said_as_spans_must_cover_the_output_once_and_name_loaded_snapshots():
    judge = Judge("ASYNC", ["default", "step-1"])
    judge.judge(stream("default", "step-1", ended=(1, 1), span_problems=()))
    judge.judge(stream("default", "default", span_problems=("span 1 starts at 3, not at 2 (a gap)",), session="gap"))
    judge.judge(stream("stranger", span_problems=(), session="named"))
    v = judge.verdicts["VER-SPAN-1"]
    assert (v.judged, v.violations) == (3, 2) and "VER-STREAM-1" not in judge.verdicts
    assert v.examples[0].startswith("w1 session gap turn 0: span 1 starts at 3, not at 2 (a gap)")
    assert "spans over chunks name stranger: no snapshot the trainer loaded" in v.examples[1]
