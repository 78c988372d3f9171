"""Request bodies of vLLM's routes, read as vLLM 0.32 reads them, and its refusals.

vLLM answers a request it refuses in one envelope, `{"error": {"message", "type", "param",
"code"}}`, of two kinds: a body that does not fit the route's pydantic model is `"Bad Request"`,
its message pydantic's (`1 validation error:\\n  {'type': ..., 'loc': 'body.x', 'msg': ...,
'input': ...}`) and `param` the dotted location; a value the engine refuses is
`"BadRequestError"`, the message ending in `(parameter=..., value=...)`. A model it does not
serve is `"NotFoundError"` (404). Unknown fields are ignored, as vLLM does.

What the reference engine does not implement (several prompts in one request, n > 1, penalties,
min_p, min_tokens, beam search, logit bias, structured output, token-id placeholders for tokens)
is refused with a 400 saying so, never silently ignored: an answer must not look as if it had
honoured it.
Everything here may run on a worker thread.
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.reference.inference_request import BadRequest, chat_prompt, utf8_length
from pytest_rlrollout.reference.sampling import SamplingParams

if TYPE_CHECKING:
    from pytest_rlrollout.reference.text import Text

MAX_LOGPROBS = 20  # vLLM's --max-logprobs default
INT64 = (-(2**63), 2**63 - 1)
COMPLETION_MAX_TOKENS = 16  # /v1/completions' default; chat and generate fill the context
# fields vLLM takes that the reference engine does not implement, with the value that is a no-op
UNSUPPORTED: dict[str, Any] = {
    "n": 1,
    "best_of": None,
    "use_beam_search": False,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "min_tokens": 0,
    "return_tokens_as_token_ids": False,
    "logit_bias": None,
    "bad_words": [],
    "allowed_token_ids": None,
    "logprob_token_ids": None,
    "prompt_logprob_token_ids": None,
    "response_format": None,
    "structured_outputs": None,
    "guided_json": None,
    "guided_regex": None,
    "guided_choice": None,
    "suffix": None,
    "truncate_prompt_tokens": None,
    "prompt_embeds": None,
    "include_stop_str_in_output": False,
}


class VllmError(Exception):
    """A refusal in vLLM's envelope."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.kind, self.param = message, status, kind, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def summarized(value: Any) -> Any:
    """What vLLM's validation errors show of an input: containers described, text cut at 200."""
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:200] + "...[truncated]"
    if isinstance(value, list | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)


def invalid(loc: str, kind: str, msg: str, value: Any, ctx: dict[str, Any] | None = None) -> VllmError:
    """pydantic's refusal of a body that does not fit the route's model (`loc`: 'body.x' or 'query.x')."""
    err: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": summarized(value)}
    if ctx is not None:
        err["ctx"] = ctx
    return VllmError(f"1 validation error:\n  {err}", kind="Bad Request", param=loc)


def rejected(message: str, param: str | None = None, value: Any = None) -> VllmError:
    """vLLM's VLLMValidationError: a value the engine refuses."""
    extras = [f"{k}={v}" for k, v in (("parameter", param), ("value", value)) if v is not None]
    return VllmError(f"{message} ({', '.join(extras)})" if extras else message, param=param)


def not_served(model: str, served: str) -> VllmError:
    return VllmError(f"The model `{model}` does not exist. Valid aliases: {served}.", 404, "NotFoundError", "model")


def not_json(why: BadRequest) -> VllmError:
    return invalid("body", "json_invalid", "JSON decode error", {}, {"error": str(why)})


class Fields:
    """Typed reads of a JSON object's fields; `null` or absent is the default."""

    def __init__(self, doc: Any, where: str = "body"):
        if not isinstance(doc, dict):
            raise invalid(
                where,
                "model_attributes_type",
                "Input should be a valid dictionary or object to extract fields from",
                doc,
            )
        self.doc, self.where = doc, where

    def _bad(self, name: str, kind: str, msg: str) -> VllmError:
        return invalid(f"{self.where}.{name}", kind, msg, self.doc[name])

    def has(self, name: str) -> bool:
        return self.doc.get(name) is not None

    def int(self, name: str, default: Any = None) -> Any:
        v = self.doc.get(name)
        if v is None:
            return default
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            v = int(v)
        if isinstance(v, float):
            raise self._bad(
                name, "int_from_float", "Input should be a valid integer, got a number with a fractional part"
            )
        if not isinstance(v, int) or isinstance(v, bool):
            raise self._bad(name, "int_type", "Input should be a valid integer")
        if not INT64[0] <= v <= INT64[1]:
            raise self._bad(
                name, "int_parsing_size", "Unable to parse input string as an integer, exceeded maximum size"
            )
        return v

    def float(self, name: str, default: Any = None) -> Any:
        v = self.doc.get(name)
        if v is None:
            return default
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise self._bad(name, "float_type", "Input should be a valid number")
        return float(v)

    def bool(self, name: str, default: bool = False) -> bool:
        v = self.doc.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self._bad(name, "bool_type", "Input should be a valid boolean")
        return v

    def str(self, name: str, default: Any = None) -> Any:
        v = self.doc.get(name)
        if v is None:
            return default
        if not isinstance(v, str):
            raise self._bad(name, "string_type", "Input should be a valid string")
        return v

    # from here on the methods named int and str hide the types in the class body: builtins.* names them
    def object(self, name: builtins.str) -> Fields:
        v = self.doc.get(name)
        return Fields({} if v is None else v, f"{self.where}.{name}")

    def stop(self) -> list[builtins.str]:
        v = self.doc.get("stop")
        if v is None:
            return []
        if isinstance(v, str):
            return [v]
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise self._bad("stop", "list_type", "Input should be a valid list of strings")
        return [s for s in v if s]

    def ids(self, name: builtins.str) -> list[builtins.int]:
        v = self.doc.get(name)
        if v is None:
            return []
        if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            raise self._bad(name, "list_type", "Input should be a valid list of integers")
        return v

    def unsupported(self, names: dict[builtins.str, Any]) -> None:
        for name, neutral in names.items():
            if name in self.doc and self.doc[name] is not None and self.doc[name] != neutral:
                raise rejected(f"{name} is not implemented by the reference deployment", name, self.doc[name])


@dataclass
class VllmRequest:
    """A request of any of the three routes, in the engine's terms."""

    route: str  # completions, chat or generate
    model: str | None
    prompt: list[int]
    prompt_text: str  # what echo repeats
    max_tokens: int
    params: SamplingParams
    seed: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    logprobs: int | None  # how many alternatives per output token (None: no logprobs)
    prompt_logprobs: int | None  # the same for prompt positions
    echo: bool
    ignore_eos: bool
    return_token_ids: bool
    # the policy-version spans on the OpenAI routes' final chunk (a field vLLM 0.33 reads; 0.32
    # accepts it, as every unknown field, and ignores it)
    return_weight_versions: bool
    stop: list[str]
    stop_token_ids: list[int]  # tokens that end the request besides the end of sequence (kept in the output)
    cache_salt: str | None
    output_mode: str  # generate: tokens or text
    request_id: str | None
    read_cache: bool  # vLLM skips the prefix cache for a request with prompt logprobs


class VllmReader:
    """Reads the three routes' bodies against the served model."""

    def __init__(self, text: Text, vocab: int, max_context: int, served: str):
        self.text, self.vocab, self.max_context, self.served = text, vocab, max_context, served

    # ----------------------------------------------------------------------- the routes

    def completion(self, doc: Any) -> VllmRequest:
        b = Fields(doc)
        model = self._model(b)
        prompt, prompt_text = self._prompt(b)
        logprobs = self._logprobs(b, "logprobs")
        prompt_logprobs = self._logprobs(b, "prompt_logprobs", prompt=True)
        stream = b.bool("stream")
        if prompt_logprobs is not None and stream:
            raise invalid(
                "body",
                "value_error",
                "Value error, `prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)",
                doc,
            )
        echo = b.bool("echo")
        if prompt_logprobs is None and echo:
            prompt_logprobs = logprobs  # echo with logprobs scores the prompt too
        max_tokens = b.int("max_tokens", COMPLETION_MAX_TOKENS)
        if echo and max_tokens == 0:
            raise rejected("echo with max_tokens 0 is not implemented by the reference deployment", "max_tokens", 0)
        return self._request(
            "completions",
            b,
            model,
            prompt,
            prompt_text,
            max_tokens,
            logprobs,
            prompt_logprobs,
            echo,
            self._openai_salt(b),
            None,
            "text",
        )

    def chat(self, doc: Any) -> VllmRequest:
        b = Fields(doc)
        model = self._model(b)
        prompt = self._chat_prompt(b)
        logprobs = b.int("top_logprobs", 0) if b.bool("logprobs") else None
        if logprobs is not None:
            self._logprob_count(logprobs, "top_logprobs", "sample")
        b.unsupported({"echo": False, "prompt_logprobs": None})
        max_tokens = b.int("max_completion_tokens", b.int("max_tokens"))
        return self._request(
            "chat", b, model, prompt, "", max_tokens, logprobs, None, False, self._openai_salt(b), None, "text"
        )

    def generate(self, doc: Any) -> VllmRequest:
        b = Fields(doc)
        model = self._model(b)
        ids = doc.get("token_ids")
        if not isinstance(ids, list) or not ids:
            raise invalid(
                "body.token_ids",
                "too_short" if isinstance(ids, list) else "list_type",
                "List should have at least 1 item after validation, not 0"
                if isinstance(ids, list)
                else "Input should be a valid list",
                ids,
            )
        prompt = self._ids(ids, "body.token_ids")
        if doc.get("sampling_params") is None:
            raise invalid("body.sampling_params", "missing", "Field required", None)
        sp = b.object("sampling_params")
        sp.unsupported(UNSUPPORTED)
        mode = b.str("output_mode", "tokens")
        if mode not in ("tokens", "text"):
            raise invalid(
                "body.output_mode",
                "literal_error",
                "Input should be 'tokens' or 'text'",
                mode,
                {"expected": "'tokens' or 'text'"},
            )
        logprobs = self._logprobs(sp, "logprobs")
        prompt_logprobs = self._logprobs(sp, "prompt_logprobs", prompt=True)
        skip = sp.doc.get("skip_reading_prefix_cache")
        if skip is not None and not isinstance(skip, bool):
            raise invalid(
                "body.sampling_params.skip_reading_prefix_cache", "bool_type", "Input should be a valid boolean", skip
            )
        return self._request(
            "generate",
            sp,
            model,
            prompt,
            "",
            sp.int("max_tokens"),
            logprobs,
            prompt_logprobs,
            False,
            self._salt(b),
            b.str("request_id"),
            mode,
            stream_from=b,
            skip_cache=bool(skip),
        )

    # ----------------------------------------------------------------------- shared parts

    def _request(
        self,
        route: str,
        b: Fields,
        model: str | None,
        prompt: list[int],
        prompt_text: str,
        max_tokens: int | None,
        logprobs: int | None,
        prompt_logprobs: int | None,
        echo: bool,
        salt: str | None,
        request_id: str | None,
        mode: str,
        stream_from: Fields | None = None,
        skip_cache: bool = False,
    ) -> VllmRequest:
        top = stream_from or b  # the generate route keeps stream and ids outside sampling_params
        if route != "generate":
            b.unsupported(UNSUPPORTED)
        if salt is not None and not salt:
            raise rejected("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
        if len(prompt) > self.max_context:
            raise rejected(
                f"This model's maximum context length is {self.max_context} tokens. However, your prompt "
                f"contains {len(prompt)} input tokens, which exceeds this limit even without any output "
                "tokens. Please reduce the length of the input prompt.",
                "input_tokens",
                len(prompt),
            )
        room = self.max_context - len(prompt)
        max_tokens = room if max_tokens is None else min(max_tokens, room)  # vLLM clamps to what fits
        if max_tokens < 1:
            raise rejected(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
        temperature = b.float("temperature", 1.0)
        if not math.isfinite(temperature) or not 0.0 <= temperature <= 2.0:
            raise rejected(f"temperature must be in [0, 2], got {temperature}.", "temperature", temperature)
        top_p = b.float("top_p", 1.0)
        if not 0.0 < top_p <= 1.0:
            raise rejected(f"top_p must be in (0, 1], got {top_p}.", "top_p", top_p)
        top_k = b.int("top_k", 0)
        if top_k < -1:
            raise rejected(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
        stream = top.bool("stream")
        options = top.object("stream_options")
        if options.doc and not stream and route != "generate":
            raise rejected("Stream options can only be defined when `stream=True`.", "stream_options")
        stop = b.stop()
        return VllmRequest(
            route=route,
            model=model,
            prompt=prompt,
            prompt_text=prompt_text,
            max_tokens=max_tokens,
            # top_k -1 and 0 keep every token, as does a top_k beyond the vocabulary
            params=SamplingParams(temperature, top_p, min(max(top_k, 0), self.vocab)),
            seed=b.int("seed"),
            stream=stream,
            include_usage=stream and options.bool("include_usage"),
            continuous_usage=stream and options.bool("continuous_usage_stats"),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            echo=echo,
            ignore_eos=b.bool("ignore_eos"),
            return_token_ids=top.bool("return_token_ids"),
            return_weight_versions=route != "generate" and top.bool("return_weight_versions"),
            stop=stop,
            stop_token_ids=[t for t in b.ids("stop_token_ids") if 0 <= t < self.vocab],
            cache_salt=salt,
            output_mode=mode,
            request_id=request_id,
            read_cache=not skip_cache and prompt_logprobs is None,
        )

    def _model(self, b: Fields) -> str | None:
        model = b.str("model")
        if model is not None and model != self.served:
            raise not_served(model, self.served)
        return model

    @staticmethod
    def _openai_salt(b: Fields) -> str | None:
        """`cache_salt`, or NVIDIA Dynamo's `nvext.cache_salt` (CoreWeave's gateway)."""
        salt = b.str("cache_salt")
        return salt if salt is not None else b.object("nvext").str("cache_salt")

    def _salt(self, b: Fields) -> str | None:
        salt = b.str("cache_salt")
        if salt is not None and len(salt) > 1024:
            raise invalid("body.cache_salt", "string_too_long", "String should have at most 1024 characters", salt)
        return salt

    def _logprobs(self, b: Fields, name: str, prompt: bool = False) -> int | None:
        n = b.int(name)
        if n is None:
            return None
        if n < 0 and n != -1:
            raise rejected(f"`{name}` must be a positive value or -1.", name, n)
        self._logprob_count(n, name, "prompt" if prompt else "sample")
        return n

    def _logprob_count(self, n: int, name: str, what: str) -> None:
        wanted = self.vocab if n == -1 else n
        if wanted > MAX_LOGPROBS:
            raise rejected(
                f"Requested {what} logprobs of {wanted}, which is greater than max allowed: {MAX_LOGPROBS}",
                name,
                wanted,
            )

    def _ids(self, ids: list[Any], loc: str) -> list[int]:
        if len(ids) > self.max_context:  # checked before the walk below: a huge list is refused at once
            raise rejected(
                f"This model's maximum context length is {self.max_context} tokens. However, your prompt "
                f"contains {len(ids)} input tokens, which exceeds this limit even without any output "
                "tokens. Please reduce the length of the input prompt.",
                "input_tokens",
                len(ids),
            )
        for i, t in enumerate(ids):
            if not isinstance(t, int) or isinstance(t, bool):
                raise invalid(f"{loc}.{i}", "int_type", "Input should be a valid integer", t)
        low, high = min(ids), max(ids)
        if low < 0:
            raise rejected(f"Token id {low} is out of vocabulary")
        if high >= self.vocab:
            raise rejected(f"Token id {high} is out of vocabulary")
        return [int(t) for t in ids]

    def _prompt(self, b: Fields) -> tuple[list[int], str]:
        prompt = b.doc.get("prompt")
        if prompt is None or prompt == "":
            raise invalid(
                "body",
                "value_error",
                "Value error, Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
                b.doc,
            )
        if isinstance(prompt, str):
            bound = self.text.bytes_bound(self.max_context)
            if bound is not None and (len(prompt) > bound or utf8_length(prompt) > bound):
                raise rejected(
                    f"This model's maximum context length is {self.max_context} tokens. However, your "
                    f"prompt contains {len(prompt)} characters (more than {bound} characters, which is the "
                    f"upper bound for {self.max_context} input tokens). Please reduce the length of the "
                    "input prompt.",
                    "input_text",
                    len(prompt),
                )
            return self.text.encode(prompt), prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            ids = self._ids(prompt, "body.prompt")
            return ids, self.text.decode(ids)
        if isinstance(prompt, list) and prompt:
            raise rejected("several prompts in one request are not implemented by the reference deployment", "prompt")
        raise invalid("body.prompt", "string_type", "Input should be a valid string", prompt)

    def _chat_prompt(self, b: Fields) -> list[int]:
        messages = b.doc.get("messages")
        if not isinstance(messages, list) or not messages:
            raise invalid("body.messages", "list_type", "Input should be a valid list", messages)
        if len(messages) > 4096:
            raise rejected(f"messages: {len(messages)} messages; at most 4096", "messages")
        plain = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise invalid(f"body.messages.{i}", "model_type", "Input should be a valid message with a role", m)
            content = m.get("content")
            if isinstance(content, list):  # text parts
                if not all(
                    isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
                ):
                    raise rejected("only text content parts are implemented by the reference deployment", "messages")
                content = "".join(p["text"] for p in content)
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise invalid(f"body.messages.{i}.content", "string_type", "Input should be a valid string", content)
            plain.append({"role": m["role"], "content": content})
        try:
            return chat_prompt(plain, self.text, self.max_context, self.text.bytes_bound(self.max_context))
        except BadRequest as e:
            raise rejected(str(e), "messages") from None
