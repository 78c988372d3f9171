"""What an engine is, as data: its name, what it must offer, how it is named and reached, which
driver drives it and how the reference deployment speaks it.

Engine modules (`engines/<name>.py`) fill one `EngineSpec` each; the registry collects them.
Everything else asks the registry, never spells an engine's name: adding an engine is its module,
its driver, its reference dialect and its bindings in the catalogue. Nothing here imports the rest
of the package (the catalogue, the drivers and the reference all read it): drivers and dialect apps
are named by import path and loaded when first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Names = Literal["path", "uuid"]  # what --rl-deployment is on an engine: accounts/<a>/deployments/<d>, a UUID


def load(path: str) -> Any:
    """The object at "package.module:attribute"."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Dialect:
    """The reference deployment speaking an engine's wire."""

    app: str  # "module:factory", the factory building its ASGI app from a `Deployment`
    serving: str  # what `rlrollout serve` says it speaks ({transition}: the swap's)
    # Settings the dialect changes unless the caller says otherwise
    defaults: Mapping[str, Any] = field(default_factory=dict)
    # the rl_long_stream_tokens a run against it needs to see a swap land inside a stream (None: the profile's)
    stream_tokens: int | None = None


@dataclass(frozen=True)
class EngineSpec:
    name: str  # --rl-engine's value, the catalogue's binding key
    title: str  # how prose names it
    driver: str  # "module:Class" of its driver (remote/drivers)
    # capabilities it must offer: without one, a MUST clause's test fails naming it
    requires: frozenset[str] = frozenset({"text_prompts"})
    # capability -> the server flag (or environment variable) that turns it on
    flags: Mapping[str, str] = field(default_factory=dict)
    dialect: Dialect | None = None  # None: the reference deployment does not speak it
    # a gateway over engines of another kind: a clause it has no binding of its own for is bound
    # as on its engines, judged on each of them (None: an engine of its own)
    binds_like: str | None = None
    # a fleet the suite is given by its engines' URLs (rl_fleet_urls), each of them a `binds_like`
    lists_engines: bool = False
    names: Names | None = None  # what --rl-deployment names on it (None: nothing; the model at a URL)
    model_is_name: bool = False  # requests name the deployment: its name is the inference `model`
    inference_prefix: str = ""  # where /v1/completions lives under the base URL
    # a session's repeated prefix reaches the replica that holds its cache (session headers, a
    # KV-aware router): where it does not, a miss on a deployment of several replicas proves nothing
    affinity: bool = False
    control_plane: bool = False  # hot loads through a control plane of its own (rl_control_url, its own key)
    # one server swapped through its own RL routes: it loads a path it reads (the bucket a
    # directory it sees), names its weights by a label the trainer sets, swaps ASYNC only and asks
    # for no key unless started with one
    self_hosted: bool = False
    async_only: str | None = None  # why its swaps are ASYNC only, where they are
    # `rlrollout numerics` samples it; `discovers_to_sample`: after discovery (its spans name policies)
    numerics: bool = True
    discovers_to_sample: bool = False

    def required(self, capability: str) -> bool:
        return capability in self.requires

    def flag(self, capability: str) -> str | None:
        """What turns `capability` on (a server flag or environment variable), if anything does."""
        return self.flags.get(capability)

    def driver_class(self) -> Any:
        return load(self.driver)
