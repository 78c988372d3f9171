"""What a deployment offers: a fixed vocabulary of capabilities, each discovered by a probe that
changes nothing, and which profile requires which.

A conformance test names the capabilities it needs (`rl_requires`). When one is missing, the
suite decides the outcome, not the test: a feature the deployment's profile requires fails a
test of a MUST clause, naming it; any other missing feature is `unsupported`. A capability that
only lets the suite *see* something (which replica answered) leaves the test `inconclusive`.
A clause outside the profile (the hot-load API on a plain OpenAI-compatible server) is
`not-applicable`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_rlrollout.contract.catalogue import Profile

PROFILES: tuple[Profile, ...] = ("fireworks", "openai")


@dataclass(frozen=True)
class Capability:
    name: str
    about: str  # what the deployment does when it has it
    probe: str  # how the suite finds out, changing nothing
    required_by: frozenset[Profile] = frozenset()  # profiles that must offer it
    observable: bool = False  # lets the suite observe a clause, is no feature of its own

    def required(self, profile: Profile) -> bool:
        return profile in self.required_by


FIREWORKS: frozenset[Profile] = frozenset({"fireworks"})
EVERY: frozenset[Profile] = frozenset(PROFILES)

CAPABILITIES: dict[str, Capability] = {
    c.name: c
    for c in (
        Capability("hot_load_api", "the hot-load control API", "GET /hot_load/v1/models/hot_load", FIREWORKS),
        Capability("ledger", "the deployment's ledger of loads", "GET /v1/accounts/{a}/deployments/{d}/ledger"),
        Capability("hint", "the hot-load hint endpoint", "GET .../hot_load/hint: anything but 404"),
        Capability("lora", "LoRA adapters hot-loaded beside the base", "the status lists loaded_adapters"),
        Capability(
            "transition",
            "a known hot-load transition type (ASYNC or SYNC)",
            "the deployment resource's hotLoadTransitionType, or --rl-transition",
            FIREWORKS,
        ),
        Capability("text_prompts", "prompts as text", "a one-token completion of a text prompt", EVERY),
        Capability(
            "token_id_prompts", "prompts as token ids", "a one-token completion of a token-id prompt", FIREWORKS
        ),
        Capability("logprobs", "logprobs entries (token, logprob, token_id)", "logprobs: true", FIREWORKS),
        Capability("echo", "the prompt's tokens echoed with their logprobs", "echo: true", FIREWORKS),
        Capability("raw_output", "raw_output with the prompt and completion token ids", "raw_output: true", FIREWORKS),
        Capability("token_ids", "prompt_token_ids and token_ids on the choice", "return_token_ids: true", FIREWORKS),
        # required of MoE models only, which the R3 tests tell from the served config
        Capability(
            "routing_matrix",
            "a routing_matrix on every logprobs entry (required of MoE models, told by the served config)",
            "include_routing_matrix: true on a streamed completion",
        ),
        Capability(
            "cached_tokens",
            "cached prompt tokens reported (usage, header or perf_metrics)",
            "usage.prompt_tokens_details.cached_tokens, fireworks-cached-prompt-tokens",
            FIREWORKS,
        ),
        Capability("perf_metrics", "perf_metrics on the answer", "perf_metrics_in_response: true", FIREWORKS),
        Capability(
            "policy_version",
            "the serving snapshot on every streamed chunk (model@identity)",
            "a streamed completion's chunks",
            FIREWORKS,
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
