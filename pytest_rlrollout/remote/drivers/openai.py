"""A plain OpenAI-compatible server: `/v1/completions` and `/v1/chat/completions`, nothing to load,
pause or reset. The clauses it binds are those about what any OpenAI answer must be."""

from __future__ import annotations

from pytest_rlrollout.remote.discovery import Discovery, inference_probes
from pytest_rlrollout.remote.drivers.base import Driver


class OpenAIDriver(Driver):
    engine = "openai"

    def discover(self, *, transition: str | None, decided: str) -> Discovery:
        d = Discovery("openai", decided)
        inference_probes(self, d)
        return d
