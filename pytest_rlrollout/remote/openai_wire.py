"""The OpenAI wire as the self-hosted engines speak it (vLLM's OpenAI server, and SGLang's and
CoreWeave's gateway, which follow it): where their answers say what the contract talks about, the
contract's request bodies on their routes, and a one-server status from a weight-version label.
Shared by the drivers of every engine on that wire; none of them owns it."""

from __future__ import annotations

import base64
import binascii
import bisect
import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib import format as npy

from pytest_rlrollout.remote.drivers.base import Status
from pytest_rlrollout.remote.stream import Reading, as_object, json_object

if TYPE_CHECKING:
    import httpx

ISOLATION_HEADER = "x-prompt-cache-isolation-key"
# Fireworks completion extensions with no vLLM binding: not sent (vLLM ignores unknown fields, and a
# request must not look as if it had asked for something); the capability probes find them absent
UNBOUND_FIELDS = (
    "include_routing_matrix",
    "raw_output",
    "perf_metrics_in_response",
    "echo_last",
    "prompt_cache_max_len",
    "prompt_cache_isolation_key",
    "routing_matrix_format",
)


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def token_prompt(prompt: Any) -> bool:
    """Whether a completion's `prompt` is token ids (a list of ints; a bool is no token id)."""
    return isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)


def first_choice(chunk: dict[str, Any]) -> dict[str, Any]:
    """The first choice of a chunk ({} when it has none: a usage-only chunk)."""
    return as_object(next(iter(as_list(chunk.get("choices"))), None))


@dataclass(frozen=True)
class OpenAIReading(Reading):
    """Where vLLM's answers (and those of the servers that follow its wire) say what the contract talks about.

    - versions: the `weight_versions` spans of the final chunk, laid over the tokens each chunk
      carries; a chunk is the version of the last token up to and with it (a chunk before any
      token: the first span's). No spans anywhere: None for every chunk.
    - entries: the generate route's `logprobs.content[]` (token id joined from the choice's
      `token_ids` where an entry lacks it), after the prompt's entries from `prompt_logprobs`
      (`prompt_token_ids` naming each); `/v1/completions`' legacy `tokens` / `token_logprobs`
      with the ids of `prompt_token_ids` + `token_ids`; chat's `logprobs.content[]` as it is.
    - `echo` (a streamed echo on the generate route, whose stream has no field for prompt
      scores): the prompt's entries are its `prompt_token_ids`, each with its routing where
      `routed_experts` covers it, and no logprob (none was sent).
    """

    echo: bool = False
    spans_only = True  # `weight_versions` on the final chunk only

    def spans(self, chunks: list[dict[str, Any]]) -> list[Any] | None:
        for chunk in reversed(chunks):
            spans = first_choice(chunk).get("weight_versions")
            if isinstance(spans, list):
                return spans
        return None

    def versions(self, chunks: list[dict[str, Any]]) -> list[str | None]:
        spans = [as_object(s) for s in self.spans(chunks) or []]
        ends = [e for s in spans if isinstance(e := s.get("end"), int)]
        if not spans or len(ends) != len(spans):
            return [None] * len(chunks)
        out: list[str | None] = []
        seen = 0
        for chunk in chunks:
            seen += len(as_list(first_choice(chunk).get("token_ids")))
            at = bisect.bisect_right(ends, max(seen - 1, 0))  # the span whose [start, end) holds that token
            version = spans[min(at, len(spans) - 1)].get("version")
            out.append(version if isinstance(version, str) else None)
        return out

    def choice_field(self, chunks: list[dict[str, Any]], name: str) -> Any:
        """A choice's field; the generate route says `prompt_token_ids` once, beside the choices."""
        found = super().choice_field(chunks, name)
        if found is None and name == "prompt_token_ids":
            found = next((c[name] for c in chunks if c.get(name) is not None), None)
        return found

    def entries(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        prompt = self.choice_field(chunks, "prompt_token_ids")
        for chunk in chunks:
            out += _prompt_entries(chunk)
            for choice in as_list(chunk.get("choices")):
                out += _choice_entries(as_object(choice))
        if self.echo and isinstance(prompt, list) and not any(_prompt_entries(c) for c in chunks):
            out = [{"token_id": token} for token in prompt] + out
        rows = routed_experts(self.choice_field(chunks, "routed_experts"))
        generated = sum(len(as_list(first_choice(c).get("token_ids"))) for c in chunks)
        if rows is not None and isinstance(prompt, list) and 0 < generated <= len(out):
            lay_routing(out, rows, len(prompt), generated)
        return out


def _prompt_entries(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    """The generate route's prompt logprobs (top level, the first position null)."""
    scored, ids = chunk.get("prompt_logprobs"), chunk.get("prompt_token_ids")
    if not isinstance(scored, list) or not isinstance(ids, list) or len(scored) != len(ids):
        return []
    out = []
    for token, at in zip(ids, scored, strict=True):
        own = as_object(as_object(at).get(str(token)))
        out.append({"token": own.get("decoded_token"), "logprob": own.get("logprob"), "token_id": token})
    return out


def _choice_entries(choice: dict[str, Any]) -> list[dict[str, Any]]:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return []
    ids = as_list(choice.get("token_ids"))
    content = logprobs.get("content")
    if isinstance(content, list):  # the generate route and chat
        entries = [dict(e) for e in content if isinstance(e, dict)]
        if len(ids) == len(entries):
            for e, token in zip(entries, ids, strict=True):
                e.setdefault("token_id", token)
        return entries
    tokens, values = as_list(logprobs.get("tokens")), as_list(logprobs.get("token_logprobs"))
    if len(tokens) != len(values):
        return []
    known = as_list(choice.get("prompt_token_ids")) + ids  # echo: the prompt's tokens come first
    known = known if len(known) == len(tokens) else ids if len(ids) == len(tokens) else []
    return [
        {"token": t, "logprob": v, **({"token_id": known[i]} if known else {})}
        for i, (t, v) in enumerate(zip(tokens, values, strict=True))
    ]


def routed_experts(value: Any) -> np.ndarray | None:
    """`routed_experts` decoded: an integer array [positions, layers, k], or None when absent or
    not one (an answer that does not decode carries no routing, and the R3 clauses say so). The
    `.npy` header is read first and must describe exactly the bytes that follow: an answer
    cannot make this side allocate what it did not send."""
    if not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value, validate=True)
        f = io.BytesIO(raw)
        version = npy.read_magic(f)
        header = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}.get(version)
        if header is None:
            return None
        shape, fortran, dtype = header(f)
    except (ValueError, OSError, EOFError, SyntaxError, binascii.Error):
        return None
    if len(shape) != 3 or dtype.kind not in "iu" or math.prod(shape) * dtype.itemsize != len(raw) - f.tell():
        return None
    return np.frombuffer(raw, dtype=dtype, offset=f.tell()).reshape(shape, order="F" if fortran else "C")


def lay_routing(entries: list[dict[str, Any]], rows: np.ndarray, prompt: int, generated: int) -> None:
    """Put each position's row on its entries (in place): the last `generated` entries are the
    output tokens, those before them the prompt's last ones. The rows end at the position before
    the last output token (it was never fed), whatever position they start from. A row that does
    not fit uint8 is left out: the contract's matrices are uint8."""
    first = prompt + generated - 1 - len(rows)  # the position of rows[0]
    split = len(entries) - generated
    for n, e in enumerate(entries):
        position = prompt - split + n if n < split else prompt - 1 + (n - split)
        at = position - first
        if 0 <= at < len(rows) and rows[at].min() >= 0 and rows[at].max() <= 255:
            e["routing_matrix"] = base64.b64encode(rows[at].astype(np.uint8).tobytes()).decode()


def labelled_status(r: httpx.Response, route: str, replica: str) -> Status:
    """One server's status (its replica called `replica`) from the answer of the route that names
    its label (`weight_version`)."""
    doc = json_object(r) if r.status_code == 200 else None
    if doc is None:
        return Status(r, [], [f"{route}: HTTP {r.status_code}, not a JSON object: {r.text[:200]!r}"])
    label = doc.get("weight_version")
    if not isinstance(label, str):
        return Status(r, [], [f"{route}: weight_version is {label!r}, not a string"])
    state = {"stage": "ready", "target_snapshot_identity": label}
    return Status(r, [{"name": replica, "readiness": True, "current_snapshot_identity": label, "loading_state": state}])


def bound(body: dict[str, Any], headers: dict[str, str] | None) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """A contract completion without what vLLM has no binding for: the body less the Fireworks
    extensions, the headers less the isolation key, and that key (header or body field)."""
    headers = dict(headers or {})
    salt = headers.pop(ISOLATION_HEADER, None) or body.get("prompt_cache_isolation_key")
    return {k: v for k, v in body.items() if k not in UNBOUND_FIELDS}, headers, salt


def legacy_body(body: dict[str, Any]) -> dict[str, Any]:
    """A contract completion body on `/v1/completions`: logprobs as a count, ids back, usage on
    the last streamed chunk."""
    out = dict(body)
    if out.get("logprobs") is True:
        out["logprobs"] = out.pop("top_logprobs", None) or 0
    elif out.get("logprobs") is False:
        del out["logprobs"]
    out.setdefault("return_token_ids", True)
    if out.get("stream"):
        out["stream_options"] = {"include_usage": True, **as_object(out.get("stream_options"))}
    return out
