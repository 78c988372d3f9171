"""Sampling: greedy, temperature, top-k, top-p and seeds; the behaviour-policy logprob."""

import numpy as np

from pytest_rlrollout.reference.model import log_softmax
from pytest_rlrollout.reference.sampling import SamplingParams, sample

LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 3.0], dtype=np.float32)


def test_greedy():
    token, logprob, sampling_logprob = sample(LOGITS, SamplingParams(temperature=0), np.random.default_rng(0))
    assert token == 5 and sampling_logprob == 0.0
    assert np.isclose(logprob, log_softmax(LOGITS.astype(np.float64))[5])


def test_top_k_1_and_tiny_top_p_are_greedy():
    rng = np.random.default_rng(1)
    assert {sample(LOGITS, SamplingParams(1.0, 1.0, 1), rng)[0] for _ in range(50)} == {5}
    assert {sample(LOGITS, SamplingParams(1.0, 1e-6, 0), rng)[0] for _ in range(50)} == {5}


def test_top_k_keeps_only_the_k_best_and_reports_the_truncated_probability():
    rng = np.random.default_rng(2)
    draws = [sample(LOGITS, SamplingParams(1.0, 1.0, 2), rng) for _ in range(400)]
    assert {t for t, _, _ in draws} == {0, 5}
    p5 = np.exp(3.0) / (np.exp(3.0) + np.exp(2.0))
    assert all(np.isclose(s, np.log(p5 if t == 5 else 1 - p5)) for t, _, s in draws)
    assert all(lp < s for t, lp, s in draws)  # the model's logprob is below the truncated policy's


def test_temperature_and_seed():
    a = [sample(LOGITS, SamplingParams(0.7), np.random.default_rng(9))[0] for _ in range(3)]
    b = [sample(LOGITS, SamplingParams(0.7), np.random.default_rng(9))[0] for _ in range(3)]
    assert a == b
    rng = np.random.default_rng(3)
    hot = [sample(LOGITS, SamplingParams(2.0), rng)[0] for _ in range(600)]
    assert len(set(hot)) == len(LOGITS)  # high temperature reaches every token
