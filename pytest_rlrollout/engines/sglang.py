"""SGLang: one self-hosted server swapped through its RL routes (`/update_weights_from_disk`,
a weight_version label, `/pause_generation`)."""

from __future__ import annotations

from pytest_rlrollout.engines.spec import Dialect, EngineSpec

NAME = "sglang"
DIALECT_VERSION = "0.5.23"  # what GET /server_info says in the reference's SGLang dialect (the release read, not run)

ENGINE = EngineSpec(
    name=NAME,
    title="SGLang",
    driver="pytest_rlrollout.remote.drivers.sglang:SGLangDriver",
    flags={
        "auth": "--api-key",
        "routing_matrix": "--enable-return-routed-experts",
        "cached_tokens": "--enable-cache-report (the OpenAI routes)",
    },
    dialect=Dialect(
        app="pytest_rlrollout.reference.sglang_app:create_sglang_app",
        serving=f"SGLang {DIALECT_VERSION}'s dialect",
        # as an RL stack starts it: one server, --served-model-name, no key; its radix cache
        # matches any prefix (page size 1): the reference's smallest sensible block stands in for it
        defaults={"replicas": 1, "model": "tiny", "block_size": 16, "api_key": None},
    ),
    self_hosted=True,
    async_only="the swap pauses generation and the requests in flight continue (ASYNC)",
)
