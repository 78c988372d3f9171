"""A plain OpenAI-compatible server: `/v1/completions` and `/v1/chat/completions`, nothing to load,
pause or reset. The clauses it binds are those about what any OpenAI answer must be."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_rlrollout.engines.openai import ENGINE
from pytest_rlrollout.remote.discovery import Answered, Discovery
from pytest_rlrollout.remote.drivers.base import Driver, registered
from pytest_rlrollout.remote.drivers.probes import inference_probes

if TYPE_CHECKING:
    from pytest_rlrollout.remote.client import DeploymentClient


class OpenAIDriver(Driver):
    engine = registered(ENGINE)

    @classmethod
    def recognises(cls, client: DeploymentClient, seen: Answered) -> str | None:
        return "no hot-load API and no engine's own API answers"  # the fallback: any OpenAI-compatible server

    def discover(self, *, transition: str | None, decided: str) -> Discovery:
        d = Discovery(self.engine, decided)
        inference_probes(self, d)
        return d
