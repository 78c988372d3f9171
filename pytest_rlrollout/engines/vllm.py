"""vLLM: one self-hosted server swapped through its RL routes (VLLM_SERVER_DEV_MODE=1):
`/update_weights` from a path it reads, a weight-version label, pause and resume."""

from __future__ import annotations

from pytest_rlrollout.engines.spec import Dialect, EngineSpec

NAME = "vllm"
DIALECT_VERSION = "0.32.0"  # what GET /version says in the reference's vLLM dialect (the release measured)
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
        "policy_version": "--enable-scale-out (spans on /inference/v1/generate)",
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
