"""A completion's answer in the contract's terms: the policy version of every chunk, the logprobs
entries, routing matrices as arrays, usage, and cached tokens from every channel."""

from __future__ import annotations

import base64
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_rlrollout.remote.secret import Secret

EXCERPT = 400  # characters of a body kept as evidence


@dataclass(frozen=True)
class Exchange:
    """One request and its answer, as evidence: method, path, status (or the transport error)
    and the first characters of both bodies, the API key replaced. Never a header."""

    method: str
    path: str
    status: int | str
    request: str
    response: str

    def text(self) -> str:
        return f"{self.method} {self.path} -> {self.status}\n  sent: {self.request}\n  answer: {self.response}"

    @classmethod
    def of(cls, method: str, path: str, status: int | str, request: str, response: str, key: Secret | str) -> Exchange:
        return cls(method, path, status, excerpt(request, key), excerpt(response, key))


def excerpt(text: str, key: Secret | str, n: int = EXCERPT) -> str:
    """The first `n` characters of `text`, the key replaced first (no prefix of it is left at the cut)."""
    return Secret(key).excerpt(text, n)


# What `json.loads` makes of a JSON text costs, at most (measured on the worst shapes, with the
# parser's transient copies): per character that opens an array or an object (an empty list
# and its slot in its parent), per comma (a number and its slot), per quote that is not escaped
# (half a string's header, or a key's entry); and per character of the text, 2 bytes (its decoded copy and the
# strings parsed from it), 8 when it is not plain ASCII (one escaped astral character makes a
# whole string 4 bytes wide, and the parser holds it twice while it joins it).
PER_CONTAINER, PER_COMMA, PER_QUOTE, PER_PLAIN, PER_WIDE = 96, 40, 64, 2, 8


def parsed_size(text: str | bytes) -> int:
    """An upper estimate of the bytes `text` and what `json.loads` makes of it take in memory,
    from a few counts done in C: an answer is weighed before it is parsed, so a small one that
    would parse into a great many objects is refused instead."""
    if isinstance(text, str):
        held = sys.getsizeof(text)
        marks = (text.count("["), text.count("{"), text.count(","), text.count('"') - text.count('\\"'))
        plain = text.isascii() and "\\u" not in text
    else:
        held = len(text)
        marks = (text.count(b"["), text.count(b"{"), text.count(b","), text.count(b'"') - text.count(b'\\"'))
        plain = text.isascii() and b"\\u" not in text
    opened, commas, quotes = marks[0] + marks[1], marks[2], marks[3]
    strings = (PER_PLAIN if plain else PER_WIDE) * len(text)
    return held + strings + PER_CONTAINER * opened + PER_COMMA * commas + PER_QUOTE * quotes


def json_object(response: Any) -> dict[str, Any] | None:
    """A response's body as a JSON object, or None when it is not one (nested deeper than the
    parser goes included: RecursionError)."""
    try:
        doc = response.json()
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


class Reading:
    """Where an engine's answers carry what the contract talks about: the policy version of each
    chunk and the logprobs entries (`token`, `logprob`, `token_id`, ...). This one reads the
    contract's own wire (Fireworks: `model@identity` per chunk, `logprobs.content[]`); a driver
    whose engine says the same things elsewhere hands its streams a reading of its own. A
    reading only re-shapes what the answer holds: it never fills in what is missing."""

    # Versions said once per stream, as spans over token indices (not per chunk as it is sent):
    # a chunk's arrival does not date its tokens, so a swap within a stream is dated otherwise.
    spans_only = False

    def versions(self, chunks: list[dict[str, Any]]) -> list[str | None]:
        return policy_versions(chunks)

    def entries(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return logprob_entries(chunks)

    def spans(self, chunks: list[dict[str, Any]]) -> list[Any] | None:
        """The policy versions as spans over the output tokens, as the engine sent them (VER-SPAN-1);
        None when the engine says versions otherwise (per chunk), or not at all."""
        return None

    def choice_field(self, chunks: list[dict[str, Any]], name: str) -> Any:
        """The last non-null value of a choice's field across the chunks (None when absent)."""
        values = [
            c[name]
            for chunk in chunks
            for c in _list(chunk.get("choices"))
            if isinstance(c, dict) and c.get(name) is not None
        ]
        return values[-1] if values else None

    def chunk(self, doc: dict[str, Any], before: list[dict[str, Any]]) -> dict[str, Any]:
        """A chunk as it arrived, laid out as the contract's chunks are (`choices`, `usage`),
        given the chunks before it: for an engine whose native answers have no choices (SGLang's
        /generate). It adds keys and keeps the engine's own, never invents a value."""
        return doc


CONTRACT_READING = Reading()
# the contract's name for the replica that served an answer (a fleet's drivers name the engine here)
REPLICA_HEADER = "fireworks-backend-host"


@dataclass
class Stream:
    """A parsed completion stream (a non-streaming body is one chunk)."""

    status: int
    headers: dict[str, str]
    chunks: list[dict[str, Any]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # the raw SSE events, [DONE] included
    done: bool = False  # ended with data: [DONE]
    unterminated: bool = False  # the last event was not ended by a blank line
    body: str = ""  # the response text (non-streaming answers and refusals)
    problems: list[str] = field(default_factory=list)  # what did not parse
    reading: Reading = field(default=CONTRACT_READING, repr=False, compare=False)

    def __repr__(self) -> str:  # what an assertion about a stream shows: not every chunk
        return f"Stream(HTTP {self.status}, {len(self.chunks)} chunks, done={self.done}, {len(self.problems)} problems)"

    @property
    def ok(self) -> bool:
        """HTTP 200, and everything parsed."""
        return self.status == 200 and not self.problems

    def expect_ok(self, what: str = "the completion") -> Stream:
        """Self, or an AssertionError that shows the answer (status, body, what did not parse)."""
        if not self.ok:
            shown = "; ".join(self.problems) or f"HTTP {self.status}: {self.body[:EXCERPT]!r}"
            raise AssertionError(f"{what} was not answered: {shown}")
        return self

    def choices(self) -> list[dict[str, Any]]:
        """Every choice of every chunk (a chunk may have none: a usage-only chunk)."""
        return [c for chunk in self.chunks for c in _list(chunk.get("choices")) if isinstance(c, dict)]

    def choice_field(self, name: str) -> Any:
        """The last non-null value of a choice's field across the chunks (None when absent; an
        engine may say it beside the choices: see `Reading`)."""
        return self.reading.choice_field(self.chunks, name)

    @property
    def replica(self) -> str | None:
        """The replica that served the answer, where the deployment names it."""
        return self.headers.get(REPLICA_HEADER)

    @property
    def versions(self) -> list[str | None]:
        """The policy version of every chunk (the `@identity` suffix on the contract's wire);
        None where a chunk has none."""
        return self.reading.versions(self.chunks)

    @property
    def spans(self) -> list[Any] | None:
        """The policy-version spans the engine sent, as it sent them; None where it sends none."""
        return self.reading.spans(self.chunks)

    @property
    def entries(self) -> list[dict[str, Any]]:
        """Every logprobs entry (`logprobs.content[]` on the contract's wire), in order."""
        return self.reading.entries(self.chunks)

    @property
    def final(self) -> dict[str, Any]:
        """The chunk that carries the finish_reason (the last chunk if none does)."""
        finishing = [c for c in self.chunks if any(_finishes(ch) for ch in _list(c.get("choices")))]
        return finishing[-1] if finishing else self.chunks[-1] if self.chunks else {}

    @property
    def finish_reason(self) -> Any:
        """As the deployment sent it: a string in a sound answer, whatever it was in another."""
        return self.choice_field("finish_reason")

    @property
    def usage(self) -> dict[str, Any] | None:
        """The last non-null usage. (The official SDK keeps the last chunk carrying the key, so a
        trailing 'usage': null erases it there: INF-SSE-1 checks for that on its own.)"""
        usage = None
        for c in self.chunks:
            if c.get("usage") is not None:
                usage = c["usage"]
        return usage

    @property
    def cached(self) -> int | None:
        """Cached prompt tokens from the first channel that reports them (CACHE-RPT-1 judges
        whether the channels agree); None when none does."""
        return next((v for v in self.cached_tokens().values() if v is not None), None)

    def cached_tokens(self) -> dict[str, int | None]:
        """Cached prompt tokens per channel: usage, header, perf_metrics (None where absent)."""
        usage = self.usage if isinstance(self.usage, dict) else {}
        perf: dict[str, Any] = next(
            (c["perf_metrics"] for c in reversed(self.chunks) if isinstance(c.get("perf_metrics"), dict)), {}
        )
        header = self.headers.get("fireworks-cached-prompt-tokens")
        return {
            "usage": _int(as_object(usage.get("prompt_tokens_details")).get("cached_tokens")),
            "header": int(header) if header is not None and header.isascii() and header.isdigit() else None,
            "perf_metrics": _int(perf.get("cached-prompt-tokens")),
        }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _finishes(choice: Any) -> bool:
    """A choice that says why its stream ended."""
    return isinstance(choice, dict) and bool(choice.get("finish_reason"))


def _list(value: Any) -> list[Any]:
    """`value` when it is a JSON array, else []: a chunk of the wrong shape reads as empty."""
    return value if isinstance(value, list) else []


def as_object(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else {}: a field of the wrong shape reads as empty."""
    return value if isinstance(value, dict) else {}


def policy_versions(chunks: list[dict[str, Any]]) -> list[str | None]:
    """The `@identity` suffix of each chunk's `model`; None where a chunk has none."""
    models = [m if isinstance(m := c.get("model"), str) else "" for c in chunks]
    return [m.rpartition("@")[2] if "@" in m else None for m in models]


def logprob_entries(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every logprobs.content entry of `chunks`, in order (entries that are not objects left out)."""
    out = []
    for c in chunks:
        for choice in _list(c.get("choices")):
            logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
            content = logprobs.get("content") if isinstance(logprobs, dict) else None
            out += [e for e in content or [] if isinstance(e, dict)] if isinstance(content, list) else []
    return out


def routing_matrix(entry: dict[str, Any], layers: int, k: int) -> np.ndarray:
    """An entry's routing_matrix as a [layers, k] uint8 array; ValueError when the size is wrong."""
    raw = base64.b64decode(entry["routing_matrix"], validate=True)
    if len(raw) != layers * k:
        raise ValueError(f"routing_matrix holds {len(raw)} bytes, expected L*k = {layers}*{k} = {layers * k}")
    return np.frombuffer(raw, dtype=np.uint8).reshape(layers, k)


def span_version(spans: list[Any], token: int) -> Any:
    """The version the spans give output token `token` (None where no span covers it)."""
    for span in spans:
        span = as_object(span)
        start, end = span.get("start"), span.get("end")
        if isinstance(start, int) and isinstance(end, int) and start <= token < end:
            return span.get("version")
    return None


def span_problems(spans: Any, tokens: int) -> list[str]:
    """What keeps `spans` from covering `tokens` output tokens exactly once (VER-SPAN-1): a list
    of `{version, start, end}` objects, ordered, contiguous, half-open `[start, end)` from 0 to
    `tokens`, each with a string version and at least one token; none at all for no tokens."""
    if not isinstance(spans, list):
        return [f"the spans are {type(spans).__name__}, not a list"]
    if tokens == 0:
        return [f"{len(spans)} spans for no output token"] if spans else []
    problems, at = [], 0
    for i, span in enumerate(spans):
        span = as_object(span)
        start, end, version = span.get("start"), span.get("end"), span.get("version")
        if not isinstance(version, str) or not (isinstance(start, int) and isinstance(end, int)):
            problems.append(f"span {i} is not {{version: str, start: int, end: int}}: {span}")
            return problems
        if start != at:
            problems.append(f"span {i} starts at {start}, not at {at} ({'a gap' if start > at else 'an overlap'})")
        if end <= start:
            problems.append(f"span {i} is empty or backwards: [{start}, {end})")
        at = max(at, end)
    if at != tokens:
        problems.append(f"the spans end at {at}, the output has {tokens} tokens")
    return problems
