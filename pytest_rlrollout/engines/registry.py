"""The engines, registered in one place: every list of engines, CLI choice, detection step and
reference dialect reads this module.

Catalogue order (the bindings' order in reports) is registration order; `--rl-engine auto` asks
each driver in that order whether it recognises the deployment, an engine with a control plane
of its own first when one is named, and falls back to the last (a plain OpenAI-compatible server).
"""

from __future__ import annotations

from typing import Literal, cast, get_args

from pytest_rlrollout.engines import coreweave, fireworks, fleet, openai, sglang, sglang_fleet, smg, vllm
from pytest_rlrollout.engines.spec import Dialect, EngineSpec

SPECS: tuple[EngineSpec, ...] = (
    fireworks.ENGINE,
    vllm.ENGINE,
    sglang.ENGINE,
    coreweave.ENGINE,
    smg.ENGINE,
    fleet.ENGINE,
    sglang_fleet.ENGINE,
    openai.ENGINE,
)
# the names as a type; kept equal to SPECS (checked below, at import)
Engine = Literal["fireworks", "vllm", "sglang", "coreweave", "smg", "fleet", "sglang-fleet", "openai"]
# a cast: the specs' names are plain strings to the checker; the check below makes them Engine's
ENGINES = cast("tuple[Engine, ...]", tuple(s.name for s in SPECS))
if get_args(Engine) != ENGINES:
    raise ImportError(f"engines.registry: Engine spells {get_args(Engine)}, the registered engines are {ENGINES}")
BY_NAME: dict[str, EngineSpec] = {s.name: s for s in SPECS}
DEFAULT: Engine = ENGINES[0]  # the contract's home engine: the bundled deployment speaks it unless told otherwise
FALLBACK: Engine = ENGINES[-1]  # what --rl-engine auto decides when no engine's own API answers
# the reference deployment's dialects
DIALECTS: tuple[Engine, ...] = tuple(e for e in ENGINES if BY_NAME[e].dialect is not None)
NUMERICS: tuple[Engine, ...] = tuple(e for e in ENGINES if BY_NAME[e].numerics)


def spec(name: str) -> EngineSpec:
    """The engine called `name`; a KeyError naming the known ones otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no engine {name!r} (known: {', '.join(ENGINES)})") from None


def dialect(name: str) -> Dialect:
    """How the reference deployment speaks `name`; a ValueError if it does not."""
    found = BY_NAME.get(name)
    if found is None or found.dialect is None:
        raise ValueError(f"engine: expected one of {', '.join(DIALECTS)}, got {name!r}")
    return found.dialect


def presumed(*, deployment: str | None, control_url: str = "", uuid: bool = False) -> Engine:
    """The engine the names given point to, before anything is asked: one with a control plane of
    its own when that is named (or the deployment is a UUID, `uuid`), one whose deployments have
    a path when a deployment is named, else the fallback."""
    for s in SPECS:
        if s.control_plane and (control_url or (uuid and s.names == "uuid")):
            return s.name  # type: ignore[return-value]
    if deployment is not None:
        for s in SPECS:
            if s.names == "path":
                return s.name  # type: ignore[return-value]
    return FALLBACK


def listed_fleet(engine: str) -> EngineSpec:
    """The engine that drives a fleet of `engine`s given by their URLs; a ValueError if none does."""
    found = next((s for s in SPECS if s.lists_engines and s.binds_like == engine), None)
    if found is None:
        raise ValueError(f"no fleet of {engine} engines given by their URLs has a binding")
    return found


def with_control_plane() -> EngineSpec:
    """The engine whose hot loads go through a control plane of its own (what rl_control_url names)."""
    return next(s for s in SPECS if s.control_plane)
