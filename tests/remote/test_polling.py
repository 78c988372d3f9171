"""Waiting on a condition: an interval and a deadline, backing off when asked to."""

import pytest

from pytest_rlrollout.remote import polling


def test_ticks_back_off_from_start_to_interval(monkeypatch):
    clock = {"now": 0.0}
    slept = []
    monkeypatch.setattr(polling.time, "monotonic", lambda: clock["now"])

    def sleep(s):
        slept.append(s)
        clock["now"] += s

    monkeypatch.setattr(polling.time, "sleep", sleep)
    elapsed = list(polling.ticks(1.0, 0.5, start=0.01))
    assert slept[:4] == [0.01, 0.02, 0.04, 0.08] and max(slept) <= 0.5
    assert elapsed[0] == 0.0 and elapsed[-1] >= 1.0 and sum(slept) == pytest.approx(elapsed[-1])


def test_wait_until_returns_the_value_or_names_what_it_waited_for(monkeypatch):
    monkeypatch.setattr(polling.time, "sleep", lambda s: None)
    values = iter([0, None, "ready"])
    assert polling.wait_until(lambda: next(values), timeout=5, interval=0.01, what="x") == "ready"
    with pytest.raises(TimeoutError, match="the replicas at rest: not reached within 0 s"):
        polling.wait_until(lambda: False, timeout=0, interval=0.01, what="the replicas at rest")
