"""One request's life in the engine, as every dialect sees it: submitted to a replica as a job,
its events read back (admission, prompt scores, tokens, the end), each token recorded with the
policy version current when it was sampled, its text decoded and cut at stop strings. The
dialects turn a `Run` into their own chunks and bodies."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Collection
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.reference.replica import Job, Replica, Token
from pytest_rlrollout.reference.text import Text

if TYPE_CHECKING:
    from pytest_rlrollout.reference.controller import Deployment

Event = tuple[str, Any]
ENDS = ("end", "error", "abort", "drop")  # events after which a job says nothing more


class Run:
    """A request's job and what came back of it so far."""

    def __init__(self, dep: Deployment, text: Text, stop: list[str], silent: Collection[int]):
        self.dep, self.text = dep, text
        self.f = dep.settings.fault
        self.queue: asyncio.Queue = asyncio.Queue()
        self.t0 = time.monotonic()
        self.ttft: float | None = None
        self.cached = 0
        self.replica = ""
        self.tokens: list[Token] = []
        self.text_so_far = ""
        self.finish: str | None = None
        self.stop_reason: str | int | None = None  # the stop string (or token id) that ended the output
        self.version = ""
        self._decode = text.stream_decoder()
        self._stop = stop
        self._silent = silent  # tokens that add no text (end of sequence, special tokens)
        self._early: list[Event] = []  # what came instead of admission (the job ended while queued)
        self.job: Job
        self.replica_obj: Replica

    def submit(self, replica: Replica, job: Job) -> None:
        self.job, self.replica_obj = job, replica
        replica.submit(job)  # raises TooEarly while a SYNC swap is on (and Unavailable, with faults)

    async def first(self) -> Event:
        """Wait for admission (or the error that replaces it, or the end of a job ended while queued)."""
        ev = await self.queue.get()
        if ev[0] == "start":
            self.cached, self.replica = ev[1]["cached_tokens"], ev[1]["replica"]
        elif ev[0] != "error":
            self._early.append(ev)
        return ev

    async def events(self) -> AsyncIterator[Event]:
        while True:
            ev = self._early.pop(0) if self._early else await self.queue.get()
            yield ev
            if ev[0] in ENDS:
                return

    def peek(self) -> Event | None:
        """The next event if it has already arrived, left for `events` to yield (a step's events
        arrive together: the token that ends a request comes with its end)."""
        if not self._early:
            try:
                self._early.append(self.queue.get_nowait())
            except asyncio.QueueEmpty:
                return None
        return self._early[0]

    def take(self, tok: Token) -> str:
        """Record a token; returns the new text it adds (stop strings cut it short)."""
        if self.ttft is None:
            self.ttft = time.monotonic() - self.t0
        self.tokens.append(tok)
        self.version = tok.version
        if tok.id in self._silent:
            return ""
        before = len(self.text_so_far)
        self.text_so_far += self._decode(tok.id)
        if self._stop and self._stop_hit(before):
            self.finish = "stop"
        return self.text_so_far[before:]

    def _stop_hit(self, before: int) -> bool:
        """Whether a stop string ends in the text added after `before`; only that tail (and what
        a stop string can straddle) is searched, not the whole text at every token."""
        for s in self._stop:
            at = self.text_so_far.find(s, max(0, before - len(s) + 1))
            if at >= 0:
                self.text_so_far = self.text_so_far[:at]
                self.stop_reason = s
                return True
        return False
