"""One driver per engine: the contract's intents on that engine's wire (see `base`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_rlrollout.engines import SPECS, spec
from pytest_rlrollout.remote.drivers.base import PAUSE_MODES, Driver, Status, Unbound
from pytest_rlrollout.remote.drivers.coreweave import CoreWeaveDriver
from pytest_rlrollout.remote.drivers.fireworks import FireworksDriver
from pytest_rlrollout.remote.drivers.openai import OpenAIDriver
from pytest_rlrollout.remote.drivers.sglang import SGLangDriver
from pytest_rlrollout.remote.drivers.vllm import VLLMDriver

if TYPE_CHECKING:
    from pytest_rlrollout.engines import Engine
    from pytest_rlrollout.remote.client import DeploymentClient

DRIVERS: dict[str, type[Driver]] = {s.name: s.driver_class() for s in SPECS}


def driver_for(engine: Engine, client: DeploymentClient, *, bucket: str | None = None) -> Driver:
    """The driver of `engine` over `client`; `bucket` is where the engine reads snapshots from
    (a directory the server sees), for self-hosted engines, whose load API takes a path."""
    s = spec(engine)
    return s.driver_class()(client, bucket=bucket) if s.self_hosted else s.driver_class()(client)


__all__ = [
    "DRIVERS",
    "PAUSE_MODES",
    "CoreWeaveDriver",
    "Driver",
    "FireworksDriver",
    "OpenAIDriver",
    "SGLangDriver",
    "Status",
    "Unbound",
    "VLLMDriver",
    "driver_for",
]
