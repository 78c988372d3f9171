"""The engines a deployment may run, one module each (`spec` says what one is), registered in
`registry`: the one place that lists them."""

from pytest_rlrollout.engines.registry import (
    DEFAULT,
    DIALECTS,
    ENGINES,
    FALLBACK,
    NUMERICS,
    SPECS,
    Engine,
    dialect,
    listed_fleet,
    presumed,
    spec,
    with_control_plane,
)
from pytest_rlrollout.engines.spec import Dialect, EngineSpec, load

__all__ = [
    "DEFAULT",
    "DIALECTS",
    "ENGINES",
    "FALLBACK",
    "NUMERICS",
    "SPECS",
    "Dialect",
    "Engine",
    "EngineSpec",
    "dialect",
    "listed_fleet",
    "load",
    "presumed",
    "spec",
    "with_control_plane",
]
