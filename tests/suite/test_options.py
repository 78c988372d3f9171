"""Every misconfiguration ends the run before collection: pytest's usage-error exit code (4) and
one message saying what to fix; no deployment is started and no test is collected."""

import json

import pytest

ACCOUNT = "accounts/a/deployments/d"
UUID = "3f2b8c1e-6d0a-4e6b-9a55-0c1d2e3f4a5b"  # CoreWeave names deployments by UUID


def setup_files(pytester):
    (pytester.path / "no-session").mkdir()
    (pytester.path / "empty-session").mkdir()
    (pytester.path / "empty-session" / "_session.json").write_text("[1, 2]")
    (pytester.path / "signal.json").write_text("{not json")
    (pytester.path / "list.json").write_text("[1, 2]")
    (pytester.path / "base").mkdir()
    (pytester.path / "base" / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))


LIVE = [f"--rl-deployment={ACCOUNT}", "--rl-model=m", "--rl-api-key=k"]
CASES = {
    "missing model": ([f"--rl-deployment={ACCOUNT}", "--rl-api-key=k"], "also pass --rl-model"),
    "missing key": ([f"--rl-deployment={ACCOUNT}", "--rl-model=m"], "pass --rl-api-key or set FIREWORKS_API_KEY"),
    "hot-load without a bucket": (
        [*LIVE, "--rl-allow-hot-load", "--rl-base-snapshot=base"],
        "also pass --rl-bucket-url",
    ),
    "hot-load without a base": (
        [*LIVE, "--rl-allow-hot-load", "--rl-bucket-url=bucket"],
        "also pass --rl-base-snapshot",
    ),
    "not a deployment name": (
        ["--rl-deployment=accounts/a/models/m", "--rl-model=m", "--rl-api-key=k"],
        "is not accounts/<account>/deployments/<deployment>",
    ),
    "unknown replay directory": (["--rl-replay=nowhere"], "--rl-replay nowhere: no such directory"),
    "replay directory without a session": (["--rl-replay=no-session"], "no _session.json"),
    "replay directory with a broken session": (["--rl-replay=empty-session"], "_session.json"),
    "record and replay": (["--rl-record=rec", "--rl-replay=reference"], "exclude each other"),
    "replay and a deployment": (
        ["--rl-replay=reference", f"--rl-deployment={ACCOUNT}"],
        "talks to no deployment; drop --rl-deployment",
    ),
    "replay and a base URL": (["--rl-replay=reference", "--rl-base-url=http://x"], "drop --rl-base-url"),
    "local fault on a live deployment": (
        [*LIVE, "-o", "rl_local_faults=SESS-1"],
        "cannot apply to accounts/a/deployments/d",
    ),
    "unknown local fault": (["-o", "rl_local_faults=HL-NOPE-1"], "unknown fault switch"),
    "vLLM release on another dialect": (
        ["-o", "rl_local_vllm_release=0.33.0"],
        "rl_local_vllm_release is the vLLM dialect's: also pass --rl-engine=vllm",
    ),
    "vLLM release on a live deployment": (
        [*LIVE, "-o", "rl_local_vllm_release=0.33.0"],
        "rl_local_vllm_release configures the bundled reference deployment; it cannot apply to",
    ),
    "vLLM release the reference does not speak": (
        ["--rl-engine=vllm", "-o", "rl_local_vllm_release=0.31.0"],
        "rl_local_vllm_release",
    ),
    "live options without a deployment": (["--rl-model=m"], "also pass --rl-deployment"),
    "snapshot that is not a directory": (["--rl-snapshot=nowhere"], "--rl-snapshot nowhere: not a directory"),
    "signal that is not JSON": (["--rl-snapshot=base", "-o", "rl_signal=signal.json"], "cannot read a JSON body"),
    "signal that is not an object": (
        ["--rl-snapshot=base", "-o", "rl_signal=list.json"],
        "a hot-load signal is a JSON object",
    ),
    "signal that is not a file": (["--rl-snapshot=base", "-o", "rl_signal=base"], "rl_signal: cannot read a JSON body"),
    "negative swap timeout": (["-o", "rl_swap_timeout=-1"], "rl_swap_timeout must be positive"),
    "zero fingerprint tolerance": (["-o", "rl_fingerprint_tolerance=0"], "rl_fingerprint_tolerance must be positive"),
    "NaN logprob tolerance": (["-o", "rl_logprob_tolerance=nan"], "rl_logprob_tolerance must be positive"),
    "no numerics tokens": (["-o", "rl_numerics_tokens=0"], "rl_numerics_tokens must be positive"),
    "route agreement above 1": (["-o", "rl_min_route_agreement=99"], "rl_min_route_agreement is a fraction in [0, 1]"),
    "a timeout that is not a number": (["-o", "rl_test_timeout=soon"], "rl_test_timeout = 'soon' is not a number"),
    "a transition that is neither": (["-o", "rl_transition=LATER"], "rl_transition = 'LATER': one of ASYNC, SYNC"),
    "a switch that is neither true nor false": (["-o", "rl_after_ledger_reset=maybe"], "is not true or false"),
    "CoreWeave without its UUID": (
        ["--rl-engine=coreweave", "--rl-base-url=http://x", "--rl-model=m", "--rl-api-key=k"],
        "--rl-engine=coreweave: also pass --rl-deployment=<the deployment's UUID>",
    ),
    "CoreWeave named like Fireworks": (
        ["--rl-engine=coreweave", f"--rl-deployment={ACCOUNT}", "--rl-base-url=http://x", "--rl-model=m"],
        "is not a CoreWeave deployment's UUID",
    ),
    "CoreWeave without its hot-load key": (
        [f"--rl-deployment={UUID}", "--rl-base-url=http://x", "--rl-model=m", "--rl-api-key=k"],
        f"--rl-deployment {UUID} (CoreWeave): set COREWEAVE_API_KEY",
    ),
    "CoreWeave without its gateway": (
        [f"--rl-deployment={UUID}", "--rl-model=m"],
        "also pass --rl-base-url (the deployment's OpenAI-compatible gateway)",
    ),
    "a control plane for another engine": (
        ["--rl-engine=vllm", "--rl-base-url=http://x", "-o", "rl_control_url=http://y", "--rl-model=m"],
        "rl_control_url is CoreWeave's hot-load API",
    ),
    "a control plane for the bundled deployment": (["-o", "rl_control_url=http://y"], "describe a live deployment"),
}


def test_recording_coreweave_with_two_keys_is_refused(pytester, monkeypatch):
    """A cassette keeps one key out of what it holds: two keys would leave one to chance."""
    monkeypatch.setenv("COREWEAVE_API_KEY", "the-hot-load-key")
    pytester.makepyfile(test_user="def test_x(rl_deployment): pass")
    result = pytester.runpytest_inprocess(
        f"--rl-deployment={UUID}",
        "--rl-base-url=http://x",
        "--rl-model=m",
        "--rl-api-key=the-gateway-key",
        "--rl-record=rec",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert errors == [
        "ERROR: --rl-record: recording a CoreWeave deployment whose gateway and hot-load API have "
        "different keys is not supported"
    ], result.errlines
    assert not any(
        "the-hot-load-key" in line or "the-gateway-key" in line for line in result.outlines + result.errlines
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_misconfiguration_ends_the_run_before_collection(pytester, monkeypatch, case):
    monkeypatch.delenv("FIREWORKS_API_KEY", raising=False)
    monkeypatch.delenv("COREWEAVE_API_KEY", raising=False)
    setup_files(pytester)
    pytester.makepyfile(test_user="def test_x(rl_deployment): pass")
    args, message = CASES[case]
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines + result.errlines
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1 and message in errors[0], result.errlines
    assert not any("collected" in line or "passed" in line for line in result.outlines), result.outlines


@pytest.mark.parametrize("flag", ["--rl-swap-timeout=5", "--rl-no-transformers", "--rl-bogus"])
def test_an_option_the_plugin_does_not_have_is_a_usage_error(pytester, flag):
    """Only the dozen options a person types on each run exist; any other --rl-* option (the
    settings are ini keys: -o KEY=VALUE) ends the run before collection, naming it."""
    pytester.makepyfile(test_user="def test_x(rl_deployment): pass")
    result = pytester.runpytest_inprocess(flag)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any("unrecognized arguments" in line and flag in line for line in result.errlines), result.errlines


def test_ini_keys_set_what_options_did(pytester):
    """The tolerances and waits of a run come from pytest.ini (and `-o` beats the file)."""
    pytester.makeini("[pytest]\nrl_swap_timeout = 7\nrl_logprob_tolerance = 0.5\nrl_transition = sync\n")
    pytester.makepyfile(
        test_user="def test_x(rl_config):\n"
        "    o = rl_config\n"
        "    print(f'SETTINGS {o.timeouts.swap} {o.numerics.logprob_tolerance} {o.transition} {o.timeouts.test}')\n"
    )
    result = pytester.runpytest_inprocess("-o", "rl_test_timeout=9", "-o", "rl_swap_timeout=8", "-s")
    assert "SETTINGS 8.0 0.5 SYNC 9.0" in result.stdout.str()


def test_a_dozen_options_and_every_setting_on_the_suites_page():
    from pathlib import Path

    from pytest_rlrollout.suite.settings import SETTINGS

    options = [s.option for s in SETTINGS if s.option]
    assert len(options) <= 12, options
    page = (Path(__file__).parents[2] / "docs" / "conformance.md").read_text()
    assert [s.key for s in SETTINGS if (s.option or s.key) not in page] == []


def test_a_replay_leaves_the_projects_usual_deployment_alone(pytester):
    """A project's pytest.ini names its deployment; `--rl-replay` replays a recording all the same
    (typing `--rl-deployment` beside it is the contradiction)."""
    pytester.makeini(
        f"[pytest]\nrl_deployment = {ACCOUNT}\nrl_model = m\nrl_inference_url = http://x/v2\nrl_engine = auto\n"
    )
    pytester.makepyfile(test_user="def test_x(rl_config):\n    print('MODE', rl_config.mode)\n")
    result = pytester.runpytest_inprocess("--rl-replay=reference", "-s")
    assert result.ret == 0 and "MODE replay" in result.stdout.str(), result.outlines[-10:] + result.errlines
