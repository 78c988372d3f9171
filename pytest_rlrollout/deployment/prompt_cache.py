"""A replica's prompt cache: prefix KV *and* routing kept together (R3), in blocks of tokens,
partitioned by isolation key, with the namespace rules of `reset_prompt_cache`."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from pytest_rlrollout.engine import Sequence_


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


@dataclass(frozen=True)
class Hit:
    length: int
    entry: Entry


class PromptCache:
    def __init__(self, block: int, capacity: int):
        self.block, self.capacity = block, capacity
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()

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
                if e.isolation != isolation or (e.restricted and (session is None or e.session != session)):
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

    def store(self, entry: Entry) -> None:
        if len(entry.tokens) < self.block:
            return
        with self._lock:
            self._entries[self._next] = entry
            self._next += 1
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def on_swap(self, policy: str) -> None:
        """Apply a snapshot's reset_prompt_cache policy to what was cached before it."""
        with self._lock:
            if policy == "all":
                self._entries.clear()
            elif policy == "new_session":
                for e in self._entries.values():
                    e.restricted = True

    def __len__(self) -> int:
        return len(self._entries)
