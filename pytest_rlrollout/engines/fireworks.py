"""Fireworks: a hosted deployment with a hot-load API (`/hot_load/v1/models/hot_load`), named
accounts/<a>/deployments/<d>, its inference under /inference; the contract's home engine."""

from __future__ import annotations

from pytest_rlrollout.engines.spec import Dialect, EngineSpec

ENGINE = EngineSpec(
    name="fireworks",
    title="Fireworks",
    driver="pytest_rlrollout.remote.drivers.fireworks:FireworksDriver",
    # the contract's home engine requires every capability of its hot-load API and completions
    requires=frozenset(
        {
            "hot_load_api",
            "auth",
            "transition",
            "text_prompts",
            "token_id_prompts",
            "logprobs",
            "echo",
            "raw_output",
            "token_ids",
            "cached_tokens",
            "perf_metrics",
            "policy_version",
        }
    ),
    dialect=Dialect(
        app="pytest_rlrollout.reference.fireworks_app:create_fireworks_app",
        serving="{transition}",
        stream_tokens=64,  # this deployment's pace: a swap lands inside 64 tokens
    ),
    names="path",
    model_is_name=True,
    affinity=True,  # x-multi-turn-session-id (SESS-1)
    inference_prefix="/inference",
)
