import json
import subprocess
import sys

import pytest

from pytest_rlrollout.cli import main
from pytest_rlrollout.snapshot import broken

from .support import tree_hash


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "pytest_rlrollout.cli", *map(str, args)], capture_output=True, text=True
    )


def test_validate_exit_codes(reference, tmp_path, capsys):
    assert main(["validate", str(reference["full"].snapshot), "--base", str(reference.base)]) == 0
    assert "valid: 0 finding(s)" in capsys.readouterr().out
    bad = broken.broken_case("SNAP-INDEX-2", reference, tmp_path)
    assert main(["validate", str(bad.snapshot), "--base", str(reference.base), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False and doc["findings"][0]["clause"] == "SNAP-INDEX-2"
    should = broken.broken_case("SNAP-TOK-1a", reference, tmp_path / "s")
    assert main(["validate", str(should.snapshot), "--base", str(reference.base)]) == 1
    assert main(["validate", str(should.snapshot), "--base", str(reference.base), "--level", "must"]) == 0


def test_validate_usage_and_io_errors(tmp_path):
    r = run("validate", tmp_path / "missing")
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = run("validate")
    assert r.returncode == 2
    (tmp_path / "sig.json").write_text("[1]")
    (tmp_path / "snap").mkdir()
    r = run("validate", tmp_path / "snap", "--signal", tmp_path / "sig.json")
    assert r.returncode == 2 and "JSON object" in r.stderr


def test_validate_with_parent_and_signal(reference, tmp_path):
    inc = reference["incremental"]
    (tmp_path / "signal.json").write_text(json.dumps(inc.signal))
    args = ["validate", inc.snapshot, "--parent", inc.parent, "--base", inc.base, "--signal", tmp_path / "signal.json"]
    assert main(list(map(str, args))) == 0


def test_make_base_export_delta_apply(tmp_path, capsys):
    assert main(["make-base", str(tmp_path / "base")]) == 0
    assert main(["export", str(tmp_path / "base"), str(tmp_path / "exported"), "--max-shard-size", "20KiB"]) == 0
    assert main(["validate", str(tmp_path / "exported"), "--base", str(tmp_path / "base")]) == 0
    capsys.readouterr()
    assert main(["delta", str(tmp_path / "base"), str(tmp_path / "base"), str(tmp_path / "d")]) == 0
    signal = json.loads(capsys.readouterr().out)
    assert signal["incremental_snapshot_metadata"]["compression_format"] == "arc_v2"
    assert main(["apply", str(tmp_path / "base"), str(tmp_path / "d"), str(tmp_path / "a")]) == 0
    for shard in (tmp_path / "base").glob("*.safetensors"):
        assert (tmp_path / "a" / shard.name).read_bytes() == shard.read_bytes()


def test_export_into_a_non_empty_directory_is_refused_and_loses_nothing(reference, tmp_path):
    target = reference["full"].snapshot
    before = tree_hash(target)
    r = run("export", reference.base, target)
    assert r.returncode == 2 and "not empty" in r.stderr
    assert tree_hash(target) == before


@pytest.mark.parametrize(("text", "value"), [("5GB", 5 * 1024**3), ("512MiB", 512 * 1024**2), ("1000", 1000)])
def test_sizes(text, value):
    from pytest_rlrollout.cli import _size

    assert _size(text) == value


def test_clauses_lists_the_catalogue(capsys):
    assert main(["clauses", "--area", "snap"]) == 0
    out = capsys.readouterr().out
    assert "SNAP-INDEX-2" in out and "HL-POST-1" not in out
