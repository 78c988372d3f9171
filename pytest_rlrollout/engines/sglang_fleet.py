"""A fleet of SGLang engines with no gateway, as slime and miles run their rollout engines: the
suite is given every engine's URL (rl_fleet_urls) and fans each of SGLang's control calls out to
them itself, routes a session to one engine by its key, and judges each engine by what it serves.

A clause is judged as on SGLang, on each engine: the replicas are the engines."""

from __future__ import annotations

from pytest_rlrollout.engines import sglang
from pytest_rlrollout.engines.spec import EngineSpec

ENGINE = EngineSpec(
    name="sglang-fleet",
    title="a fleet of SGLang engines the suite fans out to itself",
    driver="pytest_rlrollout.remote.drivers.fleet:SGLangFleetDriver",
    flags=sglang.ENGINE.flags,
    binds_like=sglang.NAME,
    lists_engines=True,
    affinity=True,  # the suite routes a session to one engine by its key
    self_hosted=True,
    async_only="each engine's swap pauses generation and the requests in flight continue (ASYNC)",
    numerics=False,
)
