"""The soak's figures: latencies read back within a bucket's width, and several workers' figures
merged equal to one worker recording everything."""

from __future__ import annotations

import json
import random

import pytest

from pytest_rlrollout.soak.figures import FLOOR, GROWTH, Figures, Latencies, Timed
from pytest_rlrollout.soak.judge import Heard, Turn
from pytest_rlrollout.soak.summary import rates


def timed(
    worker, session, sent_at, chunk_at, *, identities=None, status=200, ended=(0, 0), whole=True, replica=None
) -> Timed:
    identities = identities or ("base",) * len(chunk_at)
    turn = Turn(
        worker,
        session,
        0,
        Heard(0, 0),
        Heard(*ended),
        status,
        tuple(identities),
        finish_reason="stop" if whole else None,
        done=whole,
        tokens=len(chunk_at),
        usage_tokens=len(chunk_at),
        replica=replica,
    )
    return Timed(turn, sent_at, tuple(chunk_at), (1,) * len(chunk_at))


def test_quantiles_are_read_within_a_bucket_and_never_past_the_largest():
    rng = random.Random(7)
    values = [rng.lognormvariate(-3, 1) for _ in range(5000)]
    lat = Latencies()
    for v in values:
        lat.add(v)
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.99):
        exact = ordered[max(1, round(q * len(ordered))) - 1]
        assert exact <= lat.quantile(q) <= exact * GROWTH * 1.0001, q
    assert (lat.count, lat.max, lat.quantile(1.0)) == (5000, max(values), max(values))
    assert Latencies().quantile(0.5) is None
    tiny = Latencies()
    tiny.add(0.0)
    assert tiny.quantile(0.5) == 0.0 and tiny.buckets == {0: 1}  # at or below FLOOR: bucket 0
    tiny.add(FLOOR * GROWTH**3)
    assert tiny.buckets == {0: 1, 3: 1}  # a bucket's upper bound belongs to it


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_latency_that_is_no_duration_is_refused(bad):
    with pytest.raises(ValueError, match="a latency of"):
        Latencies().add(bad)
    with pytest.raises(ValueError, match="between 0 and 1"):
        Latencies().quantile(1.5)


def test_a_turn_gives_tokens_first_token_gaps_stalls_and_tokens_per_second():
    f = Figures()
    f.record(
        timed("w1", "s1", 0.5, [0.75, 0.8, 1.6, 1.7], identities=("base", "base", "step-1", "step-1"), ended=(1, 1))
    )
    f.record(timed("w1", "s2", 2.0, [], status=425))
    f.record(timed("w1", "s2", 3.0, [3.1], whole=False))
    assert (len(f.sessions), f.turns, f.tokens) == (2, 3, 5)
    assert f.errors == {"425": 1, "ended early": 1}
    assert (f.ttft.count, f.gap.count) == (2, 3)
    assert f.stall[1].count == 1 and f.stall[1].max == pytest.approx(0.8)  # the gap across swap 1
    assert f.per_second == {0: 2, 1: 2, 3: 1}


def test_workers_figures_merged_equal_one_worker_recording_them_all():
    rng = random.Random(3)
    turns = []
    for i in range(200):
        start = rng.uniform(0, 50)
        chunks = [start + rng.uniform(0.01, 0.2)]
        for _ in range(rng.randrange(0, 8)):
            chunks.append(chunks[-1] + rng.expovariate(40))
        turns.append(
            timed(
                f"w{i % 3}",
                f"s{i % 17}",
                start,
                chunks,
                ended=(rng.randrange(0, 3),) * 2,
                status=rng.choice([200, 200, 200, 503, 0, 425]),
                replica=f"engine-{i % 2}",
            )
        )
    alone, parts = Figures(), [Figures(), Figures(), Figures()]
    for t in turns:
        alone.record(t)
        parts[int(t.turn.worker[1:])].record(t)
    together = parts[0].merge(parts[1]).merge(parts[2])
    assert together.to_json() == alone.to_json()
    assert Figures.from_json(together.to_json()).to_json() == alone.to_json()
    assert together.turns == sum(p.turns for p in parts) == 200
    assert len(alone.ttft_at) > 5 and sum(v.count for v in alone.gap_at.values()) == alone.gap.count
    assert all(Timed.from_json(json.loads(json.dumps(t.to_json()))) == t for t in turns)  # as the hub passes them on


def test_each_replica_gets_the_figures_of_the_turns_it_served():
    """A fleet's figures per engine: each turn counts for the replica its answer named; a turn
    no replica answered counts for none."""
    f = Figures()
    f.record(timed("w1", "s1", 0.0, [0.1, 0.3], replica="http://a"))
    f.record(timed("w1", "s2", 0.0, [0.2], replica="http://b", whole=False))
    f.record(timed("w1", "s3", 1.0, [1.4, 1.5, 1.6], replica="http://b"))
    f.record(timed("w1", "s4", 2.0, [], status=0))
    a, b = f.replicas["http://a"], f.replicas["http://b"]
    assert sorted(f.replicas) == ["http://a", "http://b"]
    assert (a.turns, a.tokens, b.turns, b.tokens) == (1, 2, 2, 4)
    assert (a.errors, b.errors, f.errors) == ({}, {"ended early": 1}, {"ended early": 1, "dropped": 1})
    assert (a.ttft.count, b.ttft.count, a.gap.count, b.gap.count) == (1, 2, 1, 2)
    assert b.ttft.max == pytest.approx(0.4)


def test_a_timed_turn_must_time_every_chunk_in_order():
    turn = timed("w", "s", 0.0, [0.1, 0.2]).turn
    with pytest.raises(ValueError, match="every chunk"):
        Timed(turn, 0.0, (0.1,), (1,))
    with pytest.raises(ValueError, match="in order"):
        Timed(turn, 0.5, (0.1, 0.2), (1, 1))


def test_tokens_per_second_over_bins_the_last_one_over_the_part_the_soak_lasted():
    per_second = {0: 50, 4: 50, 5: 100, 11: 40}  # a 12-second soak: bins [0, 5), [5, 10), [10, 12)
    assert rates(per_second, 12.0) == ((0, 20.0), (5, 20.0), (10, 20.0))
    assert rates({0: 3}, 0.2) == ((0, 3.0),)  # under a second: counted over one, not inflated
