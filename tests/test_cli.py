import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from pytest_rlrollout.cli import EXIT_BROKEN_PIPE, main, parser
from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.reference.faults import FAULTS
from pytest_rlrollout.snapshot import broken, build
from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot.layout import INDEX, SPEC

from .support import tree_hash

# Subprocesses run from the checkout, so `-m pytest_rlrollout.cli` is the code under test
# whatever an installed copy points at.
ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "pytest_rlrollout.cli"]


def run(*args):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


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
    from pytest_rlrollout.cli.snapshot_tools import _size

    assert _size(text) == value


def test_clauses_lists_the_catalogue(capsys):
    assert main(["clauses", "--area", "snap"]) == 0
    out = capsys.readouterr().out
    assert "SNAP-INDEX-2" in out and "HL-POST-1" not in out


# --------------------------------------------------------------------------- conformance --help


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_conformance_help_lists_every_rl_option_of_the_plugin(flag, capsys, monkeypatch):
    from _pytest.config.argparsing import Parser

    from pytest_rlrollout.suite.settings import SETTINGS, add_options

    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: help texts compare unwrapped
    assert main(["conformance", flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: rlrollout conformance")
    # what pytest itself registers from the plugin's table
    pytest_parser = Parser(_ispytest=True)
    add_options(pytest_parser)
    options = [o for o in pytest_parser.getgroup("rlrollout").options if o.attrs()["help"] != argparse.SUPPRESS]
    assert 10 <= len(options) <= 12 and len(re.findall(r"^  (--rl-[a-z-]+)", out, re.MULTILINE)) == len(options)
    for option in options:
        for name in option.names():
            assert re.search(rf"(^|[ ,]){re.escape(name)}\b", out, re.MULTILINE), name
        assert " ".join(option.attrs()["help"].split()) in out, option.names()
    for setting in (s for s in SETTINGS if s.ini):  # and every ini key, with its help
        assert re.search(rf"^  {setting.key} +{re.escape(setting.help)}$", out, re.MULTILINE), setting.key


def test_conformance_passes_every_other_argument_to_pytest(monkeypatch):
    import pytest as pytest_module

    seen = []
    monkeypatch.setattr(pytest_module, "main", lambda args: seen.append(args) or 0)
    assert main(["conformance", "swap", "-n", "2", "-o", "rl_level=must", "--help"]) == 0
    [args] = seen
    assert args[0].endswith("test_swap.py") and args[-5:] == ["-n", "2", "-o", "rl_level=must", "--help"]


# --------------------------------------------------------------------------- soak


def test_soak_turns_its_options_into_the_suites_settings_and_passes_the_rest_to_pytest(monkeypatch):
    import pytest as pytest_module

    seen = []
    monkeypatch.setattr(pytest_module, "main", lambda args: seen.append(args) or 0)
    assert (
        main(["soak", "--seconds", "30", "--workers", "2", "--resets", "all", "none", "--rl-report=r.json", "-x"]) == 0
    )
    [args] = seen
    assert args[0].endswith("test_soak.py") and args[-2:] == ["--rl-report=r.json", "-x"]
    settings = [args[i + 1] for i, a in enumerate(args) if a == "-o"]
    assert settings == ["rl_soak=true", "rl_soak_seconds=30.0", "rl_soak_workers=2", "rl_soak_resets=all none"]


def test_soak_without_locust_says_how_to_get_it(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "locust" else real(name, *a))
    assert main(["soak", "--seconds", "5"]) == 2
    assert "pip install 'pytest-rlrollout[soak]'" in capsys.readouterr().err


def test_soak_help_names_its_options(capsys):
    assert main(["soak", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: rlrollout soak") and all(
        o in out for o in ("--seconds", "--remote-workers", "--resets")
    )


# --------------------------------------------------------------------------- serve --fault


def test_serve_fault_takes_several_switches_and_repeats():
    args = parser().parse_args(["serve", "--fault", "A", "B", "--fault", "C"])
    assert args.fault == ["A", "B", "C"]
    assert parser().parse_args(["serve"]).fault == []


class _Started(Exception):
    """Raised by the stand-in deployment: serving would have begun."""


@pytest.fixture
def fake_deployment(monkeypatch):
    """serve's deployment replaced by one that records its arguments and stops at once."""
    import tempfile

    import pytest_rlrollout.reference as reference

    seen: dict = {}
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        seen.setdefault("buckets", []).append(Path(real_mkdtemp(*args, **kwargs)))
        return str(seen["buckets"][-1])

    def deployment(bucket, **options):
        seen.update(bucket=Path(bucket), exists=Path(bucket).is_dir(), **options)
        raise _Started

    monkeypatch.setattr(reference, "reference_deployment", deployment)
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    return seen


def test_serve_checks_fault_switches_before_starting_anything(fake_deployment, capsys):
    known = list(FAULTS)[:3]
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    with pytest.raises(_Started):
        main(["serve", "--fault", known[0], known[1], "--fault", known[2]])
    assert fake_deployment["faults"] == frozenset(known)
    assert fake_deployment["exists"] and not fake_deployment["bucket"].exists()  # its own bucket: gone
    assert {s: signal.getsignal(s) for s in before} == before  # an in-process caller keeps its handlers
    fake_deployment.clear()

    assert main(["serve", "--fault", known[0], "NO-SUCH-1", "--fault", "nonsense:x"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "NO-SUCH-1" in err and "nonsense:x" in err and known[0] not in err
    assert "rlrollout serve --list-faults" in err
    assert fake_deployment == {}  # no bucket made, no deployment started


def test_serve_list_faults_names_every_switch(capsys):
    from pytest_rlrollout.reference import faults

    assert main(["serve", "--list-faults"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [*faults.FAULTS, *getattr(faults, "BEHAVIOURS", {})]


# --------------------------------------------------------------------------- serve's bucket


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_serve_removes_the_temporary_bucket_it_made(serve, signum):
    child = serve()
    assert child.bucket.is_dir()
    child.proc.send_signal(signum)
    assert child.proc.wait(timeout=30) == 0
    assert not child.bucket.exists()
    assert "Traceback" not in child.proc.stderr.read()


def test_serve_never_removes_a_bucket_it_was_given(serve, tmp_path):
    given = tmp_path / "bucket"
    given.mkdir()
    (given / "mine.txt").write_text("the user's")
    child = serve("--bucket", given)
    assert child.bucket == given
    child.proc.send_signal(signal.SIGTERM)
    assert child.proc.wait(timeout=30) == 0
    assert (given / "mine.txt").read_text() == "the user's"


def test_serve_engine_vllm_passes_the_dialect_and_its_defaults(fake_deployment):
    with pytest.raises(_Started):
        main(["serve", "--engine", "vllm"])
    assert fake_deployment["engine"] == "vllm" and fake_deployment["transition"] == "ASYNC"
    assert "api_key" not in fake_deployment and "replicas" not in fake_deployment  # the dialect's: no key, one engine
    fake_deployment.clear()
    with pytest.raises(_Started):
        main(["serve"])
    assert fake_deployment["engine"] == "fireworks" and fake_deployment["api_key"] == "rl-reference-key"
    fake_deployment.clear()
    with pytest.raises(_Started):
        main(["serve", "--engine", "vllm", "--api-key", "k", "--replicas", "2"])
    assert fake_deployment["api_key"] == "k" and fake_deployment["replicas"] == 2


def test_serve_engine_vllm_returns_routed_experts_on_its_flag(fake_deployment, capsys):
    with pytest.raises(_Started):
        main(["serve", "--engine", "vllm", "--enable-return-routed-experts"])
    assert fake_deployment["routed_experts"] is True
    fake_deployment.clear()
    with pytest.raises(_Started):
        main(["serve", "--engine", "vllm"])
    assert fake_deployment["routed_experts"] is False  # off, as on vLLM's CPU build
    fake_deployment.clear()
    assert main(["serve", "--enable-return-routed-experts"]) == 2  # vLLM's flag, not the Fireworks dialect's
    assert "--engine vllm" in capsys.readouterr().err and fake_deployment == {}


def test_serve_engine_vllm_refuses_a_sync_transition(fake_deployment, capsys):
    assert main(["serve", "--engine", "vllm", "--transition", "sync"]) == 2
    assert "--transition" in capsys.readouterr().err and fake_deployment == {}


def test_serve_engine_vllm_prints_its_url_and_the_suite_command_for_itself(serve):
    child = serve("--engine", "vllm")
    url, bucket = child.url, child.bucket
    [command] = [x for x in child.printed if x.startswith("conformance:")]
    assert command == (
        f"conformance: rlrollout conformance --rl-base-url={url} --rl-model=tiny --rl-engine=vllm "
        f"--rl-allow-hot-load --rl-bucket-url={bucket} "
        f"--rl-base-snapshot={bucket / 'tiny-qwen3-moe-base'} -o rl_swap_seconds=1.03 "
        "-o rl_served_dtype=float32"
    )
    assert httpx.get(url + "/version", timeout=30).json() == {"version": "0.32.0"}
    assert httpx.get(url + "/weight_info", timeout=30).json() == {"weight_version": "default"}
    child.proc.send_signal(signal.SIGTERM)
    assert child.proc.wait(timeout=30) == 0
    assert not bucket.exists()


def test_serve_prints_waits_that_follow_its_pace(serve):
    """A one-minute load: the printed command states the swap time (for the plan's estimate) and a
    swap timeout of three swaps, not the 10 s that fits the default pace."""
    child = serve("--load-delay", "60", "--stagger", "2")  # 2 replicas: the last loads 62 s, then 1 s at the swap
    [command] = [x for x in child.printed if x.startswith("conformance:")]
    assert " -o rl_swap_seconds=63 -o rl_swap_timeout=189 " in command
    child.proc.send_signal(signal.SIGTERM)
    assert child.proc.wait(timeout=30) == 0


# --------------------------------------------------------------------------- clauses, pipes


def test_clauses_unknown_area_is_a_usage_error(capsys):
    assert main(["clauses", "--area", "NOPE"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "--area NOPE" in err and all(area in err for area in catalogue().areas)


@pytest.mark.skipif(not hasattr(__import__("fcntl"), "F_SETPIPE_SZ"), reason="pipe sizes are Linux's")
def test_output_into_a_reader_that_stops_after_one_line_ends_quietly(capsys):
    import fcntl

    pipe_size = 4096
    assert main(["clauses"]) == 0
    # the writer must still have output pending when the reader leaves, or nothing is tested
    assert len(capsys.readouterr().out.encode()) > 3 * pipe_size
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, pipe_size)
    proc = subprocess.Popen([*CLI, "clauses"], stdout=w, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(w)
    with os.fdopen(r, "rb") as reader:  # `| head -1`
        assert reader.readline().startswith(b"SNAP-")
    _, err = proc.communicate(timeout=60)
    assert err == b""
    assert proc.returncode == EXIT_BROKEN_PIPE


# --------------------------------------------------------------------------- validate's output


def _validate(capsys, *args) -> tuple[int, str]:
    code = main(["validate", *map(str, args)])
    return code, capsys.readouterr().out


def _mixed_shards(base: Path, dst: Path, shards: int = 8) -> Path:
    """The base re-sharded regardless of layers, as a size-based split does: the layer tensors
    dealt round-robin, so each of the shards mixes layers; non-layer tensors get their own."""
    dst.mkdir()
    entries = sorted(build.checkpoint_entries(base), key=lambda e: e.name)
    layered = [e for e in entries if ".layers." in e.name]
    parts = [[e for e in entries if e not in layered], *(layered[i::shards] for i in range(shards))]
    weight_map = {}
    for i, part in enumerate(parts, 1):
        name = f"model-{i:05d}-of-{len(parts):05d}.safetensors"
        st.write_file(dst / name, part, {"format": "pt"})
        weight_map.update({e.name: name for e in part})
    (dst / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    build.carry_files(base, dst)
    shutil.copyfile(base / SPEC, dst / SPEC)
    return dst


def _counted(text: str) -> int:
    """How many findings the text accounts for: 1 per plain line, N per folded one."""
    lines = [line for line in text.splitlines() if re.match(r"  [A-Z0-9]+(-[A-Za-z0-9]+)+ \[", line)]
    return sum(int(m.group(1)) if (m := re.search(r"\] (\d+) findings: ", line)) else 1 for line in lines)


def test_validate_folds_findings_of_one_cause_and_suggests_export(reference, tmp_path, capsys):
    snap = _mixed_shards(reference.base, tmp_path / "checkpoint")
    code, text = _validate(capsys, snap, "--base", reference.base)
    assert code == 1
    [line] = [line for line in text.splitlines() if "SNAP-INDEX-2" in line]
    assert re.search(r"SNAP-INDEX-2 \[MUST\] 8 findings: <file>: mixes layers <n>; ", line)
    examples = line.split("; e.g. ")[1].split(", ")
    assert examples == [f"model-0000{i}-of-00009.safetensors" for i in (2, 3, 4)]
    assert "(--format json lists every finding)" in text
    assert (
        f"hint: shards mix layers (as save_pretrained's size-based split does): `rlrollout export {snap} DST`" in text
    )

    code, out = _validate(capsys, snap, "--base", reference.base, "--format", "json")
    doc = json.loads(out)
    assert code == 1 and len([f for f in doc["findings"] if f["clause"] == "SNAP-INDEX-2"]) == 8  # JSON: every one
    assert _counted(text) == len(doc["findings"])
    assert doc["hints"] and "rlrollout export" in doc["hints"][0]

    # the hint is right: export re-lays the checkpoint one layer per shard
    assert main(["export", str(snap), str(tmp_path / "relaid")]) == 0
    assert _validate(capsys, tmp_path / "relaid", "--base", reference.base)[0] == 0

    one = broken.broken_case("SNAP-INDEX-2", reference, tmp_path / "one")
    code, text = _validate(capsys, one.snapshot, "--base", reference.base)
    assert "mixes layers 1, 2" in text and "rlrollout export" in text  # one finding: printed as it is


def test_validate_of_a_diff_without_its_parent_suggests_parent(reference, tmp_path, capsys):
    inc = reference["incremental"]
    code, text = _validate(capsys, inc.snapshot, "--base", inc.base)
    assert code == 1
    assert "hint: " in text and "holds ARC2 diff payloads" in text and "pass --parent PARENT" in text
    assert "rlrollout export" not in text
    findings = [line for line in text.splitlines() if line.startswith("  SNAP-")]
    assert len(findings) < 10  # hundreds of per-tensor findings, folded by cause
    assert all(len(line.split("; e.g. ")[1].split(", ")) == 3 for line in findings if " findings: " in line)
    doc = json.loads(_validate(capsys, inc.snapshot, "--base", inc.base, "--format", "json")[1])
    assert len(doc["findings"]) > 100 and _counted(text) == len(doc["findings"])
    assert "--parent" in doc["hints"][0]

    # a signal with incremental metadata makes it a diff already; the parent is still missing
    signal_file = tmp_path / "signal.json"
    signal_file.write_text(json.dumps(inc.signal))
    text = _validate(capsys, inc.snapshot, "--base", inc.base, "--signal", signal_file)[1]
    assert "incremental snapshot" in text and "pass --parent PARENT" in text

    # with the parent: a valid diff, nothing to suggest
    code, text = _validate(capsys, inc.snapshot, "--base", inc.base, "--parent", inc.parent)
    assert code == 0 and "hint" not in text
    code, text = _validate(capsys, reference["full"].snapshot, "--base", reference.base)
    assert code == 0 and "hint" not in text


@pytest.mark.parametrize(("clause", "must", "should"), [("SNAP-TOK-1a", True, False), ("SNAP-INDEX-3", False, False)])
def test_validate_exit_code_and_json_valid_agree_at_both_levels(clause, must, should, reference, tmp_path, capsys):
    case = broken.broken_case(clause, reference, tmp_path)
    for level, valid in (("must", must), ("should", should)):
        code, out = _validate(capsys, case.snapshot, "--base", reference.base, "--level", level, "--format", "json")
        doc = json.loads(out)
        assert doc["valid"] is valid and doc["level"] == level.upper()
        assert code == (0 if valid else 1)
        code_text, text = _validate(capsys, case.snapshot, "--base", reference.base, "--level", level)
        assert code_text == code
        verdict = text.splitlines()[-1]
        assert verdict.startswith("valid") == valid, verdict  # the text says what the exit code says


def test_validate_help_states_the_validators_own_bounds():
    """`rlrollout validate --help` writes the bounds out (so --help imports none of the validator):
    they must be the constants the validator uses."""
    from pytest_rlrollout.cli.validate import DESCRIPTION as VALIDATE_DESCRIPTION
    from pytest_rlrollout.snapshot import untrusted
    from pytest_rlrollout.snapshot.validate import core

    text = " ".join(VALIDATE_DESCRIPTION.split())
    for stated in (
        f"JSON files of at most {untrusted.MAX_JSON_BYTES >> 20} MiB (the signal {core.MAX_SIGNAL_BYTES >> 20} MiB)",
        f"nested at most {untrusted.MAX_DEPTH} deep, with at most {untrusted.MAX_JSON_ITEMS} items",
        f"headers of at most {st.MAX_HEADER_BYTES >> 20} MiB and {st.MAX_TENSORS} tensors",
        f"names of at most {st.MAX_TENSOR_NAME} characters, rank at most {st.MAX_RANK}",
        f"at most {core.MAX_FILES} safetensors files and {core.MAX_TENSORS} tensors per snapshot",
        f"at most {core.MAX_FINDINGS} findings per clause",
        "3 internal error",
    ):
        assert stated in text


# --------------------------------------------------------------------------- serve --fleet


def test_serve_fleet_starts_engines_behind_the_gateway_and_stops_them_all(serve):
    """`serve --fleet 2`: two engines on one bucket behind a real smg, the suite's command for the
    gateway; on SIGTERM the gateway (its router included) and the engines stop."""
    child = serve("--engine", "vllm", "--fleet", "2")
    gateway, engines = child.url, child.named("engines").split(", ")
    [command] = [x for x in child.printed if x.startswith("conformance:")]
    assert f"--rl-base-url={gateway} " in command and "--rl-engine=smg " in command
    workers = httpx.get(gateway + "/v1/rl/workers", timeout=30).json()["workers"]
    assert sorted(w["url"] for w in workers) == sorted(engines)
    assert {w["health"] for w in workers} == {"ready"} and {w["engine"] for w in workers} == {"vllm"}
    assert child.printed[-1].startswith("serving tiny-qwen3-moe-base on 2 engines behind smg")
    child.proc.send_signal(signal.SIGTERM)
    assert child.proc.wait(timeout=60) == 0
    for url in (gateway, *engines):
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/v1/models", timeout=5)


@pytest.mark.parametrize(("engine", "fleet"), [("vllm", "fleet"), ("sglang", "sglang-fleet")])
def test_serve_fleet_with_no_gateway_prints_the_suites_command_for_its_engines(serve, engine, fleet):
    """`--no-gateway`: the engines alone, and the suite's command naming them all (rl_fleet_urls)
    and the fleet engine that drives engines of that dialect."""
    child = serve("--engine", engine, "--fleet", "2", "--no-gateway")
    engines = child.named("engines").split(", ")
    [command] = [x for x in child.printed if x.startswith("conformance:")]
    assert f"--rl-base-url={engines[0]} " in command and f"--rl-engine={fleet} " in command
    assert f"-o 'rl_fleet_urls={' '.join(engines)}'" in command
    assert not any(x.startswith("gateway:") for x in child.printed)
    assert child.printed[-1].startswith("serving tiny-qwen3-moe-base on 2 engines with no gateway")
    child.proc.send_signal(signal.SIGTERM)
    assert child.proc.wait(timeout=60) == 0


def test_serve_fleet_is_of_self_hosted_engines_and_a_fault_hits_an_engine_of_it(fake_deployment, capsys):
    assert main(["serve", "--fleet", "2"]) == 2  # the Fireworks dialect is a hosted deployment
    assert "--fleet N" in capsys.readouterr().err
    assert main(["serve", "--engine", "vllm", "--fleet", "2", "--faulty-engine", "2", "--fault", "HL-GET-2"]) == 2
    assert "--faulty-engine 2" in capsys.readouterr().err
    assert main(["serve", "--engine", "vllm", "--faulty-engine", "0", "--fault", "HL-GET-2"]) == 2  # no fleet
    assert main(["serve", "--engine", "vllm", "--no-gateway"]) == 2
    assert "--no-gateway" in capsys.readouterr().err
    assert main(["serve", "--engine", "sglang", "--fleet", "2"]) == 2  # smg's binding drives vLLM engines
    assert "the suite's smg binding drives vllm engines, not sglang; add --no-gateway" in capsys.readouterr().err
    assert fake_deployment == {}


def test_serve_vllm_release_is_the_vllm_dialects_and_reaches_its_settings(fake_deployment, capsys):
    """`--vllm-release 0.33.0`: the vLLM dialect speaks that release; any other engine refuses it."""
    with pytest.raises(_Started):
        main(["serve", "--engine", "vllm", "--vllm-release", "0.33.0"])
    assert fake_deployment["vllm_release"] == "0.33.0"
    assert main(["serve", "--engine", "sglang", "--vllm-release", "0.33.0"]) == 2
    assert "--vllm-release is the vLLM dialect's (--engine vllm)" in capsys.readouterr().err
