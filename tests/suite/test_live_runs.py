"""The installed suite as users run it against deployments at plain URLs: read-only without
--rl-allow-hot-load (checked on the server's own request log), green against `rlrollout serve`
in another process, and runnable from a wheel in a fresh virtual environment."""

import json
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.reference.settings import OBSERVABLE_PACE
from pytest_rlrollout.remote.cassette import digest
from pytest_rlrollout.snapshot import tiny_moe
from pytest_rlrollout.suite.options import CONFORMANCE

from ..support import FAST_POLLS
from .offline import NO_SOCKET

ROOT = Path(__file__).resolve().parents[2]
JUDGED = {"pass", "not-applicable"}


def outcomes(report: Path) -> dict[str, str]:
    return {k: v["outcome"] for k, v in json.loads(report.read_text())["clauses"].items()}


def test_without_allow_hot_load_nothing_changes_state(pytester, tmp_path):
    bucket = tmp_path / "bucket"
    with reference_deployment(bucket, **OBSERVABLE_PACE) as dep:
        result = pytester.runpytest_inprocess(
            str(CONFORMANCE),
            "-p",
            "no:randomly",
            f"--rl-deployment={dep.name}",
            f"--rl-base-url={dep.base_url}",
            f"--rl-model={dep.model}",
            f"--rl-api-key={dep.api_key}",
            f"--rl-base-snapshot={bucket / tiny_moe.BASE_IDENTITY}",
            "--rl-report=r.json",
        )
        assert result.ret == 0, "\n".join(result.outlines[-30:])
        changes = [(m, p) for m, p, _ in dep.deployment.requests if (m, p) != ("GET", p) and "/inference/" not in p]
        assert changes == [], f"a read-only run sent {changes}"
        assert dep.deployment.ledger == []
    doc = json.loads((pytester.path / "r.json").read_text())
    got = {k: v["outcome"] for k, v in doc["clauses"].items()}
    assert got["HL-POST-1"] == "inconclusive" and got["HL-GET-1"] == "pass", got
    assert set(got.values()) <= JUDGED | {"inconclusive"}, got
    # read-only is the reason, though the bucket and the base were given
    assert (
        doc["clauses"]["HL-POST-1"]["evidence"]
        == "read-only: pass --rl-allow-hot-load to let this test hot-load snapshots"
    )


def test_a_missing_option_is_inconclusive_naming_it(pytester, tmp_path):
    """Without the served config (--rl-base-snapshot) the suite cannot know L, k and E: the R3
    clauses that need them are inconclusive and say which option to pass; a missing option is
    never a property of the deployment (not-applicable)."""
    with reference_deployment(tmp_path / "bucket") as dep:
        result = pytester.runpytest_inprocess(
            str(CONFORMANCE / "test_r3.py"),
            "-p",
            "no:randomly",
            f"--rl-deployment={dep.name}",
            f"--rl-base-url={dep.base_url}",
            f"--rl-model={dep.model}",
            f"--rl-api-key={dep.api_key}",
            "--rl-report=r.json",
        )
        assert result.ret == 0, "\n".join(result.outlines[-30:])
    clauses = json.loads((pytester.path / "r.json").read_text())["clauses"]
    for cid in ("R3-SHAPE-1", "R3-RANGE-1", "R3-CACHE-1"):
        assert clauses[cid]["outcome"] == "inconclusive" and "--rl-base-snapshot" in clauses[cid]["evidence"], cid
    assert clauses["R3-COMP-1"]["outcome"] == clauses["R3-STREAM-1"]["outcome"] == "pass"
    assert "not-applicable" not in {c["outcome"] for c in clauses.values()}


def test_suite_twice_against_one_long_lived_rlrollout_serve(pytester, tmp_path, serve):
    """Two runs in a row against one deployment in another process: both green (each run's
    prompts, sessions and identities are its own), nothing left loaded, and each run leaves the
    deployment as it found it: the start identity signalled again and served, its canaries
    scoring as at the start, and nothing of the run left in the bucket."""
    bucket = tmp_path / "bucket"
    command = serve("--bucket", bucket).named("conformance").removeprefix("rlrollout conformance ").split()
    reports = []
    for run in ("first", "second"):
        result = pytester.runpytest_inprocess(
            str(CONFORMANCE), "-p", "no:randomly", *command, *FAST_POLLS, f"--rl-report={run}.json"
        )
        assert result.ret == 0, "\n".join(result.outlines[-30:])
        reports.append(json.loads((pytester.path / f"{run}.json").read_text()))
    # the suite's checks of its own bundled snapshots say nothing about a deployment: left out
    tested = {c.id for c in catalogue() if not (c.area == "SNAP" and c.level != "MUST")}
    for doc in reports:
        got = {k: v["outcome"] for k, v in doc["clauses"].items()}
        assert set(got.values()) <= JUDGED, {k: v for k, v in got.items() if v not in JUDGED}
        assert set(got) == tested, sorted(set(got) ^ tested)
        provenance = doc["provenance"]
        assert provenance["mode"] == "live" and provenance["uploaded_and_removed"]
        assert provenance["adapters_left_loaded"] == [] and provenance["uploaded_and_kept"] == []
        assert provenance["served_at_start"] == provenance["served_at_end"] == [tiny_moe.BASE_IDENTITY], provenance
        assert provenance["restored"].startswith(f"signalled {tiny_moe.BASE_IDENTITY} again"), provenance
        assert "the weights score as at the start" in provenance["restored"], provenance["restored"]
        # `rlrollout serve` is ASYNC by default: these runs are the FID and NUM runs against an ASYNC
        # deployment in another process (the SYNC one is test_weight_fidelity_and_numerics_...)
        assert_fidelity_and_numerics_on_numbers(doc)
    assert sorted(p.name for p in bucket.iterdir()) == [tiny_moe.BASE_IDENTITY]


def assert_fidelity_and_numerics_on_numbers(doc: dict) -> None:
    """Every FID and NUM clause of a report passes, on numbers: the routes agree, the KL is nil,
    and the full snapshots were copied within the bucket (hard-linked: it is on this machine), not
    uploaded."""
    got = {k: v["outcome"] for k, v in doc["clauses"].items() if k.split("-")[0] in ("FID", "NUM")}
    assert got == dict.fromkeys([c.id for c in catalogue() if c.area in ("FID", "NUM")], "pass"), got
    figures = doc["clauses"]["NUM-ROUTE-1"]["tests"][0]["figures"]
    assert figures["route_agreement"] == 1.0 and figures["k3_kl"] < 1e-9, figures
    uploads = [u for t in doc["clauses"]["FID-SAME-1"]["tests"] for u in t["uploads"]]
    assert {u["kind"] for u in uploads} == {"full", "incremental"}
    assert all(u["uploaded"] == 0 < u["copied"] + u["linked"] for u in uploads if u["kind"] == "full"), uploads


def test_weight_fidelity_and_numerics_against_a_sync_rlrollout_serve(pytester, tmp_path, serve):
    """FID and NUM against the reference deployment in another process under SYNC transitions,
    named by its URL, with --rl-base-snapshot giving the local weights: every clause passes, on
    numbers. (ASYNC, serve's default, is judged by the two whole-suite runs above.)"""
    served = serve("--bucket", tmp_path / "bucket", "--transition", "SYNC")
    command = served.named("conformance").removeprefix("rlrollout conformance ").split()
    modules = [str(CONFORMANCE / m) for m in ("test_fidelity.py", "test_numerics.py")]
    result = pytester.runpytest_inprocess(*modules, "-p", "no:randomly", *command, "--rl-report=r.json")
    assert result.ret == 0, "\n".join(result.outlines[-30:])
    doc = json.loads((pytester.path / "r.json").read_text())
    assert set(doc["clauses"]) == {c.id for c in catalogue() if c.area in ("FID", "NUM")}
    assert_fidelity_and_numerics_on_numbers(doc)


def test_a_live_coreweave_deployment_through_its_hot_load_api(pytester, tmp_path, monkeypatch, serve):
    """`rlrollout serve --engine coreweave` in another process, its hot-load API under a key of
    its own: named by its UUID, its gateway and its control plane, the suite recognises CoreWeave
    by the hot-load list (and says so), sends each key only where it belongs (a key in the wrong
    place is refused by the server, and every bound clause would fail), and every clause CoreWeave
    binds passes but the two a header-less gateway cannot judge on two replicas."""
    monkeypatch.setenv("COREWEAVE_API_KEY", "the-hot-load-key")
    served = serve("--bucket", tmp_path / "bucket", "--engine", "coreweave", "--control-api-key", "the-hot-load-key")
    assert "environment: COREWEAVE_API_KEY=<the --control-api-key you chose>" in served.printed  # never the key
    command = served.named("conformance").removeprefix("rlrollout conformance ").split()
    command = ["--rl-engine=auto" if c == "--rl-engine=coreweave" else c for c in command]
    result = pytester.runpytest_inprocess(str(CONFORMANCE), "-p", "no:randomly", *command, "--rl-report=r.json")
    assert result.ret == 0, "\n".join(result.outlines[-30:])
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["engine"]["name"] == "coreweave"
    assert doc["engine"]["decided"].startswith("auto: GET http://127.0.0.1:"), doc["engine"]
    assert doc["engine"]["decided"].endswith("/v1alpha1/inference/hotLoads answers CoreWeave's hot-load list")
    got = {k: v["outcome"] for k, v in doc["clauses"].items()}
    bound = {c.id for c in catalogue() if c.binds("coreweave")}
    across = {"CACHE-MATRIX-ALL-NEW", "CACHE-MATRIX-NONE-NEW"}
    assert {k: got[k] for k in bound if got[k] != "pass"} == dict.fromkeys(across, "inconclusive")
    assert {got[k] for k in set(got) - bound} == {"not-applicable"}
    assert "the-hot-load-key" not in (pytester.path / "r.json").read_text()


def test_wheel_in_a_fresh_venv_runs_the_suite(tmp_path):
    """The wheel carries everything the suite needs: the conformance modules, the catalogue and schemas,
    the shipped cassettes (replayed from the installed wheel), found from outside any checkout."""
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)],
        check=True,
        timeout=600,
    )
    wheel = next(dist.glob("pytest_rlrollout-*.whl"))
    env_dir = tmp_path / "venv"
    # dependencies come from the running interpreter's site-packages, the package itself only from
    # the wheel. Not system_site_packages: inside a virtualenv that is the base interpreter's, which
    # has not what this one has installed. A path line in a .pth is appended after the venv's own
    # site-packages, and the .pth files found there are not run (an editable install stays out).
    venv.create(env_dir, with_pip=False)  # this interpreter's pip installs into it: ensurepip cost 6 s of CPU
    running = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (next(env_dir.glob("lib/python3*/site-packages")) / "running-interpreter.pth").write_text("\n".join(running) + "\n")
    py = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        timeout=600,
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = subprocess.run(
        [py, "-c", "import pytest_rlrollout; print(pytest_rlrollout.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=outside,
    ).stdout
    assert str(env_dir) in where, where
    # the top-level directories come from the wheel, inside the installed package
    found = subprocess.run(
        [
            py,
            "-c",
            "from pytest_rlrollout.shipped import shipped\n"
            "for name in ('conformance', 'schemas', 'cassettes'): print(shipped(name))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=outside,
    ).stdout.split()
    installed = Path(where).parent / "_shipped"
    assert found == [str(installed / name) for name in ("conformance", "schemas", "cassettes")], found
    rlrollout = env_dir / "bin" / "rlrollout"
    # The shipped `reference` cassettes, named as a user names them, replayed from the installed
    # wheel (another path than where they were recorded) with every connection refused: this is
    # also the offline replay of those cassettes (test_replay.py replays `reference-sync`).
    (outside / "nosocket.py").write_text(NO_SOCKET)
    offline = {**os.environ, "PYTHONPATH": str(outside)}
    replayed = subprocess.run(
        [rlrollout, "conformance", "-q", "-p", "nosocket", "--rl-replay=reference", "--rl-report=r.json"],
        capture_output=True,
        text=True,
        cwd=outside,
        env=offline,
        timeout=900,
    )
    assert replayed.returncode == 0, replayed.stdout[-3000:]
    assert "wall time" in replayed.stdout and "sockets opened: 0" in replayed.stdout.splitlines(), replayed.stdout
    got = outcomes(outside / "r.json")
    assert set(got.values()) <= JUDGED and len(got) >= 70, got
    provenance = json.loads((outside / "r.json").read_text())["provenance"]
    assert provenance["mode"] == "replay" and provenance["deployment"].startswith("accounts/"), provenance
    assert provenance["cassettes"] == digest(installed / "cassettes" / "reference")
    local = subprocess.run(
        [rlrollout, "conformance", "-q", "session", "inference"],
        capture_output=True,
        text=True,
        cwd=outside,
        timeout=900,
    )
    assert local.returncode == 0, local.stdout[-3000:]
    docs = subprocess.run([rlrollout, "clauses", "--format", "md"], capture_output=True, text=True, cwd=outside)
    assert docs.stdout == (ROOT / "docs" / "contract.md").read_text()


def save_pretrained(base: Path, out: Path) -> Path:
    """`base` as transformers writes it with `save_pretrained` (model and tokenizer): one
    model.safetensors, no index, no spec. The config is then the served one: transformers 5
    spells the expert count `num_local_experts`, the reference serves the published
    `num_experts`, and a snapshot whose config differs from the served base's is rightly
    refused (SNAP-CONFIG-2). A deployment started from this checkpoint would serve its config."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype="auto")
    model.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(out)
    shutil.copyfile(base / "config.json", out / "config.json")
    return out


def test_a_live_run_whose_base_is_a_checkpoint_as_save_pretrained_writes_it(pytester, tmp_path, serve):
    """--rl-base-snapshot a checkpoint as `save_pretrained` writes it (one model.safetensors, no
    index, no spec), against `rlrollout serve` in its Fireworks dialect, which checks the hot-load
    layout: the suite lays the base out once and every swap, fidelity and numerics clause is judged
    as on the hot-load base (none inconclusive, none a traceback)."""
    command = serve("--bucket", tmp_path / "bucket").named("conformance").removeprefix("rlrollout conformance ").split()
    hf = save_pretrained(tmp_path / "bucket" / tiny_moe.BASE_IDENTITY, tmp_path / "hf" / "tiny-hf")
    assert sorted(p.name for p in hf.glob("*.safetensors")) == ["model.safetensors"]
    assert not (hf / "model.safetensors.index.json").exists() and not (hf / "model.weight.spec.json").exists()
    command = [f"--rl-base-snapshot={hf}" if c.startswith("--rl-base-snapshot=") else c for c in command]
    modules = [
        str(CONFORMANCE / m) for m in ("test_swap.py", "test_hot_load.py", "test_fidelity.py", "test_numerics.py")
    ]
    result = pytester.runpytest_inprocess(*modules, "-p", "no:randomly", *command, *FAST_POLLS, "--rl-report=r.json")
    assert result.ret == 0, "\n".join(result.outlines[-30:])
    got = outcomes(pytester.path / "r.json")
    assert set(got.values()) <= JUDGED, {k: v for k, v in got.items() if v not in JUDGED}


def test_r3_and_numerics_on_a_qwen3_30b_a3b_shaped_model(pytester, tmp_path, serve):
    """`rlrollout serve --layout qwen3-30b-a3b`: Qwen3-30B-A3B's structure and 18,867 tensor names
    (48 layers, 128 experts, top-8) at the reference's widths. The R3 and NUM clauses are judged
    on it as on the reference model (every one passes: routing matrices of 48 x 8, the routers of
    layers 0 and 47 negated in one swap, the local scorer's routes and logprobs), and the R3 swap
    is a sentinel diff (zero frames for all but the two routers: under 5% of the snapshot)."""
    command = serve("--bucket", tmp_path / "bucket", "--layout", "qwen3-30b-a3b").named("conformance")
    modules = [str(CONFORMANCE / m) for m in ("test_r3.py", "test_numerics.py")]
    result = pytester.runpytest_inprocess(
        *modules, "-p", "no:randomly", *command.removeprefix("rlrollout conformance ").split(), "--rl-report=r.json"
    )
    assert result.ret == 0, "\n".join(result.outlines[-30:])
    doc = json.loads((pytester.path / "r.json").read_text())
    got = {k: v["outcome"] for k, v in doc["clauses"].items()}
    assert got == dict.fromkeys([c.id for c in catalogue() if c.area in ("R3", "NUM")], "pass"), got
    observed = doc["clauses"]["R3-CHANGE-1"]["evidence"]
    assert "layers [1, 47]" in observed or "layers [0, 47]" in observed, observed
    uploads = [u for t in doc["clauses"]["R3-CHANGE-1"]["tests"] for u in t["uploads"]]
    full = sum(f.stat().st_size for f in (tmp_path / "bucket" / tiny_moe.BASE_IDENTITY).glob("*.safetensors"))
    assert uploads and all(u["kind"] == "incremental" and u["written"] < 0.05 * full for u in uploads), (full, uploads)


def test_broken_variants_of_a_qwen3_30b_a3b_shaped_model(pytester, tmp_path, serve):
    """HL-POST-5 on a model that is not the bundled reference: its broken variants are built from
    the run's own base (a full step, an ARC2 diff, a LoRA adapter and an FP8 checkpoint of the
    Qwen3-30B-A3B layout, one variant of each), judged, and refused; a variant writes the shard
    it breaks and links the rest."""
    command = serve("--bucket", tmp_path / "bucket", "--layout", "qwen3-30b-a3b").named("conformance")
    variants = ("SNAP-SAFETENSORS-1", "SNAP-INC-3", "SNAP-LORA-3", "SNAP-QUANT-1")
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE / "test_hot_load.py"),
        "-p",
        "no:randomly",
        "-k",
        f"test_violating_snapshot_is_never_served and ({' or '.join(variants)})",
        *command.removeprefix("rlrollout conformance ").split(),
        "--rl-report=r.json",
    )
    assert result.ret == 0, "\n".join(result.outlines[-30:])
    doc = json.loads((pytester.path / "r.json").read_text())
    tests = {t["test"].rsplit("[", 1)[-1].rstrip("]"): t for t in doc["clauses"]["HL-POST-5"]["tests"]}
    assert {v: tests[v]["outcome"] for v in variants} == dict.fromkeys(variants, "pass"), tests
    full = sum(f.stat().st_size for f in (tmp_path / "bucket" / tiny_moe.BASE_IDENTITY).glob("*.safetensors"))
    cut = [u for u in tests["SNAP-SAFETENSORS-1"]["uploads"] if u["kind"] == "given"]
    assert cut and all(u["written"] < 0.1 * full and u["linked"] + u["copied"] > 0.8 * full for u in cut), (full, cut)


def test_runs_that_reset_no_ledger_leave_the_start_served(pytester, tmp_path, serve):
    """Runs of one swap test, no ledger reset among them: the start identity is in the ledger
    once the first run's restore signalled it again, and the ledger takes no identity twice. Each
    later run resets the ledger before it signals the start again, and says so; every run ends
    serving the base, scoring as at the start."""
    command = serve("--bucket", tmp_path / "bucket").named("conformance").removeprefix("rlrollout conformance ")
    said = []
    for run in ("first", "second", "third"):
        result = pytester.runpytest_inprocess(
            str(CONFORMANCE / "test_swap.py"),
            "-p",
            "no:randomly",
            "-k",
            "test_async_stream_survives_the_swap",
            *command.split(),
            *FAST_POLLS,
            f"--rl-report={run}.json",
        )
        assert result.ret == 0, "\n".join(result.outlines[-30:])
        provenance = json.loads((pytester.path / f"{run}.json").read_text())["provenance"]
        assert provenance["served_at_start"] == provenance["served_at_end"] == [tiny_moe.BASE_IDENTITY], provenance
        assert "the weights score as at the start" in provenance["restored"], provenance["restored"]
        said.append(provenance["restored"])
    assert said[0].startswith(f"signalled {tiny_moe.BASE_IDENTITY} again"), said[0]
    assert all(s.startswith(f"the ledger reset first (it listed {tiny_moe.BASE_IDENTITY})") for s in said[1:]), said
