"""A stream the suite's own time bound cut while it was within the tokens it was asked for is
`inconclusive` naming the bound (slow is not wrong); a stream past the tokens it was asked for,
or cut by the events bound, stays the deployment's (the test's assertion judges it)."""

import pytest

from pytest_rlrollout.remote.limits import LimitExceeded
from pytest_rlrollout.suite.observe import not_cut_by_the_suite


def test_a_stream_cut_by_the_suites_time_is_inconclusive_naming_the_bound():
    cut = LimitExceeded("Limits.exchange = 20 s", "POST /v1/completions: the stream was still sending after 20 s")
    with pytest.raises(
        pytest.skip.Exception,
        match=r"inconclusive: the stream was cut by the suite's own bound after "
        r"814 of 1000 tokens .*Limits.exchange = 20 s.*rl_exchange_timeout",
    ):
        not_cut_by_the_suite(cut, 814, 1000)
    deadline = LimitExceeded("the test's deadline", "POST /v1/completions: the stream was still sending after 9 s")
    with pytest.raises(pytest.skip.Exception):
        not_cut_by_the_suite(deadline, 10, 1000)


def test_what_stays_the_deployments():
    not_cut_by_the_suite(None, 10, 1000)
    not_cut_by_the_suite(ConnectionResetError("reset by peer"), 10, 1000)
    not_cut_by_the_suite(LimitExceeded("Limits.events = 2,064 (or twice the tokens asked for)", "too many"), 2065, 1000)
    not_cut_by_the_suite(LimitExceeded("Limits.exchange = 20 s", "still sending"), 1200, 1000)  # more than asked


def test_no_answer_within_the_suites_time_is_inconclusive_not_the_deployments_fail():
    """A test whose exchange got no byte of an answer before the suite's own time bound is
    inconclusive, naming the bound; a stream cut while sending, or a bound on what came, is not."""
    from pytest_rlrollout.suite.plugin import _cut_by_the_suite

    silent = LimitExceeded("Limits.exchange = 20 s", "POST /v1/completions: no answer came after 20 s", silent=True)
    assert "slow is not wrong" in _cut_by_the_suite(silent) and "Limits.exchange = 20 s" in _cut_by_the_suite(silent)
    assert _cut_by_the_suite(LimitExceeded("Limits.exchange = 20 s", "the stream was still sending")) is None
    assert _cut_by_the_suite(LimitExceeded("Limits.body = 32 MiB", "a huge body", silent=True)) is None
    assert _cut_by_the_suite(AssertionError("a real finding")) is None
