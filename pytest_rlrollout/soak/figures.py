"""The soak's figures: what the rollout workers generated and how it felt across swaps.

Several workers' figures merge exactly, so the merged figures are the sum of the workers': counts
add, and latencies go into fixed log-spaced buckets, which add too (a quantile read from them is
known within one bucket's width, `GROWTH`). Times are seconds on the worker's own clock since the
soak started; nothing compares two workers' clocks but the tokens-per-second series, whose
one-second bins tolerate the milliseconds two clocks on one network disagree by.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from pytest_rlrollout.soak.judge import Turn

GROWTH = 1.05  # each latency bucket is 5% wider than the one below it
BIN = 5  # seconds: the latencies over time are kept per bin of this width
FLOOR = 1e-4  # seconds: the upper bound of the lowest bucket (shorter latencies land in it)


@dataclass
class Latencies:
    """Latencies in log-spaced buckets: bucket i holds (FLOOR * GROWTH**(i-1), FLOOR * GROWTH**i]."""

    buckets: Counter[int] = field(default_factory=Counter)
    count: int = 0
    max: float = 0.0  # the largest, exactly

    def add(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a latency of {seconds} s")
        self.buckets[max(0, math.ceil(math.log(seconds / FLOOR, GROWTH) - 1e-9)) if seconds > FLOOR else 0] += 1
        self.count += 1
        self.max = max(self.max, seconds)

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the q-quantile (never above the largest); None
        when nothing was added."""
        if not 0 <= q <= 1:
            raise ValueError(f"quantile {q}: between 0 and 1")
        if not self.count:
            return None
        rank, seen = max(1, math.ceil(q * self.count)), 0
        for i in sorted(self.buckets):
            seen += self.buckets[i]
            if seen >= rank:
                return min(FLOOR * GROWTH**i, self.max)
        raise AssertionError("the buckets hold fewer latencies than counted")  # pragma: no cover

    def merge(self, other: Latencies) -> Latencies:
        return Latencies(self.buckets + other.buckets, self.count + other.count, max(self.max, other.max))

    def to_json(self) -> dict[str, Any]:
        return {"buckets": {str(i): n for i, n in sorted(self.buckets.items())}, "count": self.count, "max": self.max}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Latencies:
        return cls(Counter({int(i): int(n) for i, n in doc["buckets"].items()}), int(doc["count"]), float(doc["max"]))


@dataclass(frozen=True)
class Timed:
    """A turn with its times on the worker's clock: when it was sent, and when each chunk came
    with how many tokens it carried (a chunk per entry of `turn.identities`)."""

    turn: Turn
    sent_at: float
    chunk_at: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not len(self.chunk_at) == len(self.chunk_tokens) == len(self.turn.identities):
            raise ValueError("a time and a token count for every chunk of the turn")
        if any(b < a for a, b in pairwise((self.sent_at, *self.chunk_at))):
            raise ValueError("chunks arrive in order, after the request was sent")

    def to_json(self) -> dict[str, Any]:
        return {
            "turn": self.turn.to_json(),
            "sent_at": self.sent_at,
            "chunk_at": list(self.chunk_at),
            "chunk_tokens": list(self.chunk_tokens),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Timed:
        return cls(
            Turn.from_json(doc["turn"]),
            float(doc["sent_at"]),
            tuple(map(float, doc["chunk_at"])),
            tuple(map(int, doc["chunk_tokens"])),
        )


@dataclass
class Served:
    """What one replica served (by the replica the answers named): its turns, tokens, errors, and
    how its streams felt. A fleet's engines are its replicas: these are the figures per engine."""

    turns: int = 0
    tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    ttft: Latencies = field(default_factory=Latencies)
    gap: Latencies = field(default_factory=Latencies)

    def merge(self, other: Served) -> Served:
        return Served(
            self.turns + other.turns,
            self.tokens + other.tokens,
            self.errors + other.errors,
            self.ttft.merge(other.ttft),
            self.gap.merge(other.gap),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "tokens": self.tokens,
            "errors": dict(sorted(self.errors.items())),
            "ttft": self.ttft.to_json(),
            "gap": self.gap.to_json(),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Served:
        return cls(
            int(doc["turns"]),
            int(doc["tokens"]),
            Counter(doc["errors"]),
            Latencies.from_json(doc["ttft"]),
            Latencies.from_json(doc["gap"]),
        )


@dataclass
class Figures:
    """Sessions, turns, tokens and errors; time to first token, the gaps between chunks, the
    stall each stream saw across each swap it overlapped (its longest gap, by swap), and tokens
    per second of the soak."""

    sessions: set[str] = field(default_factory=set)  # "worker/session": a session lives on one worker
    turns: int = 0
    tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # by kind: "425", "5xx", "dropped", "ended early"
    ttft: Latencies = field(default_factory=Latencies)
    gap: Latencies = field(default_factory=Latencies)
    stall: dict[int, Latencies] = field(default_factory=dict)  # by swap epoch
    per_second: Counter[int] = field(default_factory=Counter)  # tokens by whole second since the start
    ttft_at: dict[int, Latencies] = field(default_factory=dict)  # by BIN-second bin of the first chunk
    gap_at: dict[int, Latencies] = field(default_factory=dict)  # by BIN-second bin of the later chunk
    replicas: dict[str, Served] = field(default_factory=dict)  # by the replica each answer named

    def record(self, t: Timed) -> None:
        turn = t.turn
        self.sessions.add(f"{turn.worker}/{turn.session}")
        self.turns += 1
        served = None if turn.replica is None else self.replicas.setdefault(turn.replica, Served())
        kind = _error(turn)
        if served is not None:
            served.turns += 1
        if kind:
            self.errors[kind] += 1
            if served is not None:
                served.errors[kind] += 1
        if not t.chunk_at:
            return
        first = t.chunk_at[0] - t.sent_at
        gaps = [b - a for a, b in pairwise(t.chunk_at)]
        self.tokens += sum(t.chunk_tokens)
        self.ttft.add(first)
        self.ttft_at.setdefault(math.floor(t.chunk_at[0] / BIN), Latencies()).add(first)
        for g, at in zip(gaps, t.chunk_at[1:], strict=True):
            self.gap.add(g)
            self.gap_at.setdefault(math.floor(at / BIN), Latencies()).add(g)
        if served is not None:
            served.tokens += sum(t.chunk_tokens)
            served.ttft.add(first)
            for g in gaps:
                served.gap.add(g)
        for epoch in turn.overlapped():
            self.stall.setdefault(epoch, Latencies()).add(max(gaps, default=0.0))
        for at, n in zip(t.chunk_at, t.chunk_tokens, strict=True):
            self.per_second[math.floor(at)] += n

    def merge(self, other: Figures) -> Figures:
        return Figures(
            self.sessions | other.sessions,
            self.turns + other.turns,
            self.tokens + other.tokens,
            self.errors + other.errors,
            self.ttft.merge(other.ttft),
            self.gap.merge(other.gap),
            _merged(self.stall, other.stall),
            self.per_second + other.per_second,
            _merged(self.ttft_at, other.ttft_at),
            _merged(self.gap_at, other.gap_at),
            {
                r: self.replicas.get(r, Served()).merge(other.replicas.get(r, Served()))
                for r in sorted(self.replicas.keys() | other.replicas.keys())
            },
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "sessions": sorted(self.sessions),
            "turns": self.turns,
            "tokens": self.tokens,
            "errors": dict(sorted(self.errors.items())),
            "ttft": self.ttft.to_json(),
            "gap": self.gap.to_json(),
            "stall": {str(e): v.to_json() for e, v in sorted(self.stall.items())},
            "per_second": {str(s): n for s, n in sorted(self.per_second.items())},
            "ttft_at": {str(b): v.to_json() for b, v in sorted(self.ttft_at.items())},
            "gap_at": {str(b): v.to_json() for b, v in sorted(self.gap_at.items())},
            "replicas": {r: v.to_json() for r, v in sorted(self.replicas.items())},
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Figures:
        return cls(
            set(doc["sessions"]),
            int(doc["turns"]),
            int(doc["tokens"]),
            Counter(doc["errors"]),
            Latencies.from_json(doc["ttft"]),
            Latencies.from_json(doc["gap"]),
            {int(e): Latencies.from_json(v) for e, v in doc["stall"].items()},
            Counter({int(s): int(n) for s, n in doc["per_second"].items()}),
            {int(b): Latencies.from_json(v) for b, v in doc["ttft_at"].items()},
            {int(b): Latencies.from_json(v) for b, v in doc["gap_at"].items()},
            {str(r): Served.from_json(v) for r, v in doc["replicas"].items()},
        )


def _merged(a: dict[int, Latencies], b: dict[int, Latencies]) -> dict[int, Latencies]:
    return {k: a.get(k, Latencies()).merge(b.get(k, Latencies())) for k in sorted(a.keys() | b.keys())}


def _error(turn: Turn) -> str | None:
    """The kind of error a turn met, or None."""
    if turn.status == 425:
        return "425"
    if turn.status == 0:
        return "dropped"
    if turn.status >= 500:
        return "5xx"
    if turn.status != 200:
        return str(turn.status)
    return None if turn.done and turn.finish_reason else "ended early"
