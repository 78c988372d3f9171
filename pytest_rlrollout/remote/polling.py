"""Waiting for a condition: poll with an interval and a deadline, never a bare sleep or a busy loop."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


def ticks(timeout: float, interval: float, *, start: float | None = None) -> Iterator[float]:
    """The seconds elapsed: at once, then every `interval` seconds while `timeout` has not passed.
    With `start`, the first interval is `start` and each next one doubles up to `interval`: a
    condition that holds soon is seen soon, a slow one is not polled more than needed."""
    began = time.monotonic()
    step = interval if start is None else min(start, interval)
    while True:
        elapsed = time.monotonic() - began
        yield elapsed
        if elapsed >= timeout:
            return
        time.sleep(min(step, max(0.0, timeout - elapsed)))
        step = min(step * 2, interval)


def wait_until(predicate: Callable[[], T], *, timeout: float, interval: float, what: str) -> T:
    """The first truthy value of `predicate()`, polled every `interval` seconds; TimeoutError
    naming `what` when `timeout` passes first."""
    for _ in ticks(timeout, interval):
        if value := predicate():
            return value
    raise TimeoutError(f"{what}: not reached within {timeout} s")
