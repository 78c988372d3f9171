"""A plain OpenAI-compatible server: `/v1/completions` and `/v1/chat/completions`, nothing to load,
pause or reset. The clauses it binds are those about what any OpenAI answer must be."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_rlrollout.remote.discovery import Discovery, inference_probes
from pytest_rlrollout.remote.drivers.base import Driver
from pytest_rlrollout.remote.stream import Stream


class OpenAIDriver(Driver):
    engine = "openai"

    def complete(
        self,
        body: dict[str, Any],
        *,
        chat: bool = False,
        headers: dict[str, str] | None = None,
        on_chunk: Callable[[dict[str, Any]], None] | None = None,
    ) -> Stream:
        return self.client.complete(body, chat=chat, headers=headers, on_chunk=on_chunk)

    def discover(self, *, transition: str | None, decided: str) -> Discovery:
        d = Discovery("openai", decided)
        inference_probes(self, d)
        return d
