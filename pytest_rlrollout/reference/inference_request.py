"""Inference requests: each body is checked against the contract's request schema (the same one
the OpenAPI document publishes), then read into an `Inference`. Only what a schema cannot say
is checked here: the model name, token ids within the vocabulary, the context length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.contract.schemas import problems
from pytest_rlrollout.reference.sampling import SamplingParams

if TYPE_CHECKING:
    from pytest_rlrollout.reference.text import Text

# Fields of the official SDK's Parquet routing path: refused with the wording its fallback to
# inline routing matrices matches on.
REFUSED_FIELDS = ("routing_matrix_format", "top_sampling_logprobs", "top_sampling_format", "sampling_mask")
FLAGS = ("stream", "echo", "raw_output", "return_token_ids", "perf_metrics_in_response", "include_routing_matrix",
         "ignore_eos")  # fmt: skip


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Inference:
    chat: bool
    model: str
    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    seed: int | None
    stream: bool
    logprobs: bool
    echo: bool
    echo_last: int | None
    ignore_eos: bool
    raw_output: bool
    return_token_ids: bool
    perf_metrics: bool
    routing: bool
    stop: list[str]
    isolation: str | None
    cache_max_len: int | None


def parse_inference(body: Any, chat: bool, text: Text, vocab: int, max_context: int, names: set[str]) -> Inference:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for name in REFUSED_FIELDS:
        if name in body:
            raise BadRequest(f"Extra inputs are not permitted, field: '{name}'")
    body = {k: v for k, v in body.items() if v is not None}  # OpenAI clients send null for "default"
    found = list(problems("chat-completion-request" if chat else "completion-request", body))
    if found:
        raise BadRequest("; ".join(p.message for p in found))
    if body["model"] not in names:
        raise BadRequest(f"Model not found: {body['model']}", status=404)
    if chat:
        prompt = text.chat(body["messages"])
    else:
        prompt = text.encode(body["prompt"]) if isinstance(body["prompt"], str) else list(body["prompt"])
    if not prompt:
        raise BadRequest("the prompt is empty")
    if any(t >= vocab for t in prompt):
        raise BadRequest(f"prompt: token ids must be in [0, {vocab})")
    max_tokens = body.get("max_tokens", 128 if chat else 16)
    if len(prompt) + max_tokens > max_context:
        raise BadRequest(
            f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the context length {max_context}"
        )
    flags = {k: body.get(k, False) for k in FLAGS}
    stop = body.get("stop", [])
    return Inference(
        chat=chat,
        model=body["model"],
        prompt=prompt,
        max_tokens=max_tokens,
        params=SamplingParams(float(body.get("temperature", 1.0)), float(body.get("top_p", 1.0)), body.get("top_k", 0)),
        seed=body.get("seed"),
        stream=flags["stream"],
        logprobs=bool(body.get("logprobs", False)) or flags["include_routing_matrix"],
        echo=flags["echo"],
        echo_last=body.get("echo_last"),
        ignore_eos=flags["ignore_eos"],
        raw_output=flags["raw_output"],
        return_token_ids=flags["return_token_ids"],
        perf_metrics=flags["perf_metrics_in_response"],
        routing=flags["include_routing_matrix"],
        stop=[stop] if isinstance(stop, str) else stop,
        isolation=body.get("prompt_cache_isolation_key"),
        cache_max_len=body.get("prompt_cache_max_len"),
    )
