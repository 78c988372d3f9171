"""SGLang's native wire, as SGLang's sources publish it (see `drivers.sglang`): a contract
completion as a `/generate` body, and its answers (`meta_info`: the label, the spans of the output,
the token logprobs, the routed experts) read in the contract's terms. The driver sends; this reads."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_rlrollout.contract.moe import moe_layers
from pytest_rlrollout.remote.openai_wire import OpenAIReading, as_list, lay_routing, token_prompt
from pytest_rlrollout.remote.stream import as_object

GENERATE = "/generate"
COMPLETION_MAX_TOKENS = 16  # the contract's (OpenAI's) default; SGLang's native default is 128


def meta_info(chunk: dict[str, Any]) -> dict[str, Any]:
    return as_object(chunk.get("meta_info"))


def _grown(now: Any, before: Any) -> Any:
    """What `now` adds to `before` (SGLang repeats the output so far), or `now` when it does not
    extend it (a server run with --incremental-streaming-output sends only what is new)."""
    if isinstance(now, list | str) and isinstance(before, type(now)) and now[: len(before)] == before:
        return now[len(before) :]
    return now


def _entries(rows: Any) -> list[dict[str, Any]]:
    """`[[logprob, id, text], ...]` as the contract's entries (what a row does not say is left out)."""
    out = []
    for row in as_list(rows):
        row = as_list(row)
        if len(row) < 2:
            continue
        entry: dict[str, Any] = {"logprob": row[0], "token_id": row[1]}
        if len(row) > 2 and isinstance(row[2], str):
            entry["token"] = row[2]
        out.append(entry)
    return out


def moe_columns(config: Mapping[str, Any] | None, width: int | None) -> tuple[int, ...] | None:
    """The values of a routed_experts row that belong to MoE layers, when the row covers every
    hidden layer (SGLang's capture buffer is num_hidden_layers deep; a dense layer routes nothing
    and its values stay 0); None when the config is unknown or the row has another width."""
    layers = moe_layers(config or {})
    if not config or not layers or width is None:
        return None
    hidden, k = config.get("num_hidden_layers"), config.get("num_experts_per_tok")
    if not isinstance(hidden, int) or not isinstance(k, int) or width != hidden * k or len(layers) == hidden:
        return None
    return tuple(layer * k + j for layer in layers for j in range(k))


def routed_rows(value: Any, width: int | None) -> np.ndarray | None:
    """SGLang's routed_experts, base64 of int32 with no header, as rows of `width` (layers * k)
    values, one per fed position; None when absent, when the width is unknown, or when the array
    does not split into such rows. The array names no shape: the width is measured once
    (`SGLangDriver.row_width`), and the rows are laid from the last fed position backwards, so an
    array that leaves positions out shows as entries without routing."""
    if not isinstance(value, str) or not width:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        return None
    if not raw or len(raw) % (4 * width):
        return None
    return np.frombuffer(raw, dtype="<i4").reshape(-1, width)


@dataclass(frozen=True)
class SGLangReading(OpenAIReading):
    """Where SGLang's native answers say what the contract talks about (see the module's doc):
    chunks laid out with `choices` and `usage`; entries from the last chunk's cumulative
    `input_token_logprobs` and `output_token_logprobs`; versions from the finished chunk's spans,
    else each chunk's `weight_version`. `width`: the values of one routed_experts row; `keep`:
    those of MoE layers, where the row covers dense layers too (the matrices are the MoE layers')."""

    width: int | None = None
    keep: tuple[int, ...] | None = None

    def chunk(self, doc: dict[str, Any], before: list[dict[str, Any]]) -> dict[str, Any]:
        if "meta_info" not in doc or "choices" in doc:
            return doc  # an error, or an OpenAI route's answer
        meta, last = meta_info(doc), before[-1] if before else {}
        finish = as_object(meta.get("finish_reason")).get("type") if meta.get("finish_reason") is not None else None
        choice: dict[str, Any] = {
            "index": 0,
            "text": _grown(doc.get("text"), last.get("text")),
            "token_ids": _grown(doc.get("output_ids"), last.get("output_ids")),
            "finish_reason": finish,
        }
        if "weight_versions" in meta:
            choice["weight_versions"] = meta["weight_versions"]
        out = doc | {"choices": [choice]}
        if finish is not None:
            usage: dict[str, Any] = {k: meta[k] for k in ("prompt_tokens", "completion_tokens") if k in meta}
            if all(isinstance(usage.get(k), int) for k in ("prompt_tokens", "completion_tokens")):
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            if "cached_tokens" in meta:
                usage["prompt_tokens_details"] = {"cached_tokens": meta["cached_tokens"]}
            out["usage"] = usage
        return out

    def versions(self, chunks: list[dict[str, Any]]) -> list[str | None]:
        if self.spans(chunks) is not None:
            return super().versions(chunks)
        out = []
        for chunk in chunks:
            label = meta_info(chunk).get("weight_version")
            out.append(label if isinstance(label, str) else None)
        return out

    def entries(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not any("meta_info" in c for c in chunks):
            return super().entries(chunks)  # an OpenAI route's answer
        meta = next((meta_info(c) for c in reversed(chunks) if "meta_info" in c), {})
        prompt = next((c["prompt_token_ids"] for c in chunks if isinstance(c.get("prompt_token_ids"), list)), None)
        scored = _entries(meta.get("input_token_logprobs"))
        if not scored and self.echo and prompt is not None:
            scored = [{"token_id": token} for token in prompt]
        out = scored + _entries(meta.get("output_token_logprobs"))
        generated = sum(len(as_list(c["choices"][0].get("token_ids"))) for c in chunks if c.get("choices"))
        size = meta.get("prompt_tokens")
        rows = routed_rows(meta.get("routed_experts"), self.width)
        if rows is not None and self.keep is not None:
            rows = rows[:, list(self.keep)]
        if rows is not None and isinstance(size, int) and 0 < generated <= len(out):
            lay_routing(out, rows, size, generated)
        return out


SGLANG_READING = SGLangReading()


def native_body(body: dict[str, Any], salt: str | None) -> dict[str, Any]:
    """A contract completion body on SGLang's native /generate (see the module's doc)."""
    prompt = body.get("prompt")
    out: dict[str, Any] = {"input_ids" if token_prompt(prompt) else "text": prompt, "return_prompt_token_ids": True}
    params = {"max_new_tokens": body.get("max_tokens", COMPLETION_MAX_TOKENS)}
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("seed", "sampling_seed"),
        ("stop", "stop"),
        ("stop_token_ids", "stop_token_ids"),
        ("ignore_eos", "ignore_eos"),
        ("n", "n"),
    ):
        if body.get(ours) is not None:
            params[theirs] = body[ours]
    out["sampling_params"] = params
    if body.get("logprobs"):
        out["return_logprob"] = True
        out["return_text_in_logprobs"] = True
        out["top_logprobs_num"] = (body.get("top_logprobs") or 0) if body["logprobs"] is True else body["logprobs"]
        # scoring the prompt skips the cache for it: a streamed echo gets the prompt's ids alone
        out["logprob_start_len"] = 0 if body.get("echo") and not body.get("stream") else -1
    if body.get("include_routing_matrix"):
        out["return_routed_experts"] = True
    if body.get("stream"):
        out["stream"] = True
    if salt is not None:
        out["cache_salt"] = salt
    if body.get("request_id") is not None:
        out["rid"] = body["request_id"]
    return out
