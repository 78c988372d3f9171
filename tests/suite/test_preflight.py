"""The preflight: a run whose options cannot reach the deployment they name ends before any
test, with pytest's usage-error exit code (4) and one message saying what to fix, in seconds.
Against the reference deployment, a real HTTP server in this process."""

import re
import socket
import time

import pytest

from pytest_rlrollout.suite.options import CONFORMANCE
from pytest_rlrollout.suite.settings import SETTING


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def options(dep, **changes) -> list[str]:
    given = {"deployment": dep.name, "base-url": dep.base_url, "model": dep.model, "api-key": dep.api_key} | changes
    # the deployment's further description is ini keys (-o), what a person types per run options
    return [
        f"--rl-{k}={v}" if SETTING[f"rl_{k.replace('-', '_')}"].option else f"-orl_{k.replace('-', '_')}={v}"
        for k, v in given.items()
    ]


CASES = {
    "wrong key": ({"api-key": "not-the-key"}, "the API key was refused"),
    "typo'd deployment": ({"deployment": "accounts/rlrollout/deployments/refrence"}, "check --rl-deployment"),
    "closed port": ({"base-url": "http://127.0.0.1:{port}"}, "nothing answers at http://127.0.0.1:"),
    "wrong inference path": ({"inference-url": "{base}/v2"}, "check rl_inference_url"),
    "model it does not serve": ({"model": "accounts/rlrollout/models/other"}, "check --rl-model"),
    "bad replay directory": (None, "--rl-replay nowhere: no such directory"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_misconfigured_run_ends_before_any_test(pytester, dep, case):
    changes, message = CASES[case]
    if changes is None:
        args = ["--rl-replay=nowhere"]
    else:
        fill = {"port": closed_port(), "base": dep.base_url}
        args = options(dep, **{k: v.format(**fill) for k, v in changes.items()})
    started = time.monotonic()
    result = pytester.runpytest_inprocess(str(CONFORMANCE), *args)
    took = time.monotonic() - started
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines[-20:] + result.errlines
    errors = [line for line in result.errlines if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("ERROR: ") and message in errors[0], result.errlines
    assert not any("collected" in line or "passed" in line for line in result.outlines), result.outlines
    assert took < 5, f"{case}: {took:.1f} s"
    # the deployment was only read: no signal, no completion beyond the one-token probe
    assert all(method == "GET" or "/completions" in path for method, path, _ in dep.deployment.requests)


def test_preflight_prints_the_engine_and_capabilities(pytester, dep):
    result = pytester.runpytest_inprocess(str(CONFORMANCE / "test_session.py"), *options(dep), "-p", "no:randomly")
    assert result.ret == 0, result.outlines[-20:]
    result.stdout.fnmatch_lines(
        [
            f"rlrollout: live deployment {dep.name}",
            "rlrollout: engine fireworks (auto: a Fireworks API answers (the hot-load status or /v1/accounts)); capabilities:",
            "  hot_load_api*yes*replica(s) in the status",
            "  backend_host*yes*fireworks-backend-host: *",
        ]
    )


# dialect -> (how the run names it, the probe that must decide, as `decided` says it)
AUTO = {
    "fireworks": ("by name", "auto: a Fireworks API answers (the hot-load status or /v1/accounts)"),
    "vllm": ("by URL", "auto: GET /version answers vLLM 0.32.0"),
    "sglang": ("by URL", "auto: GET /model_info answers SGLang's weight_version 'default'"),
    "coreweave": ("by UUID", "auto: GET {base}/v1alpha1/inference/hotLoads answers CoreWeave's hot-load list"),
    "coreweave-one-host": ("by URL", "auto: GET /v1alpha1/inference/hotLoads answers CoreWeave's hot-load list"),
}


@pytest.mark.parametrize("dialect", sorted(AUTO))
def test_auto_recognises_each_dialect_and_names_the_probe(tmp_path, dialect):
    """--rl-engine=auto decides from what answers, asks nothing that changes state, and says
    which probe decided; a CoreWeave deployment named by its UUID is asked on the control plane
    it names (with that plane's key), one known by its URL alone where the URL answers both."""
    from pytest_rlrollout.reference import reference_deployment
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.discovery import PreflightError
    from pytest_rlrollout.remote.preflight import preflight
    from pytest_rlrollout.remote.target import Target

    engine = dialect.removesuffix("-one-host")
    naming, decided = AUTO[dialect]
    settings = {"control_api_key": "the-hot-load-key"} if dialect == "coreweave" else {}
    with reference_deployment(tmp_path, engine=engine, api_key="k", **settings) as dep:
        target = {
            "by name": Target(dep.name, dep.base_url, dep.model, "k"),
            "by URL": Target(None, dep.base_url, dep.model, "k", engine="openai"),
            "by UUID": Target(
                dep.settings.deployment_id,
                dep.base_url,
                dep.model,
                "k",
                engine="coreweave",
                control_url=dep.base_url,
                control_key="the-hot-load-key",
            ),
        }[naming]
        with DeploymentClient(target) as client:
            if dialect == "coreweave-one-host":  # recognised; judged once named by its UUID
                with pytest.raises(PreflightError, match=re.escape(f"({decided}): pass --rl-deployment=<the")):
                    preflight(client, None)
            else:
                assert preflight(client, None) == (engine, decided.format(base=dep.base_url))
                assert client.target.engine == engine
        assert all(method == "GET" or "/completions" in path for method, path, _ in dep.deployment.requests)
