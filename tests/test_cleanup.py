"""`rlrollout cleanup`: what a run that did not end left in the bucket goes, and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from pytest_rlrollout.cli import main
from pytest_rlrollout.snapshot import tiny_moe

from .processes import ROOT, ended

RUN = "0123abcd"
LEFT = [f"rlt-{RUN}-abcdef-01-step", f"rlt-{RUN}-abcdef-02-step-dir", "rlt-99998888-123456-01-routers"]
NOT_A_RUNS = ["my-model", "rlt-notahexid-abcdef-01-step", "rlt-0123abcd-abcdef-xx-step", "rlt-0123abcd"]


def planted(bucket) -> None:
    for name in LEFT + NOT_A_RUNS:
        (bucket / name).mkdir()
        (bucket / name / "config.json").write_text("{}")
    (bucket / LEFT[1] / "inner").mkdir()  # a nested identity's copy (SNAP-ID-1)
    (bucket / LEFT[1] / "inner" / "config.json").write_text("{}")


def test_a_dry_run_lists_what_runs_left_and_removes_nothing(bucket, capsys):
    """Only names a conformance run gives (`rlt-<8 hex>-<6 hex>-<n>-<label>`) are listed."""
    planted(bucket)
    before = sorted(os.listdir(bucket))
    assert main(["cleanup", "--rl-bucket-url", str(bucket), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[2] for line in out.splitlines()[:-1]] == sorted(LEFT)
    assert out.splitlines()[-1].startswith("would remove 3 snapshot(s), 8 bytes, from file://")
    assert sorted(os.listdir(bucket)) == before


def test_cleanup_removes_what_runs_left_and_nothing_else(bucket, capsys):
    """By run, with what a deployment may still serve kept, then the rest; the base and every
    other name stay."""
    planted(bucket)
    assert main(["cleanup", "--rl-bucket-url", str(bucket), "--run", RUN, "--keep", LEFT[0]]) == 0
    assert "kept " + LEFT[0] in capsys.readouterr().out
    assert sorted(os.listdir(bucket)) == sorted([tiny_moe.BASE_IDENTITY, LEFT[0], LEFT[2], *NOT_A_RUNS])
    assert main(["cleanup", "--rl-bucket-url", str(bucket)]) == 0
    assert sorted(os.listdir(bucket)) == sorted([tiny_moe.BASE_IDENTITY, *NOT_A_RUNS])


def test_a_run_id_that_is_not_one_is_a_usage_error(bucket, capsys):
    """A run id names 8 hex digits: anything else could match what no run made."""
    assert main(["cleanup", "--rl-bucket-url", str(bucket), "--run", "../x"]) == 2
    assert "8 lowercase hex digits" in capsys.readouterr().err


def test_after_a_run_killed_mid_swap_cleanup_leaves_the_bucket_as_it_was(tmp_path, serve):
    """A conformance run against `rlrollout serve` (3 s swaps) killed with SIGKILL once its swaps
    began (while the next is under way) leaves its snapshots; cleanup removes exactly those."""
    bucket = tmp_path / "bucket"
    command = serve("--bucket", bucket, "--load-delay", "3").named("conformance").removeprefix("rlrollout conformance ")
    before = sorted(os.listdir(bucket))
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest_rlrollout.cli",
            "conformance",
            "swap",
            *command.split(),
            "-v",
            "-p",
            "no:randomly",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        seen = []
        for line in run.stdout:
            seen.append(line)
            if "PASSED" in line and any(n.startswith("rlt-") for n in os.listdir(bucket)):
                break
        else:
            raise AssertionError("".join(seen[-30:]))
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
    finally:
        ended(run, within=0)
    left = sorted(n for n in os.listdir(bucket) if n not in before)
    assert left and all(n.startswith("rlt-") for n in left), left
    done = subprocess.run(
        [sys.executable, "-m", "pytest_rlrollout.cli", "cleanup", "--rl-bucket-url", str(bucket)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(bucket)) == before
    assert f"removed {len(left)} snapshot(s)" in done.stdout
