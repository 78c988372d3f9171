"""A completion's answer in the contract's terms: the policy version of every chunk, the logprobs
entries, routing matrices as arrays, usage, and cached tokens from every channel."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Stream:
    """A parsed completion stream (a non-streaming body is one chunk)."""

    status: int
    headers: dict[str, str]
    chunks: list[dict[str, Any]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # the raw SSE events, [DONE] included
    done: bool = False  # ended with data: [DONE]
    body: str = ""  # the response text when it was not a 200 stream/body

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
            if any((choice or {}).get("finish_reason") for choice in c.get("choices") or []):
                return c
        return self.chunks[-1] if self.chunks else {}

    @property
    def finish_reason(self) -> str | None:
        for c in reversed(self.chunks):
            for choice in c.get("choices") or []:
                if choice.get("finish_reason"):
                    return choice["finish_reason"]
        return None

    @property
    def usage(self) -> dict[str, Any] | None:
        """The last non-null usage. (The official SDK keeps the last chunk carrying the key, so a
        trailing 'usage': null erases it there: INF-SSE-1 checks for that on its own.)"""
        usage = None
        for c in self.chunks:
            if c.get("usage") is not None:
                usage = c["usage"]
        return usage

    def cached_tokens(self) -> dict[str, int | None]:
        """Cached prompt tokens per channel: usage, header, perf_metrics (None where absent)."""
        usage = self.usage or {}
        perf = next((c["perf_metrics"] for c in reversed(self.chunks) if c.get("perf_metrics")), {})
        header = self.headers.get("fireworks-cached-prompt-tokens")
        return {
            "usage": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "header": int(header) if header is not None and header.isdigit() else None,
            "perf_metrics": perf.get("cached-prompt-tokens"),
        }


def policy_versions(chunks: list[dict[str, Any]]) -> list[str | None]:
    """The `@identity` suffix of each chunk's `model`; None where a chunk has none."""
    return [c.get("model", "").rpartition("@")[2] if "@" in c.get("model", "") else None for c in chunks]


def logprob_entries(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every logprobs.content entry of `chunks`, in order."""
    out = []
    for c in chunks:
        for choice in c.get("choices") or []:
            out += ((choice or {}).get("logprobs") or {}).get("content") or []
    return out


def routing_matrix(entry: dict[str, Any], layers: int, k: int) -> np.ndarray:
    """An entry's routing_matrix as a [layers, k] uint8 array; ValueError when the size is wrong."""
    raw = base64.b64decode(entry["routing_matrix"], validate=True)
    if len(raw) != layers * k:
        raise ValueError(f"routing_matrix holds {len(raw)} bytes, expected L*k = {layers}*{k} = {layers * k}")
    return np.frombuffer(raw, dtype=np.uint8).reshape(layers, k)
