"""The snapshot factory: what each snapshot a run swaps in costs, that every change is relative
to the base, and that what nothing serves any more leaves the bucket."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from pytest_rlrollout.remote.bucket import Bucket
from pytest_rlrollout.runs.snapshots import SnapshotFactory
from pytest_rlrollout.snapshot import build, tiny_moe
from pytest_rlrollout.snapshot import safetensors_io as st


@pytest.fixture
def factory(tmp_path, bucket) -> SnapshotFactory:
    """A factory on the reference base, with a bucket (on this machine) holding it."""
    base = bucket / tiny_moe.BASE_IDENTITY
    made = SnapshotFactory(
        base, Bucket(bucket), tmp_path / "work", "t", tmp_path / "record.json", model="tiny", incremental=True
    )
    made.for_test("test_snapshots::factory")
    return made


def tensors(directory: Path) -> dict[str, np.ndarray]:
    return {name: t.data for name, t in build.read_snapshot(directory).items()}


def same_tensors(a: Path, b: Path) -> bool:
    x, y = tensors(a), tensors(b)
    return x.keys() == y.keys() and all(np.array_equal(x[n], y[n]) for n in x)


def expected(factory: SnapshotFactory, overlay: dict, out: Path) -> Path:
    """The base with `overlay` applied, written whole by `build.derive` (the old way)."""
    from pytest_rlrollout.runs.snapshots import _apply

    change = {n: _apply(factory._base_tensor(n), op) for n, op in overlay.items()}
    return build.derive(factory.base, out, change)


def shard_of(factory: SnapshotFactory, tensor: str) -> str:
    return factory.index["weight_map"][tensor]


def test_a_full_snapshot_writes_only_the_shards_it_changes_and_links_the_rest(factory, tmp_path):
    """On a bucket on this machine holding the base: the shard holding the changed tensor is
    the only file written; every other file is a hard link to the base's copy in the bucket
    (nothing sent); the snapshot holds exactly the bytes of a whole derive."""
    change = factory.visible_change(None)
    built = factory.full("one", change)
    root = Path(factory.bucket.local_path) / built.identity
    changed = shard_of(factory, next(iter(change)))
    base = root.parent / factory.base.name
    assert sorted(os.listdir(root)) == sorted(os.listdir(base))
    for name in os.listdir(root):
        linked = os.stat(root / name).st_ino == os.stat(base / name).st_ino
        assert linked == (name != changed), name
    assert built.uploaded_bytes == 0 and built.copied_bytes == 0
    assert built.written_bytes == (root / changed).stat().st_size
    assert built.linked_bytes == sum((root / n).stat().st_size for n in os.listdir(root))
    assert same_tensors(root, expected(factory, change, tmp_path / "whole"))
    assert not (factory.workdir / built.identity).exists(), "the local build is removed once it is in the bucket"


def test_a_full_snapshot_on_a_bucket_without_the_base_uploads_the_base_files_from_this_machine(tmp_path, base_snapshot):
    """Where the bucket does not hold the base, the unchanged files come from the local base
    (linked into a bucket on this machine, on the same file system)."""
    base = tmp_path / "base"
    shutil.copytree(base_snapshot, base)
    (tmp_path / "empty").mkdir()
    factory = SnapshotFactory(
        base, Bucket(tmp_path / "empty"), tmp_path / "work", "t", tmp_path / "r.json", model="tiny", incremental=False
    )
    change = factory.visible_change(None)
    built = factory.full("one", change)
    root = tmp_path / "empty" / built.identity
    assert os.stat(root / "config.json").st_ino == os.stat(base / "config.json").st_ino
    assert same_tensors(root, expected(factory, change, tmp_path / "whole"))


def test_on_an_object_store_holding_the_base_the_store_copies_what_did_not_change(factory, tmp_path):
    """On a store that is not this machine's file system (fsspec's memory store here), files
    the bucket holds under the base's name are copied by the store; the changed shard is sent."""
    bucket = Bucket(f"memory://rlt-{os.getpid()}-{tmp_path.name}")
    try:
        bucket.upload(factory.base, factory.base.name)
        memory = SnapshotFactory(factory.base, bucket, tmp_path / "work2", "t", tmp_path / "r2.json", model="tiny")
        change = memory.visible_change(None)
        built = memory.full("one", change)
        changed = shard_of(memory, next(iter(change)))
        assert built.linked_bytes == 0
        assert built.uploaded_bytes == built.written_bytes > 0
        assert (
            built.copied_bytes
            == memory.full_bytes
            + sum((factory.base / n).stat().st_size for n in memory.files if not n.endswith(".safetensors"))
            - (factory.base / changed).stat().st_size
        )
        copy = memory.base_copy("again")
        assert copy.uploaded_bytes == 0 and copy.copied_bytes > memory.full_bytes
    finally:
        bucket.fs.rm(bucket.root, recursive=True)


def test_every_change_is_relative_to_the_base_and_a_diff_turns_back_what_the_parent_changed(factory, tmp_path):
    """A sentinel after negated routers does not carry them: its diff turns them back, so the
    chain base -> routers -> sentinel materialises to the base with the sentinel alone."""
    bucket = Path(factory.bucket.local_path)
    routers = factory.sentinel(factory.base.name, "routers", {n: ["negate"] for n in factory.router_tensors})
    after = factory.sentinel(routers.identity, "step")
    assert set(factory.record.overlays[after.identity]) == {factory.sentinel_tensor}
    assert factory.record.parents[after.identity] == routers.identity
    first = build.apply_incremental(factory.base, bucket / routers.identity, tmp_path / "first")
    second = build.apply_incremental(first, bucket / after.identity, tmp_path / "second")
    assert same_tensors(second, expected(factory, factory.record.overlays[after.identity], tmp_path / "whole"))
    full = factory.full("full", {})  # a non-incremental step from the routers: nothing changed at all
    assert full.written_bytes == 0 and same_tensors(bucket / full.identity, factory.base)


def test_an_edited_config_is_the_one_file_written_beside_the_changed_shards(factory):
    """A config edit with no tensor changed writes config.json alone; the base's stays as it was."""
    built = factory.full("config", {}, config_edit=lambda cfg: cfg.update(rl_note="x"))
    root = Path(factory.bucket.local_path) / built.identity
    assert json.loads((root / "config.json").read_text())["rl_note"] == "x"
    assert "rl_note" not in json.loads((factory.base / "config.json").read_text()), "the base is untouched"
    assert built.written_bytes == (root / "config.json").stat().st_size


def test_what_nothing_serves_or_descends_from_is_removed_at_the_next_swap(factory):
    """A snapshot goes once it was signalled and nothing served is it or descends from it; one
    built by the running test and not yet signalled waits; one built by an earlier test goes."""
    bucket = Path(factory.bucket.local_path)
    a = factory.full("a", factory.visible_change(None))
    b = factory.full("b", {})
    waiting = factory.full("c", {})
    factory.signalled(a.identity)
    factory.signalled(b.identity)
    assert factory.retire({b.identity}) == [a.identity]
    assert not (bucket / a.identity).exists() and (bucket / waiting.identity).is_dir()
    # a chain: a served diff keeps its parent
    parent = factory.sentinel(b.identity, "p")
    child = factory.sentinel(parent.identity, "q")
    factory.signalled(parent.identity)
    factory.signalled(child.identity)
    assert factory.retire({child.identity}) == []  # b starts the chain the served diff descends from
    factory.for_test("test_snapshots::next")  # the test that built `waiting` ended unsignalled
    assert factory.retire({child.identity}) == [waiting.identity]
    removed, kept = factory.cleanup(keep={child.identity})
    assert kept == [b.identity, parent.identity, child.identity]
    assert removed == [a.identity, waiting.identity]
    assert sorted(os.listdir(bucket)) == sorted([factory.base.name, b.identity, parent.identity, child.identity])


def test_a_put_cut_half_way_leaves_nothing_under_the_identity(tmp_path, base_snapshot):
    """An upload that fails part-way (a file gone) raises and removes what it put, so no half
    snapshot can be signalled."""
    (tmp_path / "b").mkdir()
    bucket = Bucket(tmp_path / "b")
    files = {f.name: f for f in sorted(base_snapshot.iterdir())}
    files["zz-missing.safetensors"] = tmp_path / "gone.safetensors"
    with pytest.raises(FileNotFoundError):
        bucket.put("half", files, link=False)
    assert not bucket.exists("half")


def test_the_nested_copy_holds_the_snapshot_one_level_down(factory):
    """SNAP-ID-1's nested identity is a copy inside the bucket: linked here, nothing sent."""
    built = factory.sentinel(factory.base.name, "nested")
    done = factory.copy_nested(built.identity, built.identity + "-dir", "inner")
    inner = Path(factory.bucket.local_path) / (built.identity + "-dir") / "inner"
    assert sorted(os.listdir(inner)) == sorted(os.listdir(Path(factory.bucket.local_path) / built.identity))
    assert done.files == len(os.listdir(inner)) and done.sent == 0


def test_the_zero_frames_of_unchanged_tensors_are_made_once(factory):
    """The zero frames of unchanged tensors are made once per size, not once per sentinel."""
    from pytest_rlrollout.snapshot import arc2

    factory.sentinel(factory.base.name, "first")
    calls = arc2._zero_frame.cache_info()
    built = factory.sentinel(factory.base.name, "second")
    again = arc2._zero_frame.cache_info()
    assert again.misses == calls.misses and again.hits > calls.hits
    assert st.read_header(Path(factory.bucket.local_path) / built.identity / shard_of(factory, factory.sentinel_tensor))
