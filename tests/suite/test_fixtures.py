"""The rl_deployment fixture: the local default, a deployment at a plain URL, and hot-load safety."""

import json

from pytest_rlrollout.snapshot import tiny_moe

USER_TESTS = """
import pytest
from pytest_rlrollout.snapshot import build, tiny_moe
from pytest_rlrollout.suite.deployment import HotLoadNotAllowed


def test_read_only(rl_deployment):
    status = rl_deployment.status()
    assert len(status.replicas) == 2 and not status.problems
    assert status.response.json()["replicas"] == status.replicas
    assert rl_deployment.complete({"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}).status == 200


def test_state_change(rl_deployment):
    if rl_deployment.bucket is not None:  # the local reference deployment: put the snapshot in its bucket
        base = rl_deployment.base_snapshot
        build.derive(base, rl_deployment.bucket.local_path / "step-x", build.perturbed(base, seed=5))
    try:
        r = rl_deployment.hot_load({"identity": "step-x"})
    except HotLoadNotAllowed as e:
        pytest.skip(f"not allowed: {e}")
    assert r.status_code == 200, r.text
    assert rl_deployment.wait_for("step-x").ok
    assert rl_deployment.serving() == "step-x" and rl_deployment.served_identities() == ["step-x", "step-x"]
"""


def test_local_default(pytester):
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_plain_url_is_read_only_without_the_flag(pytester, dep, bucket):
    pytester.makepyfile(test_user=USER_TESTS)
    args = [
        f"--rl-deployment={dep.name}",
        f"--rl-base-url={dep.base_url}",
        f"--rl-model={dep.model}",
        f"--rl-api-key={dep.api_key}",
        "-rs",
    ]
    guarded = pytester.runpytest_inprocess(*args)
    guarded.assert_outcomes(passed=1, skipped=1)
    guarded.stdout.fnmatch_lines(["*not allowed*--rl-allow-hot-load*"])
    assert dep.deployment.ledger == []  # no signal reached the deployment
    allowed = pytester.runpytest_inprocess(
        *args,
        "--rl-allow-hot-load",
        f"--rl-bucket-url={bucket}",
        f"--rl-base-snapshot={bucket / tiny_moe.BASE_IDENTITY}",
    )
    allowed.assert_outcomes(passed=2)
    # newest first: the test's load of step-x, then the run's end serving its start again
    assert [e["identity"] for e in dep.deployment.ledger] == [tiny_moe.BASE_IDENTITY, "step-x"]
    assert dep.deployment.replicas[0].identity == tiny_moe.BASE_IDENTITY


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
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_the_fixture_api_is_explicit_and_typed():
    """No attribute forwarding: what the docs (docs/your-own-tests.md) document is what the class defines."""
    import inspect

    from pytest_rlrollout.remote.target import Target
    from pytest_rlrollout.suite.deployment import RLDeployment

    assert "__getattr__" not in vars(RLDeployment)
    for name in (
        "status",
        "replicas",
        "served_identities",
        "serving",
        "ledger",
        "complete",
        "post_inference",
        "wait_for",
        "settle",
        "hot_load",
        "hint",
        "reset_ledger",
        "mark",
    ):
        assert inspect.signature(getattr(RLDeployment, name)).return_annotation != inspect.Signature.empty, name
    target = Target("accounts/a/deployments/d", "http://x", "m", "sk-secret-123")
    assert "sk-secret-123" not in repr(target) and "sk-secret-123" not in str(target.api_key)


def test_rl_swap_implies_the_rl_swaps_marker(pytester, dep):
    """A test that requests `rl_swap` changes the deployment: read-only, it is inconclusive saying
    so, with no marker written by hand; a test that does not keeps running."""
    pytester.makepyfile(
        test_user="""
def test_swapping(rl_swap, request):
    assert request.node.get_closest_marker("rl_swaps") is not None
    raise AssertionError("a read-only run must not get here")


def test_reading(rl_deployment, request):
    assert request.node.get_closest_marker("rl_swaps") is None
"""
    )
    result = pytester.runpytest_inprocess(
        f"--rl-deployment={dep.name}",
        f"--rl-base-url={dep.base_url}",
        f"--rl-model={dep.model}",
        f"--rl-api-key={dep.api_key}",
        "-rs",
    )
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*inconclusive: read-only: pass --rl-allow-hot-load*"])
    local = pytester.runpytest_inprocess("-k", "swapping")
    local.assert_outcomes(failed=1)  # locally it runs (and reaches the assertion after the marker check)
    local.stdout.fnmatch_lines(["*a read-only run must not get here*"])


def test_public_names_at_the_package_top():
    """What a test of one's own needs is importable from the package itself, each name the one
    the module that defines it holds, and every fixture the plugin defines is on the docs page of
    fixtures (docs/your-own-tests.md)."""
    import re
    from pathlib import Path

    import pytest_rlrollout
    from pytest_rlrollout.suite import outcomes
    from pytest_rlrollout.suite.deployment import RLDeployment

    assert pytest_rlrollout.RLDeployment is RLDeployment
    assert pytest_rlrollout.inconclusive is outcomes.inconclusive
    assert {"not_applicable", "unsupported", "inconclusive", "Driver", "WaitEnd", "validate"} <= set(
        pytest_rlrollout.__all__
    )
    package = Path(pytest_rlrollout.__file__).parent / "suite"
    fixtures = set(re.findall(r"^def (rl_\w+)\(", "".join(p.read_text() for p in package.glob("*.py")), re.M))
    page = (Path(pytest_rlrollout.__file__).parents[1] / "docs" / "your-own-tests.md").read_text()
    assert fixtures and {f for f in fixtures if f"`{f}`" not in page} == set()


BREAKING = """
import os, signal
import pytest


@pytest.mark.rl_clause("HL-POST-5")
@pytest.mark.rl_swaps
{mark}
def test_the_deployment_dies(rl_deployment, rl_snapshot_factory):
    rl_snapshot_factory.full("uploaded")  # in the bucket, as a load would have it
    os.kill({pid}, signal.SIGKILL)  # what a refused load did to vLLM: its API server exited
    assert not rl_deployment.complete({{"prompt": [1, 2], "max_tokens": 1}}).ok


@pytest.mark.rl_clause("SNAP-COVER-1")
@pytest.mark.rl_swaps
@pytest.mark.rl_breaks
def test_after_it(rl_deployment):
    assert not rl_deployment.complete({{"prompt": [3, 4], "max_tokens": 1}}).ok  # what that test left
"""


def test_a_test_that_breaks_the_deployment_keeps_its_verdict_when_nothing_answers_after_it(pytester, serve):
    """After an exclusive test the suite settles the deployment; one that nothing answers any
    more (killed) makes that an error, unless the test was marked rl_breaks (it may leave the
    deployment unable to serve): then its own outcome stands, and no teardown error hides it.
    A later test that may break it finds it not serving and is inconclusive (what it would see
    is the earlier test's doing). At the run's end nothing is served, and what the run uploaded
    is kept (a deployment that does not answer may still serve it), named in the report."""
    for mark, outcomes in (
        ("@pytest.mark.rl_breaks", {"failed": 1, "skipped": 1}),
        ("", {"failed": 1, "errors": 1, "skipped": 1}),
    ):
        served = serve()
        pytester.makepyfile(test_breaking=BREAKING.format(mark=mark, pid=served.pid))
        command = served.named("conformance").removeprefix("rlrollout conformance ").split()
        result = pytester.runpytest_inprocess(
            "-p", "no:cacheprovider", "-p", "no:randomly", *command, "-o", "rl_exchange_timeout=5", "--rl-report=r.json"
        )
        result.assert_outcomes(**outcomes)
        doc = json.loads((pytester.path / "r.json").read_text())
        assert doc["clauses"]["HL-POST-5"]["outcome"] == ("fail" if mark else "error")
        after = doc["clauses"]["SNAP-COVER-1"]
        assert (
            after["outcome"] == "inconclusive"
            and "did not serve a one-token completion before this test" in after["tests"][0]["reason"]
        ), after
        provenance = doc["provenance"]
        assert provenance["served_at_end"] == [], provenance
        [kept] = provenance["uploaded_and_kept"]
        assert kept.endswith("-uploaded") and (served.bucket / kept).is_dir(), provenance
