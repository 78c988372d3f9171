"""Simulated rollouts: each turn's prompt is the last prompt, its completion and the next
observation; bounded in turns and context; the same seed, the same rollout."""

from __future__ import annotations

from itertools import pairwise

import pytest

from pytest_rlrollout.soak.rollouts import Trajectory


def play(t: Trajectory, completion_of=lambda body: [7] * body["max_tokens"]) -> list[dict]:
    bodies = []
    while not t.done:
        bodies.append(t.request())
        t.answered(completion_of(bodies[-1]))
    return bodies


def test_each_turn_extends_the_last_prompt_by_its_completion_and_an_observation():
    t = Trajectory("s1", seed=3, vocab=500, turns=5, max_tokens=8)
    bodies = play(t, lambda body: [len(body["prompt"]) % 500] * 8)
    assert len(bodies) == 5 and t.index == 5
    for before, after in pairwise(bodies):
        grown = [*before["prompt"], *[len(before["prompt"]) % 500] * 8]
        assert after["prompt"][: len(grown)] == grown
        assert 4 <= len(after["prompt"]) - len(grown) <= 16  # the observation
    assert all(b["stream"] and b["logprobs"] and b["max_tokens"] == 8 for b in bodies)
    assert all(0 <= tok < 500 for b in bodies for tok in b["prompt"])
    assert "include_routing_matrix" not in bodies[0]
    assert Trajectory("s", seed=3, vocab=500, routing=True).request()["include_routing_matrix"] is True


def test_a_trajectory_ends_before_its_context_passes_the_bound():
    t = Trajectory("s2", seed=1, vocab=50, turns=100, max_tokens=32, max_context=200)
    bodies = play(t)
    assert 1 <= len(bodies) < 100
    assert all(len(b["prompt"]) + 32 <= 200 for b in bodies)
    assert len(t.prompt) + 32 > 200  # it stopped because the next turn could pass the bound
    with pytest.raises(RuntimeError, match="the trajectory is over"):
        t.request()


def test_the_same_seed_gives_the_same_rollout_and_another_seed_another():
    assert play(Trajectory("a", seed=9, vocab=500)) == play(Trajectory("a", seed=9, vocab=500))
    assert play(Trajectory("a", seed=9, vocab=500)) != play(Trajectory("a", seed=10, vocab=500))


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"vocab": 0}, "needs a vocabulary"),
        ({"first": (10, 5)}, "least first"),
        ({"max_context": 40}, "past max_context 40"),
    ],
)
def test_a_trajectory_that_cannot_run_is_refused(fields, words):
    with pytest.raises(ValueError, match=words):
        Trajectory("s", seed=0, **{"vocab": 500, **fields})


def test_a_completion_longer_than_asked_is_refused():
    t = Trajectory("s", seed=0, vocab=500, max_tokens=4)
    t.request()
    with pytest.raises(ValueError, match="5 completion tokens, more than max_tokens 4"):
        t.answered([1] * 5)
