"""vLLM: one self-hosted server swapped through its RL routes (VLLM_SERVER_DEV_MODE=1):
`/update_weights` from a path it reads, a weight-version label, pause and resume."""

from __future__ import annotations

import re

from pytest_rlrollout.engines.spec import Dialect, EngineSpec

NAME = "vllm"
DIALECT_VERSION = "0.32.0"  # what GET /version says in the reference's vLLM dialect (the release measured)
# The releases the reference's vLLM dialect speaks (`Settings.vllm_release`). 0.33.0 is read from
# its wheel (no CPU build of it exists): while paused in abort or wait mode it refuses new requests
# (503, retryable) where 0.32 held them, and its OpenAI routes return the policy-version spans
# (`return_weight_versions`) that 0.32 gives only on /inference/v1/generate.
RELEASES = ("0.32.0", "0.33.0")
REFUSES_WHILE_PAUSED = "0.33.0"  # the first release that refuses arrivals in abort and wait mode
SPANS_ON_OPENAI_ROUTES = "0.33.0"  # the first release whose /v1/completions takes return_weight_versions
PAUSED_MESSAGE = "Generation is paused. Please retry after it resumes."  # 0.33's refusal


def at_least(release: str, since: str) -> bool:
    """Whether vLLM `release` ("0.33.0", "0.33.0rc1", "0.33.1.dev3+g…") is `since` or later."""
    return _numbers(release) >= _numbers(since)


def _numbers(release: str) -> tuple[int, ...]:
    """Major, minor, patch: the leading digits of each (a pre-release counts as its release)."""
    return tuple(int(m.group()) if (m := re.match(r"\d+", part)) else 0 for part in release.split(".")[:3])


DEV_MODE = "VLLM_SERVER_DEV_MODE=1"  # vLLM's RL routes (weights, labels, pause, cache reset)

ENGINE = EngineSpec(
    name=NAME,
    title="vLLM",
    driver="pytest_rlrollout.remote.drivers.vllm:VLLMDriver",
    flags={
        "hot_load_api": DEV_MODE,
        "auth": "--api-key",
        "pause": DEV_MODE,
        "cache_reset": DEV_MODE,
        "lora": "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1",
        "routing_matrix": "--enable-return-routed-experts (vLLM's GPU model runner)",
        "cached_tokens": "--enable-prompt-tokens-details",
        "policy_version": "--enable-scale-out (spans on /inference/v1/generate), or vLLM 0.33 (on its OpenAI routes too)",
    },
    dialect=Dialect(
        app="pytest_rlrollout.reference.vllm_app:create_vllm_app",
        serving=f"vLLM {DIALECT_VERSION}'s dialect",
        # one server is one engine, the model is served under a short name (--served-model-name),
        # no API key is asked for (a server started without --api-key), and the CPU backend
        # measured here caches prefixes in blocks of 128 tokens (cached_tokens 128, 256, 384 for
        # 200-, 300- and 400-token prompts)
        defaults={"replicas": 1, "model": "tiny", "block_size": 128, "api_key": None},
    ),
    self_hosted=True,
    async_only="the swap pauses generation and the requests in flight continue (ASYNC)",
    discovers_to_sample=True,  # the spans of its generate route name each rollout's policy
)
