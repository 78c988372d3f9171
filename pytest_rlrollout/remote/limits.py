"""The bounds the client holds a deployment to: no answer may take longer, weigh more or run
longer than these, whatever the deployment sends (an endless stream, a trickle, a huge body).

A deployment that goes past a bound fails the test that asked, with `LimitExceeded` naming the
bound and what the deployment did: a well-behaved deployment never comes near them.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20


@dataclass(frozen=True)
class Limits:
    exchange: float = 60.0  # seconds: one request and its whole answer, a whole stream included
    body: int = 32 * MiB  # bytes of an answer that is not streamed (a status, an error, a completion)
    event: int = 16 * MiB  # bytes of one SSE event (a streamed echo of a long prompt with routing is MBs)
    events: int = 20_000  # events of one stream
    # bytes in memory, as `parsed_size` estimates them, of one answer once parsed, or of a
    # stream's events and their chunks: JSON of empty arrays takes 20 times its size once parsed
    memory: int = 128 * MiB


LOCAL_LIMITS = Limits(exchange=60.0)
LIVE_LIMITS = Limits(exchange=600.0)


class LimitExceeded(AssertionError):
    """The deployment went past one of the suite's bounds. An AssertionError: what the
    deployment did is the finding, and the message says which bound and by how much."""

    def __init__(self, bound: str, detail: str, *, silent: bool = False):
        self.bound = bound
        self.silent = silent  # a time bound passed before any of the answer came: slow, or hung
        super().__init__(f"{detail} (the suite's bound: {bound})")
