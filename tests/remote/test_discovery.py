"""The preflight and the capability probes: against the reference deployment (a real server in
this process) and against scripted plain OpenAI-compatible servers (httpx.MockTransport)."""

import json
import socket

import httpx
import pytest

from pytest_rlrollout.contract.capabilities import CAPABILITIES
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.discovery import Discovery, PreflightError
from pytest_rlrollout.remote.drivers import driver_for
from pytest_rlrollout.remote.preflight import preflight
from pytest_rlrollout.remote.target import Target


def reference_client(dep, **changes):
    fields = {"deployment": dep.name, "base_url": dep.base_url, "model": dep.model, "api_key": dep.api_key} | changes
    return DeploymentClient(Target(**fields))


def test_the_reference_deployment_is_fireworks_and_offers_everything(dep):
    with reference_client(dep) as c:
        engine, decided = preflight(c, None)
        assert engine == "fireworks" and "a Fireworks API answers" in decided
        found = driver_for(engine, c).discover(transition=None, decided=decided)
    assert found.replicas == 2 and found.transition == "ASYNC"
    # pause and resume, and a cache reset on its own, are vLLM's intents: no Fireworks binding
    assert {name for name, has in found.capabilities.items() if not has} == {"pause", "cache_reset"}
    assert set(found.capabilities) == set(CAPABILITIES)
    assert Discovery.from_dict(json.loads(json.dumps(found.as_dict()))) == found
    assert [row[0] for row in found.table()] == list(CAPABILITIES)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MISCONFIGURED = {
    "wrong key": ({"api_key": "not-the-key"}, "the API key was refused"),
    "typo'd deployment": ({"deployment": "accounts/rlrollout/deployments/refrence"}, "does not know deployment"),
    "wrong model": ({"model": "accounts/x/models/nope"}, "check --rl-model"),
    "wrong inference path": ({"inference_url": "{base}/nowhere"}, "no completions endpoint"),
}


@pytest.mark.parametrize("case", sorted(MISCONFIGURED))
def test_preflight_says_what_to_fix(dep, case):
    changes, message = MISCONFIGURED[case]
    changes = {k: v.format(base=dep.base_url) for k, v in changes.items()}
    with reference_client(dep, **changes) as c, pytest.raises(PreflightError, match=message):
        preflight(c, None)


def test_preflight_when_nothing_listens():
    target = Target("accounts/a/deployments/d", f"http://127.0.0.1:{closed_port()}", "m", "k")
    with (
        DeploymentClient(target, timeout=5) as c,
        pytest.raises(PreflightError, match=r"nothing answers at .*--rl-base-url"),
    ):
        preflight(c, None)


def plain_server(*, text_only: bool = True, models: tuple[str, ...] = ("tiny",)):
    """An OpenAI-compatible server with no hot-load API: completions of text prompts only."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/completions":
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        if body.get("model") not in models:
            return httpx.Response(404, json={"error": {"message": f"model {body.get('model')!r} not found"}})
        if text_only and not isinstance(body.get("prompt"), str):
            return httpx.Response(422, json={"detail": [{"msg": "prompt must be a string"}]})
        answer = {
            "model": f"{body['model']}@main",
            "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        return httpx.Response(200, json=answer)

    return httpx.MockTransport(handle)


def test_auto_decides_openai_for_a_plain_server_and_probes_little():
    target = Target(None, "http://plain", "tiny", "", engine="openai")
    with DeploymentClient(target, transport=plain_server()) as c:
        engine, decided = preflight(c, None)
        assert engine == "openai" and decided == "auto: no hot-load API and no engine's own API answers"
        found = driver_for(engine, c).discover(transition=None, decided=decided)
    assert found.capabilities == {"text_prompts": True, "cached_tokens": False, "backend_host": False}
    assert found.has("token_id_prompts") is False  # never probed: no openai clause needs it
    with pytest.raises(KeyError, match="unknown capability"):
        found.has("telepathy")


def test_a_plain_server_that_does_not_serve_the_model():
    target = Target(None, "http://plain", "other", "", engine="openai")
    with DeploymentClient(target, transport=plain_server()) as c, pytest.raises(PreflightError, match="--rl-model"):
        preflight(c, None)


def test_fireworks_asked_of_a_plain_server():
    target = Target("accounts/a/deployments/d", "http://plain", "tiny", "k")
    with DeploymentClient(target, transport=plain_server()) as c, pytest.raises(PreflightError, match="openai"):
        preflight(c, "fireworks")
