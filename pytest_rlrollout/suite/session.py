"""One multi-turn session against the deployment under test: the `rl_session` fixture."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

import pytest

from pytest_rlrollout.suite.deployment import RLDeployment

if TYPE_CHECKING:
    import httpx
    import openai

    from pytest_rlrollout.remote.options import CompletionOptions
    from pytest_rlrollout.remote.stream import Stream


@dataclass
class RLSession:
    """Every request carries this session's `x-multi-turn-session-id`."""

    deployment: RLDeployment
    session_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"x-multi-turn-session-id": self.session_id}

    def complete(self, body: dict[str, Any], **options: Unpack[CompletionOptions]) -> Stream:
        """A completion in this session, parsed (policy versions, routing entries, cached tokens)."""
        options["headers"] = self.headers | (options.get("headers") or {})
        return self.deployment.complete(body, **options)

    def openai(self) -> openai.OpenAI:
        """An `openai.OpenAI` client for the inference API with this session's header."""
        import openai

        t = self.deployment.target
        return openai.OpenAI(
            base_url=t.inference_base + "/v1", api_key=t.api_key.reveal(), default_headers=self.headers
        )

    def http(self) -> httpx.Client:
        """An httpx client for the inference API with auth and this session's header."""
        import httpx

        t = self.deployment.target
        return httpx.Client(
            base_url=t.inference_base,
            headers=self.deployment.auth_headers() | self.headers,
            timeout=self.deployment.timeouts.request,
        )


@pytest.fixture
def rl_session(rl_deployment: RLDeployment, request: pytest.FixtureRequest) -> RLSession:
    """A fresh session on the deployment under test, named after the test."""
    return RLSession(rl_deployment, f"{request.node.name}-{uuid.uuid4().hex[:8]}")
