"""Fingerprints: which weights a deployment serves, told by their numbers rather than its labels.

A fingerprint is the prompt logprobs of a fixed canary set of token sequences, scored by the
deployment itself (`echo`, `max_tokens` 1: one prefill per sequence, nothing decoded worth
mentioning). Every probe carries a prompt-cache isolation key no request used before, so no KV
computed under other weights can take part. Two fingerprints are the same weights when no
logprob differs by more than a tolerance: real kernels are not bitwise stable.

Replicas are told apart by the `fireworks-backend-host` header; each is reached through a
session key that routes to it (found with one-token probes, which cost far less than a
fingerprint).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_rlrollout.remote.drivers import Driver
    from pytest_rlrollout.remote.stream import Stream

SEQUENCES, TOKENS = 4, 32  # the canary set: 4 sequences of 32 tokens (124 scored logprobs)
FIRST_ID, TOP_ID = 10, 500  # token ids drawn from [10, min(vocab, 500)): no special tokens
ISOLATION = "x-prompt-cache-isolation-key"
MAX_SESSIONS_PER_REPLICA = 8  # session keys tried to reach each replica before giving up


class FingerprintError(ValueError):
    """The deployment's answer cannot be read as a fingerprint (what is wrong, and which request)."""


ECHO = {"max_tokens": 1, "temperature": 0, "echo": True, "logprobs": True}  # a prompt scored by the deployment


def prompt_logprobs(stream: Stream, n: int) -> list[float]:
    """The logprob of each of the `n` prompt tokens after the first, from an answer to a request
    with ECHO; FingerprintError saying what the answer lacks."""
    entries = stream.entries
    if len(entries) < n:
        raise FingerprintError(f"echo returned {len(entries)} entries for {n} prompt tokens")
    out = []
    for e in entries[1:n]:
        lp = e.get("logprob")
        if not isinstance(lp, int | float) or isinstance(lp, bool):
            raise FingerprintError(f"an echoed entry carries logprob {lp!r}")
        out.append(float(lp))
    return out


def largest_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, int]:
    """The largest |a[i] − b[i]| and its index (the first of equals); inf at the first NaN."""
    worst = (0.0, 0)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        d = abs(x - y)
        if math.isnan(d):
            return math.inf, i
        if d > worst[0]:
            worst = (d, i)
    return worst


def canary(vocab: int | None = None, sequences: int = SEQUENCES, tokens: int = TOKENS) -> list[list[int]]:
    """The fixed canary set: the same token ids in every run, so fingerprints of one model compare
    across runs and tools."""
    top = min(vocab or TOP_ID, TOP_ID)
    out = []
    for s in range(sequences):
        ids: list[int] = []
        block = 0
        while len(ids) < tokens:
            digest = hashlib.sha256(f"rlrollout-canary/{s}/{block}".encode()).digest()
            ids += [FIRST_ID + int.from_bytes(digest[i : i + 2], "little") % (top - FIRST_ID) for i in range(0, 32, 2)]
            block += 1
        out.append(ids[:tokens])
    return out


@dataclass(frozen=True)
class Fingerprint:
    """Per canary sequence, the logprob of each token after the first, as the deployment scored it."""

    logprobs: tuple[tuple[float, ...], ...]
    host: str | None = None  # the replica that answered (fireworks-backend-host), when it says
    requests: int = 0
    tokens: int = 0  # prompt tokens sent

    @classmethod
    def of(cls, rows: Iterable[Iterable[float]]) -> Fingerprint:
        """A fingerprint from its numbers alone (one row per canary sequence), as recorded."""
        return cls(tuple(tuple(row) for row in rows))

    def distance(self, other: Fingerprint) -> float:
        """The largest |Δlogprob| between the two; inf when they do not line up or hold a NaN."""
        return self.farthest(other)[0]

    def farthest(self, other: Fingerprint) -> tuple[float, int, int]:
        """(the largest |Δlogprob|, the canary sequence and the token position where it is)."""
        if [len(s) for s in self.logprobs] != [len(s) for s in other.logprobs]:
            return math.inf, 0, 0
        worst = (0.0, 0, 0)
        for s, (a, b) in enumerate(zip(self.logprobs, other.logprobs, strict=True)):
            d, i = largest_difference(a, b)
            if d > worst[0]:
                worst = (d, s, i + 1)
            if d == math.inf:
                break
        return worst

    def describe(self, other: Fingerprint) -> str:
        d, s, i = self.farthest(other)
        return f"max |Δlogprob| {d:.3g} (canary {s}, token {i})"

    def same(self, other: Fingerprint, tolerance: float) -> bool:
        return self.distance(other) <= tolerance


def fingerprint(
    driver: Driver,
    isolation: str,
    *,
    headers: dict[str, str] | None = None,
    sequences: Iterable[list[int]] | None = None,
    vocab: int | None = None,
) -> Fingerprint:
    """Score the canary set on the deployment (one request per sequence, on whatever replica the
    headers route to); `isolation` must be a key no request used before."""
    rows, hosts, sent = [], set(), 0
    sequences = list(sequences) if sequences is not None else canary(vocab)
    for i, ids in enumerate(sequences):
        s = driver.complete({"prompt": ids, **ECHO}, headers={**(headers or {}), ISOLATION: f"{isolation}-{i}"})
        if not s.ok:
            raise FingerprintError(f"canary {i}: HTTP {s.status}: {s.body[:200]}")
        try:
            row = prompt_logprobs(s, len(ids))
        except FingerprintError as e:
            raise FingerprintError(f"canary {i}: {e}") from None
        echoed = [e.get("token_id") for e in s.entries[: len(ids)]]
        if any(t is not None for t in echoed) and echoed != ids:
            raise FingerprintError(f"canary {i}: the echoed tokens {echoed[:8]}… are not the prompt {ids[:8]}…")
        rows.append(tuple(row))
        hosts.add(s.replica)
        sent += len(ids)
    host = hosts.pop() if len(hosts) == 1 else None
    return Fingerprint(tuple(rows), host, len(rows), sent)


@dataclass
class Sweep:
    """One fingerprint per replica reached, keyed by the replica's name (or by the session key
    when the deployment does not name its replicas)."""

    prints: dict[str, Fingerprint] = field(default_factory=dict)
    sessions: dict[str, str] = field(default_factory=dict)  # replica -> the session key that reached it
    named: bool = True  # replicas named by fireworks-backend-host
    probes: int = 0  # one-token requests spent finding the replicas

    @property
    def requests(self) -> int:
        return self.probes + sum(f.requests for f in self.prints.values())

    @property
    def tokens(self) -> int:
        return self.probes + sum(f.tokens for f in self.prints.values())

    def worst(self, reference: Fingerprint) -> tuple[str, float]:
        """The replica farthest from `reference`, and how far."""
        return max(((r, f.distance(reference)) for r, f in self.prints.items()), key=lambda x: x[1])


def sessions_by_replica(
    driver: Driver, replicas: int, key: Callable[[int], str], *, known: dict[str, str] | None = None
) -> tuple[dict[str, str], bool, int]:
    """A session key reaching each replica (`key(n)` makes the n-th candidate): one-token probes
    until `replicas` hosts answered or the candidates run out. Returns (replica -> session key,
    whether replicas are named, probes sent). Without the host header, `replicas` session keys
    stand for the replicas: affinity spreads them, nothing proves it."""
    found = dict(known or {})
    probes = 0
    for n in range(replicas * MAX_SESSIONS_PER_REPLICA):
        if len(found) >= replicas:
            break
        session = key(n)
        s = driver.complete(
            {"prompt": [FIRST_ID], "max_tokens": 1, "temperature": 0}, headers={"x-multi-turn-session-id": session}
        )
        probes += 1
        host = s.replica
        if host is None:
            return {f"session {key(i)}": key(i) for i in range(replicas)}, False, probes
        found.setdefault(host, session)
    return found, True, probes


def sweep(
    driver: Driver,
    replicas: int,
    isolation: str,
    *,
    key: Callable[[int], str],
    sessions: dict[str, str] | None = None,
    vocab: int | None = None,
) -> Sweep:
    """Fingerprint every replica: `sessions` (from an earlier sweep) are reused, so a replica is
    compared with itself across a swap."""
    reached, named, probes = sessions_by_replica(driver, replicas, key, known=sessions)
    out = Sweep(sessions=reached, named=named, probes=probes)
    for n, (replica, session) in enumerate(sorted(reached.items())):
        out.prints[replica] = fingerprint(
            driver, f"{isolation}-r{n}", vocab=vocab, headers={"x-multi-turn-session-id": session}
        )
    return out


@dataclass(frozen=True)
class Continuation:
    """A prompt's greedy continuation as the deployment decoded it: what a rollout's numbers are."""

    tokens: tuple[int | None, ...]
    logprobs: tuple[float, ...]
    cached: int  # prompt tokens the deployment reported served from its cache

    def difference(self, other: Continuation) -> tuple[float, str]:
        """The largest |Δlogprob| between the two, and where; inf where the greedy tokens part
        (a different token is a different number, whatever its logprob)."""
        for i, (a, b) in enumerate(zip(self.tokens, other.tokens, strict=False)):
            if a != b:
                return math.inf, f"the greedy tokens part at token {i} ({a} vs {b})"
        d, i = largest_difference(self.logprobs[: len(other.logprobs)], other.logprobs[: len(self.logprobs)])
        return d, f"max |Δlogprob| {d:.3g} at generated token {i}"


CONTINUED = 4  # generated tokens a continuation compares


def continuation(driver: Driver, ids: list[int], headers: dict[str, str]) -> Continuation:
    """Decode a few greedy tokens after `ids` with their logprobs; FingerprintError when the answer
    lacks them. Unlike an echo, this reads a cached prefix the way a rollout does (an engine may
    score prompts without its prefix cache)."""
    s = driver.complete(
        {"prompt": ids, "max_tokens": CONTINUED, "temperature": 0, "logprobs": True, "ignore_eos": True},
        headers=headers,
    )
    if not s.ok:
        raise FingerprintError(f"HTTP {s.status}: {s.body[:200]}")
    entries = s.entries
    values = [float(x) for e in entries if isinstance(x := e.get("logprob"), int | float) and not isinstance(x, bool)]
    if not entries or len(values) != len(entries):
        raise FingerprintError(f"{len(entries)} logprobs entries, not each with a numeric logprob")
    return Continuation(tuple(e.get("token_id") for e in entries), tuple(values), s.cached or 0)
