"""A plain OpenAI-compatible server: inference only, no hot-load API (the fallback of
--rl-engine auto)."""

from __future__ import annotations

from pytest_rlrollout.engines.spec import EngineSpec

ENGINE = EngineSpec(
    name="openai",
    title="an OpenAI-compatible server",
    driver="pytest_rlrollout.remote.drivers.openai:OpenAIDriver",
)
