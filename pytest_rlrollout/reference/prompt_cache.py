"""A replica's prompt cache: prefix KV *and* routing kept together (R3), in blocks of tokens,
partitioned by isolation key, with the namespace rules of `reset_prompt_cache` (applied at a
swap) and a reset on request (vLLM's POST /reset_prefix_cache)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from pytest_rlrollout.reference.model import Sequence_


@dataclass
class Entry:
    tokens: np.ndarray  # the cached positions' token ids
    seq: Sequence_  # KV of those positions
    routing: np.ndarray  # [n, L, k] experts each position was routed to
    token_logprobs: np.ndarray  # [n] logprob of each token given the ones before (0 for the first)
    boundary_logits: dict[int, np.ndarray]  # logits at position b-1 for each block boundary b
    isolation: str | None
    session: str | None
    restricted: bool = False  # after a 'new_session' swap: only `session` may reuse it
    shunned: bool = False  # fault switches only: every session but `session` may reuse it
    unreported: bool = False  # FID-CACHE-1 and CTL-CACHE-1 faults only: kept across a reset, reused unannounced
    weights: int = 0  # the replica's weights generation the entry was computed on


@dataclass(frozen=True)
class Hit:
    length: int
    entry: Entry


class PromptCache:
    def __init__(self, block: int, capacity: int, faults: frozenset[str] = frozenset()):
        self.block, self.capacity, self.faults = block, capacity, faults
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()
        # bumped by every reset on request: a request computed (partly) before a reset is not
        # stored after it, or the reset would leave that KV to be reused
        self.generation = 0

    def lookup(
        self, prompt: np.ndarray, isolation: str | None, session: str | None, limit: int | None = None
    ) -> Hit | None:
        """The longest block-aligned cached prefix of `prompt` this request may reuse (at most
        `limit` tokens); at least one prompt token is always left to compute."""
        usable = (len(prompt) - 1) // self.block * self.block
        if limit is not None:
            usable = min(usable, limit // self.block * self.block)
        if usable <= 0:
            return None
        best: tuple[int, int] | None = None
        with self._lock:
            for key, e in self._entries.items():
                if e.isolation != isolation and "CACHE-ISO-1" not in self.faults:
                    continue
                if (
                    e.restricted
                    and (session is None or e.session != session)
                    # the switch asked about only here, where it changes the answer (a restricted entry)
                    and not (session is None and e.session is None and "CACHE-NOSESSION-1" in self.faults)
                ):
                    continue
                if e.shunned and session is not None and e.session == session:
                    continue
                n = min(usable, len(e.tokens))
                same = np.flatnonzero(e.tokens[:n] != prompt[:n])
                common = (int(same[0]) if len(same) else n) // self.block * self.block
                if common > 0 and common in e.boundary_logits and (best is None or common > best[0]):
                    best = (common, key)
            if best is None:
                return None
            self._entries.move_to_end(best[1])
            return Hit(best[0], self._entries[best[1]])

    def store(self, entry: Entry, generation: int) -> None:
        """Keep `entry` unless a reset came after the request started (`generation` is the
        cache's generation then): checked under the lock, so a reset is never undone."""
        if len(entry.tokens) < self.block or "CACHE-HIT-1" in self.faults:
            return
        with self._lock:
            if generation != self.generation:
                return
            self._entries[self._next] = entry
            self._next += 1
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def on_swap(self, policy: str) -> None:
        """Apply a snapshot's reset_prompt_cache policy to what was cached before it."""
        # what each policy does to earlier entries; the fault switches break one cell each
        action = {"all": "clear", "new_session": "restrict", "none": "keep"}.get(policy, "keep")
        broken = {
            ("all", "CACHE-MATRIX-ALL-SAME"): "restrict",
            ("all", "CACHE-MATRIX-ALL-NEW"): "shun",
            ("new_session", "CACHE-MATRIX-NS-SAME"): "clear",
            ("new_session", "CACHE-MATRIX-NS-NEW"): "keep",
            ("none", "CACHE-MATRIX-NONE-SAME"): "shun",
            ("none", "CACHE-MATRIX-NONE-NEW"): "restrict",
        }
        for (p, fault), act in broken.items():
            if p == policy and fault in self.faults:
                action = act
        if policy == "all" and "FID-CACHE-1" in self.faults:
            action = "hide"
        with self._lock:
            if action == "clear":
                self._entries.clear()
            for e in self._entries.values():
                e.restricted |= action == "restrict"
                e.shunned |= action == "shun"
                e.unreported |= action == "hide"

    def reset(self, weights: int) -> None:
        """Drop every entry (POST /reset_prefix_cache). `weights` is the replica's weights
        generation: the fault cells of a swap's 'all' (and FID-CACHE-1) keep what was computed on
        earlier weights, as a reset following a load would; CTL-CACHE-1 keeps everything."""
        with self._lock:
            self.generation += 1
            if "CTL-CACHE-1" in self.faults:  # the reset reports success and drops nothing
                for e in self._entries.values():
                    e.unreported = True
                return
            stale = {
                "CACHE-MATRIX-ALL-SAME": "restricted",
                "CACHE-MATRIX-ALL-NEW": "shunned",
                "FID-CACHE-1": "unreported",
            }
            kept = [flag for fault, flag in stale.items() if fault in self.faults]
            for key, e in list(self._entries.items()):
                if kept and e.weights < weights:
                    for flag in kept:
                        setattr(e, flag, True)
                else:
                    del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)
