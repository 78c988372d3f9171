"""What a deployment offers: a fixed vocabulary of capabilities, each discovered by a probe that
changes nothing, and which engine requires which.

A conformance test names the capabilities it needs (`rl_requires`). When one is missing, the
suite decides the outcome, not the test: a feature the deployment's engine requires fails a
test of a MUST clause, naming it; a feature the engine offers behind a server flag is
`unsupported` naming the flag; any other missing feature is `unsupported`. A capability that
only lets the suite *see* something (which replica answered) leaves the test `inconclusive`.
A clause without a binding on the engine (the hot-load API on a plain OpenAI-compatible server)
is `not-applicable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_rlrollout.contract.catalogue import ENGINES, Engine


@dataclass(frozen=True)
class Capability:
    name: str
    about: str  # what the deployment does when it has it
    probe: str  # how the suite finds out, changing nothing
    required_by: frozenset[Engine] = frozenset()  # engines that must offer it
    observable: bool = False  # lets the suite observe a clause, is no feature of its own
    # engine -> how to turn it on where the engine has it behind a server flag
    flags: Mapping[Engine, str] = field(default_factory=dict, hash=False)

    def required(self, engine: Engine) -> bool:
        return engine in self.required_by

    def flag(self, engine: Engine) -> str | None:
        """What turns it on, on `engine` (a server flag or environment variable), if anything does."""
        return self.flags.get(engine)


FIREWORKS: frozenset[Engine] = frozenset({"fireworks"})
EVERY: frozenset[Engine] = frozenset(ENGINES)
DEV_MODE = "VLLM_SERVER_DEV_MODE=1"  # vLLM's RL routes (weights, labels, pause, cache reset)

CAPABILITIES: dict[str, Capability] = {
    c.name: c
    for c in (
        Capability(
            "hot_load_api",
            "an API that loads snapshots into the running deployment",
            "GET /hot_load/v1/models/hot_load (Fireworks), GET /weight_info (vLLM), GET /model_info (SGLang)",
            FIREWORKS,
            flags={"vllm": DEV_MODE},
        ),
        Capability("incremental", "incremental (ARC2) snapshots", "the engine's load API takes ARC2 diffs"),
        Capability(
            "auth",
            "API keys checked (a request under a wrong key refused)",
            "a one-token completion under a wrong key",
            FIREWORKS,
            flags={"vllm": "--api-key", "sglang": "--api-key"},
        ),
        Capability(
            "pause",
            "generation paused and resumed on request (abort, wait and keep modes)",
            "GET /is_paused (SGLang: POST /continue_generation is routed)",
            flags={"vllm": DEV_MODE},
        ),
        Capability(
            "cache_reset",
            "a prompt-cache reset on request",
            "POST /reset_prefix_cache is routed",
            flags={"vllm": DEV_MODE},
        ),
        Capability("ledger", "the deployment's ledger of loads", "GET /v1/accounts/{a}/deployments/{d}/ledger"),
        Capability("hint", "the hot-load hint endpoint", "GET .../hot_load/hint: anything but 404"),
        Capability(
            "lora",
            "LoRA adapters hot-loaded beside the base",
            "the status lists loaded_adapters",
            flags={"vllm": "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"},
        ),
        Capability(
            "transition",
            "a known hot-load transition type (ASYNC or SYNC)",
            "the deployment resource's hotLoadTransitionType, or rl_transition",
            FIREWORKS,
        ),
        Capability("text_prompts", "prompts as text", "a one-token completion of a text prompt", EVERY),
        Capability(
            "token_id_prompts", "prompts as token ids", "a one-token completion of a token-id prompt", FIREWORKS
        ),
        Capability("logprobs", "logprobs entries (token, logprob, token_id)", "logprobs: true", FIREWORKS),
        Capability(
            "echo",
            "the prompt's tokens scored (echo with logprobs; vLLM: prompt_logprobs)",
            "echo: true (vLLM: prompt_logprobs)",
            FIREWORKS,
        ),
        Capability("raw_output", "raw_output with the prompt and completion token ids", "raw_output: true", FIREWORKS),
        Capability("token_ids", "prompt_token_ids and token_ids on the choice", "return_token_ids: true", FIREWORKS),
        # required of MoE models only, which the R3 tests tell from the served config
        Capability(
            "routing_matrix",
            "a routing_matrix on every logprobs entry (required of MoE models, told by the served config)",
            "include_routing_matrix: true on a streamed completion (vLLM: routed_experts of a completion)",
            flags={
                "vllm": "--enable-return-routed-experts (vLLM's GPU model runner)",
                "sglang": "--enable-return-routed-experts",
            },
        ),
        Capability(
            "cached_tokens",
            "cached prompt tokens reported (usage, header or perf_metrics)",
            "usage.prompt_tokens_details.cached_tokens, fireworks-cached-prompt-tokens",
            FIREWORKS,
            flags={"vllm": "--enable-prompt-tokens-details", "sglang": "--enable-cache-report (the OpenAI routes)"},
        ),
        Capability("perf_metrics", "perf_metrics on the answer", "perf_metrics_in_response: true", FIREWORKS),
        Capability(
            "policy_version",
            "the policy version of every generated token (Fireworks: model@identity on every chunk; vLLM: "
            "weight_versions spans on the final chunk)",
            "a streamed completion's chunks",
            FIREWORKS,
            flags={"vllm": "--enable-scale-out (spans on /inference/v1/generate)"},
        ),
        Capability("nonstream_version", "model@identity on non-streaming answers", "a non-streaming completion"),
        Capability(
            "backend_host",
            "the serving replica named in fireworks-backend-host",
            "the header of any completion",
            observable=True,
        ),
    )
}
