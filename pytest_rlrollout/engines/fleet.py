"""A fleet of vLLM engines with no gateway, as RL frameworks without one run theirs: the suite
is given every engine's URL (rl_fleet_urls) and fans each control call out to them itself, routes
a session to one engine by its key, and judges each engine by what it serves.

A clause is judged as on vLLM, on each engine: the replicas are the engines."""

from __future__ import annotations

from pytest_rlrollout.engines import vllm
from pytest_rlrollout.engines.spec import EngineSpec

ENGINE = EngineSpec(
    name="fleet",
    title="a fleet of vLLM engines the suite fans out to itself",
    driver="pytest_rlrollout.remote.drivers.fleet:FleetDriver",
    flags=vllm.ENGINE.flags,
    binds_like=vllm.NAME,
    lists_engines=True,
    affinity=True,  # the suite routes a session to one engine by its key
    self_hosted=True,
    async_only="each engine's swap pauses generation and the requests in flight continue (ASYNC)",
    numerics=False,
)
