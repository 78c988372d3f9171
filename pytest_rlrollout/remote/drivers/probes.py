"""The capability probes every engine's driver runs first: one-token completions, and what their
answers show. Nothing here changes a deployment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_rlrollout.remote.discovery import PROBE_TEXT, Discovery, mark, said

if TYPE_CHECKING:
    from pytest_rlrollout.remote.drivers.base import Driver
    from pytest_rlrollout.remote.stream import Stream


def inference_probes(driver: Driver, d: Discovery) -> Stream:
    """What every engine is asked first: a one-token completion of a text prompt, and what its
    answer shows (cached-token channels, the serving replica's header). Returns that answer."""
    text = driver.complete({"prompt": PROBE_TEXT, "max_tokens": 1})
    mark(d, "text_prompts", text.ok and bool(text.chunks), said(text))
    channels = _cached_channels(text)
    mark(d, "cached_tokens", bool(channels), ", ".join(channels) or "no cached-token channel in the answer")
    host = text.replica
    mark(d, "backend_host", host is not None, f"fireworks-backend-host: {host}" if host else "no such header")
    return text


def auth_probe(driver: Driver, d: Discovery) -> None:
    """Whether the deployment checks API keys: a one-token completion under a key it cannot know."""
    wrong = driver.complete({"prompt": PROBE_TEXT, "max_tokens": 1}, headers={"Authorization": "Bearer rl-not-the-key"})
    mark(d, "auth", wrong.status in (401, 403), f"a wrong key: HTTP {wrong.status}")


def _cached_channels(s: Stream) -> list[str]:
    return [channel for channel, value in s.cached_tokens().items() if value is not None]
