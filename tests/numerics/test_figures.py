"""The R3 figures against values worked out by hand, and the scorer against the engine it wraps."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_rlrollout.numerics.figures import logprob_figures, routing_figures
from pytest_rlrollout.numerics.scorer import NumpyScorer, local_scorer
from pytest_rlrollout.reference.model import Model, Sequence_, log_softmax


def test_logprob_figures_by_hand():
    served = np.log([0.5, 0.25, 0.1, 0.4])
    local = np.log([0.5, 0.5, 0.01, 0.4])  # ratios 1, 2, 0.1, 1
    f = logprob_figures(served, local)
    assert f.tokens == 4 and f.max_abs == pytest.approx(math.log(10))
    assert f.mean_abs == pytest.approx((math.log(2) + math.log(10)) / 4)
    r = np.array([1, 2, 0.1, 1])
    assert f.k3_kl == pytest.approx(np.mean(r - 1 - np.log(r)))
    assert f.ratio_outside == 0.25  # 2 is inside [0.5, 2]; 0.1 is not


@given(st.lists(st.floats(-20, 0), min_size=1, max_size=50), st.lists(st.floats(-3, 3), min_size=50, max_size=50))
def test_k3_is_never_negative_and_zero_only_when_equal(lps, shifts):
    served = np.array(lps)
    f = logprob_figures(served, served + np.array(shifts[: len(lps)]))
    assert f.k3_kl >= 0
    assert logprob_figures(served, served).k3_kl == 0 and logprob_figures(served, served).max_abs == 0


def test_routing_figures_compare_expert_sets():
    served = np.array([[[1, 2], [3, 4]], [[5, 6], [7, 0]]])
    local = np.array([[[2, 1], [3, 4]], [[5, 6], [7, 1]]])  # the order within a row does not count
    f = routing_figures(logprob_figures(np.zeros(2), np.zeros(2)), served, local)
    assert f.route_agreement == 0.75 and f.layer_agreement == [1.0, 0.5] and f.any_disagreement == 0.5


def test_misaligned_inputs_are_refused():
    with pytest.raises(ValueError, match="do not line up"):
        logprob_figures(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="no tokens"):
        logprob_figures(np.zeros(0), np.zeros(0))


def test_numpy_scorer_is_the_engine_teacher_forced(base_snapshot):
    ids = list(range(20, 60))
    scored = NumpyScorer(base_snapshot).score(ids)
    model = Model.load(base_snapshot)
    seq, lps = Sequence_(), []
    for i, t in enumerate(ids[:-1]):  # one token at a time: the decode path
        out = model.step([seq], [[t]])[0]
        lps.append(float(log_softmax(out.logits[-1].astype(np.float64))[ids[i + 1]]))
    assert math.isnan(scored.logprobs[0])
    assert np.abs(scored.logprobs[1:] - lps).max() < 1e-4
    assert scored.routing.shape == (len(ids), 3, 2)


def test_unknown_scorer_is_named():
    with pytest.raises(ValueError, match="unknown scorer 'jax'"):
        local_scorer(".", "jax")
