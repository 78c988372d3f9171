"""A live run's state crosses processes as files: each record reads back as the type it was."""

from pytest_rlrollout.suite.run_state import Cleanup, Restored, RunState, Served


def test_the_first_start_wins_and_the_latest_end_is_what_the_run_left(tmp_path):
    state = RunState(tmp_path / "rl-state")
    assert state.start is None and state.end is None and state.restore is None and state.cleanups == []
    state.started(Served([{"current_snapshot_identity": "base"}], at=1.0))
    state.started(Served([{"current_snapshot_identity": "step-1"}], at=2.0))  # a second worker's read, later
    state.ended(Served([{"current_snapshot_identity": "step-3"}], at=5.0))
    assert state.start == Served([{"current_snapshot_identity": "base"}], at=1.0)
    assert state.start.label == "base" and state.end.identities == ["step-3"]
    state.restored(Restored([{"current_snapshot_identity": "base"}], at=6.0, restored="reloaded the base"))
    assert state.end == state.restore and state.restore.restored == "reloaded the base"
    state.cleaned(Cleanup(removed=["step-1"], kept=["step-3"]))
    assert state.cleanups == [Cleanup(removed=["step-1"], kept=["step-3"])]


def test_replicas_that_differ_have_no_label():
    served = Served([{"current_snapshot_identity": "a"}, {"current_snapshot_identity": "b"}])
    assert served.label is None and served.identities == ["a", "b"]
    assert Served([{"current_snapshot_identity": None}]).label is None
