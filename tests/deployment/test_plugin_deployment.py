"""The rl_deployment fixture: the local default, a deployment at a plain URL, and hot-load safety."""

from fnmatch import fnmatch

import pytest

USER_TESTS = """
import pytest
from pytest_rlrollout import factory, refmodel
from pytest_rlrollout.plugin import HotLoadNotAllowed


def test_read_only(rl_deployment):
    status = rl_deployment.status().json()
    assert len(status["replicas"]) == 2
    assert rl_deployment.complete({"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}).status == 200


def test_state_change(rl_deployment, tmp_path):
    bucket = rl_deployment.bucket or tmp_path
    if rl_deployment.bucket is not None:
        base = rl_deployment.base_snapshot
        factory.derive(base, bucket / "step-x", factory.perturbed(base, seed=5))
    try:
        r = rl_deployment.hot_load({"identity": "step-x"})
    except HotLoadNotAllowed as e:
        pytest.skip(f"not allowed: {e}")
    assert r.status_code == 200, r.text
    assert rl_deployment.wait("step-x", timeout=20, poll=0.01).ok
"""


def test_local_default(pytester):
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_plain_url_is_read_only_without_the_flag(pytester, dep, bucket):
    from pytest_rlrollout import factory

    factory.derive(
        bucket / "tiny-qwen3-moe-base", bucket / "step-x", factory.perturbed(bucket / "tiny-qwen3-moe-base", seed=5)
    )
    pytester.makepyfile(test_user=USER_TESTS)
    args = [
        f"--rl-deployment={dep.name}",
        f"--rl-base-url={dep.base_url}",
        f"--rl-model={dep.model}",
        f"--rl-api-key={dep.api_key}",
        "-rs",
    ]
    guarded = pytester.runpytest_subprocess(*args)
    guarded.assert_outcomes(passed=1, skipped=1)
    guarded.stdout.fnmatch_lines(["*not allowed*--rl-allow-hot-load*"])
    assert dep.deployment.ledger == []  # no signal reached the deployment
    allowed = pytester.runpytest_subprocess(*args, "--rl-allow-hot-load")
    allowed.assert_outcomes(passed=2)
    assert [e["identity"] for e in dep.deployment.ledger] == ["step-x"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rl-deployment=accounts/a/deployments/d"], "*also pass --rl-model*"),
        (
            ["--rl-deployment=accounts/a/models/m", "--rl-model=m", "--rl-api-key=k"],
            "*accounts/<account>/deployments/<deployment>*",
        ),
    ],
)
def test_usage_errors(pytester, args, message, monkeypatch):
    monkeypatch.delenv("FIREWORKS_API_KEY", raising=False)
    pytester.makepyfile(test_user="def test_x(rl_deployment): pass")
    result = pytester.runpytest_subprocess(*args)
    assert result.ret != 0
    result.stdout.no_fnmatch_line("*1 passed*")
    assert any(fnmatch(line, message) for line in result.stdout.lines + result.stderr.lines)


def test_rl_session_clients_carry_the_session(pytester):
    pytester.makepyfile(
        test_session="""
def test_openai_and_httpx(rl_session):
    client = rl_session.openai()
    chat = client.chat.completions.create(model=rl_session.deployment.target.deployment, max_tokens=2,
                                          messages=[{"role": "user", "content": "hi"}], temperature=0)
    assert "@" in chat.model
    first = rl_session.complete({"prompt": list(range(10, 90)), "max_tokens": 1, "temperature": 0})
    second = rl_session.complete({"prompt": list(range(10, 90)), "max_tokens": 1, "temperature": 0})
    assert first.cached_tokens()["usage"] == 0 and second.cached_tokens()["usage"] > 0  # same session, same cache
    with rl_session.http() as http:
        r = http.post("/v1/completions", json={"model": rl_session.deployment.target.deployment,
                                               "prompt": [1, 2, 3], "max_tokens": 1})
        assert r.status_code == 200
"""
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
