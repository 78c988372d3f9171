"""The installed suite as users run it against deployments at plain URLs: read-only without
--rl-allow-hot-load (checked on the server's own request log), green against `rlrollout serve`
in another process, and runnable from a wheel in a fresh virtual environment."""

import json
import re
import subprocess
import sys
import venv
from pathlib import Path

from pytest_rlrollout import refmodel
from pytest_rlrollout.catalogue import catalogue, data_dir
from pytest_rlrollout.deployment import reference_deployment

ROOT = Path(__file__).resolve().parent.parent
JUDGED = {"pass", "not-applicable"}


def outcomes(report: Path) -> dict[str, str]:
    return {k: v["outcome"] for k, v in json.loads(report.read_text())["clauses"].items()}


def test_without_allow_hot_load_nothing_changes_state(tmp_path):
    bucket = tmp_path / "bucket"
    with reference_deployment(bucket, token_delay=0.003, swap_delay=0.1) as dep:
        args = [sys.executable, "-m", "pytest_rlrollout.cli", "conformance", "-q", "-p", "no:randomly",
                f"--rl-deployment={dep.name}", f"--rl-base-url={dep.base_url}", f"--rl-model={dep.model}",
                f"--rl-api-key={dep.api_key}", f"--rl-base-snapshot={bucket / refmodel.BASE_IDENTITY}",
                f"--rl-report={tmp_path / 'r.json'}"]  # fmt: skip
        run = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:]
        changes = [(m, p) for m, p in dep.deployment.requests if (m, p) != ("GET", p) and "/inference/" not in p]
        assert changes == [], f"a read-only run sent {changes}"
        assert dep.deployment.ledger == []
    got = outcomes(tmp_path / "r.json")
    assert got["HL-POST-1"] == "inconclusive" and got["HL-GET-1"] == "pass", got
    assert set(got.values()) <= JUDGED | {"inconclusive"}, got


def serve(bucket: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "pytest_rlrollout.cli", "serve", f"--bucket={bucket}", *extra],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    printed = ""
    for line in proc.stdout:
        printed += line
        if line.startswith("serving"):
            return proc, printed
    raise AssertionError(f"serve stopped: {printed}")


def test_suite_against_rlrollout_serve_in_another_process(tmp_path):
    bucket = tmp_path / "bucket"
    proc, printed = serve(bucket)
    try:
        command = re.search(r"^conformance: rlrollout conformance (.*)$", printed, re.M).group(1).split()
        report = tmp_path / "r.json"
        args = [sys.executable, "-m", "pytest_rlrollout.cli", "conformance", "-q", "-n", "2", *command,
                f"--rl-report={report}"]  # fmt: skip
        run = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=900)
        assert run.returncode == 0, run.stdout[-3000:]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    got = outcomes(report)
    assert set(got.values()) <= JUDGED, {k: v for k, v in got.items() if v not in JUDGED}
    tested = {c.id for c in catalogue() if c.area != "NUM"}
    assert tested <= set(got), sorted(tested - set(got))
    # the run cleaned up after itself and says what it left serving
    assert [p.name for p in bucket.iterdir()] == [refmodel.BASE_IDENTITY]
    provenance = json.loads(report.read_text())["provenance"]
    assert provenance["mode"] == "live" and provenance["uploaded_and_removed"]
    assert provenance["served_at_start"] == [refmodel.BASE_IDENTITY]
    assert "restore" in provenance and refmodel.BASE_IDENTITY in provenance["restore"]


def test_wheel_in_a_fresh_venv_runs_the_suite(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(ROOT)], check=True, timeout=600)  # fmt: skip
    wheel = next(dist.glob("pytest_rlrollout-*.whl"))
    env_dir = tmp_path / "venv"
    # dependencies come from this interpreter's site-packages; the package itself only from the wheel
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True, timeout=600)
    where = subprocess.run([py, "-c", "import pytest_rlrollout; print(pytest_rlrollout.__file__)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout  # fmt: skip
    assert str(env_dir) in where, where
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    run = subprocess.run([env_dir / "bin" / "rlrollout", "conformance", "-q", "-n", "2", "--rl-report=r.json"],
                         capture_output=True, text=True, cwd=outside, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    got = outcomes(outside / "r.json")
    assert set(got.values()) <= JUDGED and len(got) >= 70, got
    assert data_dir("conformance").exists()
