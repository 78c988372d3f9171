"""Request bodies: JSON decoded strictly (no NaN, no Infinity, no lone surrogates), and inference
requests checked against the contract's request schema (the same one the OpenAPI document
publishes), then read into an `Inference`.

The schemas hold every range and size limit they can express (sampling parameters, list lengths,
string lengths). Only what a schema cannot say is checked here: the model name, token ids within
the vocabulary, the context length, and (before any expensive step) sizes that can never fit the
context, so that no request is tokenized, rendered or walked by the explaining validator at a size
the deployment would refuse anyway. Everything here may run on a worker thread.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.contract.schemas import problems, schema
from pytest_rlrollout.reference.sampling import SamplingParams

if TYPE_CHECKING:
    from pytest_rlrollout.reference.text import Text

# Fields of the official SDK's Parquet routing path: refused with the wording its fallback to
# inline routing matrices matches on.
REFUSED_FIELDS = ("routing_matrix_format", "top_sampling_logprobs", "top_sampling_format", "sampling_mask")
FLAGS = (
    "stream",
    "echo",
    "raw_output",
    "return_token_ids",
    "perf_metrics_in_response",
    "include_routing_matrix",
    "ignore_eos",
)
MESSAGE_CHARS = 600  # an error message quotes at most this much of what the client sent
# a \uD800-\uDFFF escape: the body may hold a lone surrogate (a paired one decodes to one code point)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class BadRequest(Exception):
    """A request the deployment refuses: `status` is a 4xx; `close` asks to end the connection
    (the body was not read to its end, so the next request cannot follow on it)."""

    def __init__(self, message: str, status: int = 400, close: bool = False):
        super().__init__(message)
        self.status, self.close = status, close


class _NotJson(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf: no number of the API is infinite
        raise _NotJson(f"the number {text[:40]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON value")


def decode_json(raw: bytes) -> Any:
    """The JSON document in `raw` (RFC 8259, I-JSON strings): NaN, Infinity, numbers that overflow
    a double, integers of thousands of digits, nesting past the interpreter's recursion limit,
    text that is not UTF-8 (json.loads would also take UTF-16 and UTF-32) and lone UTF-16
    surrogates are all refused as 400."""
    try:
        text = raw.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"the request body is not UTF-8 (byte {e.start})") from None
    try:
        doc = json.loads(text, parse_float=_finite, parse_constant=_constant)
    except _NotJson as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("the request body is not valid JSON: it is nested too deeply") from None
    except ValueError:  # JSONDecodeError, the int digit limit
        raise BadRequest("the request body is not valid JSON") from None
    if _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("the request body holds a lone UTF-16 surrogate; strings must be valid Unicode") from None
        except RecursionError:
            raise BadRequest("the request body is nested too deeply") from None
    return doc


def quoted(value: str) -> str:
    """`value` cut to what an error message may quote."""
    return value if len(value) <= MESSAGE_CHARS else value[:MESSAGE_CHARS] + f"... ({len(value)} characters)"


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


@dataclass(frozen=True)
class Caps:
    """The list lengths the request schemas allow, read from the schemas themselves."""

    prompt_ids: int
    messages: int
    stop: int


@cache
def caps() -> Caps:
    completion, chat = schema("completion-request"), schema("chat-completion-request")
    ids = next(s for s in completion["properties"]["prompt"]["anyOf"] if s["type"] == "array")
    stop = next(s for s in completion["$defs"]["common"]["properties"]["stop"]["anyOf"] if s["type"] == "array")
    return Caps(ids["maxItems"], chat["properties"]["messages"]["maxItems"], stop["maxItems"])


def utf8_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _oversized(body: dict[str, Any], chat: bool, max_context: int, max_bytes: int | None) -> str | None:
    """Why `body` can never be served, found without tokenizing or walking it: the explaining
    validator walks every item of a list, so a list far beyond its schema's maxItems is refused
    before that walk, and a text too long for the context is refused before it is tokenized."""
    c = caps()
    prompt = None if chat else body.get("prompt")
    messages = body.get("messages") if chat else None
    stop = body.get("stop")
    if isinstance(prompt, list) and len(prompt) > min(c.prompt_ids, max_context):
        return f"prompt: {len(prompt)} token ids do not fit the context length {max_context}"
    if isinstance(prompt, str) and max_bytes is not None:
        # a character is at least one byte: a text of more characters than the bound is not
        # even encoded to know its length in bytes
        size = len(prompt) if len(prompt) > max_bytes else utf8_length(prompt)
        if size > max_bytes:
            return (
                f"prompt: the text (at least {size} UTF-8 bytes) cannot fit the context length {max_context}; "
                f"no text of more than {max_bytes} bytes does"
            )
    if isinstance(messages, list) and len(messages) > c.messages:
        return f"messages: {len(messages)} messages; at most {c.messages}"
    if isinstance(stop, list) and len(stop) > c.stop:
        return f"stop: {len(stop)} stop strings; at most {c.stop}"
    return None


def chat_prompt(messages: list[dict[str, Any]], text: Text, max_context: int, max_bytes: int | None) -> list[int]:
    from jinja2 import TemplateError

    if max_bytes is not None:
        # the rendered conversation holds every role and content: longer than the bound, it
        # cannot fit, and neither rendering nor tokenizing it is worth the time
        size = sum(utf8_length(m["role"]) + utf8_length(m["content"]) for m in messages)
        if size > max_bytes:
            raise BadRequest(f"messages: {size} bytes of text cannot fit the context length {max_context}")
    try:
        rendered = text.render_chat(messages)
    except (TemplateError, TypeError, ValueError) as e:  # the template refused these messages
        raise BadRequest(quoted(f"messages: the chat template refused them: {e}")) from None
    if max_bytes is not None and utf8_length(rendered) > max_bytes:
        raise BadRequest(f"messages: the conversation cannot fit the context length {max_context}")
    return text.encode(rendered)


def parse_inference(body: Any, chat: bool, text: Text, vocab: int, max_context: int, names: set[str]) -> Inference:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for name in REFUSED_FIELDS:
        if name in body:
            raise BadRequest(f"Extra inputs are not permitted, field: '{name}'")
    body = {k: v for k, v in body.items() if v is not None}  # OpenAI clients send null for "default"
    max_bytes = text.bytes_bound(max_context)
    if (why := _oversized(body, chat, max_context, max_bytes)) is not None:
        raise BadRequest(why)
    try:
        found = [p.message for p in problems("chat-completion-request" if chat else "completion-request", body)]
    except RecursionError:
        raise BadRequest("the request body is nested too deeply") from None
    if found:
        raise BadRequest(quoted("; ".join(found)))
    if body["model"] not in names:
        raise BadRequest(quoted(f"Model not found: {body['model']}"), status=404)
    # JSON Schema counts 3.0 as an integer: every integer field is an int from here on
    ints = {k: int(body[k]) for k in ("max_tokens", "top_k", "seed", "echo_last", "prompt_cache_max_len") if k in body}
    if chat:
        prompt = chat_prompt(body["messages"], text, max_context, max_bytes)
    elif isinstance(body["prompt"], str):
        prompt = text.encode(body["prompt"])
    else:
        prompt = [int(t) for t in body["prompt"]]
    if not prompt:
        raise BadRequest("the prompt is empty")
    if any(t >= vocab for t in prompt):
        raise BadRequest(f"prompt: token ids must be in [0, {vocab})")
    max_tokens = ints.get("max_tokens", 128 if chat else 16)
    if len(prompt) + max_tokens > max_context:
        raise BadRequest(
            f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the context length {max_context}"
        )
    flags = {k: body.get(k, False) for k in FLAGS}
    stop = body.get("stop", [])
    logprobs = body.get("logprobs", False)
    return Inference(
        chat=chat,
        model=body["model"],
        prompt=prompt,
        max_tokens=max_tokens,
        # top_k beyond the vocabulary keeps every token, as top_k 0 does
        params=SamplingParams(
            float(body.get("temperature", 1.0)), float(body.get("top_p", 1.0)), min(ints.get("top_k", 0), vocab)
        ),
        seed=ints.get("seed"),
        stream=flags["stream"],
        logprobs=bool(logprobs) or flags["include_routing_matrix"],
        echo=flags["echo"],
        echo_last=ints.get("echo_last"),
        ignore_eos=flags["ignore_eos"],
        raw_output=flags["raw_output"],
        return_token_ids=flags["return_token_ids"],
        perf_metrics=flags["perf_metrics_in_response"],
        routing=flags["include_routing_matrix"],
        stop=[stop] if isinstance(stop, str) else list(stop),
        isolation=body.get("prompt_cache_isolation_key"),
        cache_max_len=ints.get("prompt_cache_max_len"),
    )
