"""A live run's state crosses processes as files: each record reads back as the type it was, and
satisfies schemas/run-state.schema.json."""

import json

import pytest

from pytest_rlrollout.suite.file_schemas import problems
from pytest_rlrollout.suite.run_state import Cleanup, Restored, RunState, RunStateError, Served


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


def test_every_record_the_code_writes_satisfies_the_schema(tmp_path):
    state = RunState(tmp_path / "rl-state")
    state.started(Served([{"current_snapshot_identity": "base", "readiness": True}]))
    state.ended(Served([{"current_snapshot_identity": None}]))
    state.restored(Restored([], restored="the start could not be restored"))
    state.cleaned(Cleanup(removed=["step-1"], kept=[]), name="restored")
    kinds = {"start": "served", "end": "served", "restored": "restored", "removed": "cleanup"}
    written = sorted((tmp_path / "rl-state").iterdir())
    assert len(written) == 4
    for path in written:
        doc = json.loads(path.read_text())
        assert problems("run-state", doc) == {}, path.name
        assert problems("run-state", doc, kinds[path.stem.split("-")[0]]) == {}, path.name


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("start.json", "{", "start.json: not JSON"),
        (
            "start.json",
            '{"replicas": {}, "at": 1}',
            "start.json: not a served record: replicas: {} is not of type 'array'",
        ),
        (
            "start.json",
            '{"replicas": [], "at": 1, "extra": 2}',
            "start.json: not a served record: Additional properties",
        ),
        ("restored.json", '{"replicas": [], "at": 1}', "restored.json: not a restored record: restored missing"),
        ("removed-1.json", '{"removed": ["a", 2], "kept": []}', "removed-1.json: not a cleanup record: removed[1]: 2"),
    ],
)
def test_a_file_that_is_not_its_record_is_an_error_naming_the_file_and_the_field(tmp_path, name, content, said):
    state = RunState(tmp_path)
    (tmp_path / name).write_text(content)
    with pytest.raises(RunStateError) as e:
        _ = (state.start, state.restore, state.cleanups)
    assert said in str(e.value), str(e.value)
