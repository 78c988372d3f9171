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

from dataclasses import dataclass

from pytest_rlrollout.engines import spec


@dataclass(frozen=True)
class Capability:
    name: str
    about: str  # what the deployment does when it has it
    probe: str  # how the suite finds out, changing nothing
    observable: bool = False  # lets the suite observe a clause, is no feature of its own

    # which engine requires it, and behind which flag, is the engine's to say (engines/<name>.py)
    def required(self, engine: str) -> bool:
        return spec(engine).required(self.name)

    def flag(self, engine: str) -> str | None:
        """What turns it on, on `engine` (a server flag or environment variable), if anything does."""
        return spec(engine).flag(self.name)


CAPABILITIES: dict[str, Capability] = {
    c.name: c
    for c in (
        Capability(
            "hot_load_api",
            "an API that loads snapshots into the running deployment",
            "GET /hot_load/v1/models/hot_load (Fireworks), GET /weight_info (vLLM), GET /model_info (SGLang)",
        ),
        Capability("incremental", "incremental (ARC2) snapshots", "the engine's load API takes ARC2 diffs"),
        Capability(
            "auth",
            "API keys checked (a request under a wrong key refused)",
            "a one-token completion under a wrong key",
        ),
        Capability(
            "pause",
            "generation paused and resumed on request (abort, wait and keep modes)",
            "GET /is_paused (SGLang: POST /continue_generation is routed)",
        ),
        Capability(
            "cache_reset",
            "a prompt-cache reset on request",
            "POST /reset_prefix_cache is routed",
        ),
        Capability("ledger", "the deployment's ledger of loads", "GET /v1/accounts/{a}/deployments/{d}/ledger"),
        Capability("hint", "the hot-load hint endpoint", "GET .../hot_load/hint: anything but 404"),
        Capability(
            "lora",
            "LoRA adapters hot-loaded beside the base",
            "the status lists loaded_adapters",
        ),
        Capability(
            "transition",
            "a known hot-load transition type (ASYNC or SYNC)",
            "the deployment resource's hotLoadTransitionType, or rl_transition",
        ),
        Capability("text_prompts", "prompts as text", "a one-token completion of a text prompt"),
        Capability("token_id_prompts", "prompts as token ids", "a one-token completion of a token-id prompt"),
        Capability("logprobs", "logprobs entries (token, logprob, token_id)", "logprobs: true"),
        Capability(
            "echo",
            "the prompt's tokens scored (echo with logprobs; vLLM: prompt_logprobs)",
            "echo: true (vLLM: prompt_logprobs)",
        ),
        Capability("raw_output", "raw_output with the prompt and completion token ids", "raw_output: true"),
        Capability("token_ids", "prompt_token_ids and token_ids on the choice", "return_token_ids: true"),
        # required of MoE models only, which the R3 tests tell from the served config
        Capability(
            "routing_matrix",
            "a routing_matrix on every logprobs entry (required of MoE models, told by the served config)",
            "include_routing_matrix: true on a streamed completion (vLLM: routed_experts of a completion)",
        ),
        Capability(
            "cached_tokens",
            "cached prompt tokens reported (usage, header or perf_metrics)",
            "usage.prompt_tokens_details.cached_tokens, fireworks-cached-prompt-tokens",
        ),
        Capability("perf_metrics", "perf_metrics on the answer", "perf_metrics_in_response: true"),
        Capability(
            "policy_version",
            "the policy version of every generated token (Fireworks: model@identity on every chunk; vLLM: "
            "weight_versions spans on the final chunk)",
            "a streamed completion's chunks",
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
