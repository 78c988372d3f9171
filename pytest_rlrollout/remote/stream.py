"""A completion's answer in the contract's terms: the policy version of every chunk, the logprobs
entries, routing matrices as arrays, usage, and cached tokens from every channel."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    def of(cls, method: str, path: str, status: int | str, request: str, response: str, key: str) -> Exchange:
        return cls(method, path, status, redact(request, key)[:EXCERPT], redact(response, key)[:EXCERPT])


def redact(text: str, key: str) -> str:
    """`text` with the API key replaced (a key of a few characters could be anything: kept out too)."""
    return text.replace(key, "<key>") if key else text


def json_object(response: Any) -> dict[str, Any] | None:
    """A response's body as a JSON object, or None when it is not one."""
    try:
        doc = response.json()
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


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
        return [c for chunk in self.chunks for c in (chunk.get("choices") or []) if isinstance(c, dict)]

    def choice_field(self, name: str) -> Any:
        """The last non-null value of a choice's field across the chunks (None when absent)."""
        values = [c[name] for c in self.choices() if c.get(name) is not None]
        return values[-1] if values else None

    @property
    def versions(self) -> list[str | None]:
        """The policy version (`@identity` suffix) of every chunk; None where a chunk has none."""
        return policy_versions(self.chunks)

    @property
    def entries(self) -> list[dict[str, Any]]:
        """Every logprobs.content entry, in order."""
        return logprob_entries(self.chunks)

    @property
    def final(self) -> dict[str, Any]:
        """The chunk that carries the finish_reason (the last chunk if none does)."""
        for c in reversed(self.chunks):
            if any(isinstance(ch, dict) and ch.get("finish_reason") for ch in c.get("choices") or []):
                return c
        return self.chunks[-1] if self.chunks else {}

    @property
    def finish_reason(self) -> str | None:
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
        perf = next((c["perf_metrics"] for c in reversed(self.chunks) if isinstance(c.get("perf_metrics"), dict)), {})
        header = self.headers.get("fireworks-cached-prompt-tokens")
        return {
            "usage": _int((usage.get("prompt_tokens_details") or {}).get("cached_tokens")),
            "header": int(header) if header is not None and header.isdigit() else None,
            "perf_metrics": _int(perf.get("cached-prompt-tokens")),
        }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def policy_versions(chunks: list[dict[str, Any]]) -> list[str | None]:
    """The `@identity` suffix of each chunk's `model`; None where a chunk has none."""
    models = [c.get("model") if isinstance(c.get("model"), str) else "" for c in chunks]
    return [m.rpartition("@")[2] if "@" in m else None for m in models]


def logprob_entries(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every logprobs.content entry of `chunks`, in order (entries that are not objects left out)."""
    out = []
    for c in chunks:
        for choice in c.get("choices") or []:
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
