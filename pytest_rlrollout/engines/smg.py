"""SGLang's model gateway (`smg`, `--enable-rl`) over a fleet of vLLM engines: the engines listed
by `GET /v1/rl/workers`, every control call fanned out to them (`/v1/rl/engine/{path}?selector=`,
200 when all succeed, 207 when some fail), one engine reached through its proxy route, and
inference routed by `x-smg-routing-key` to the engine it names in `x-smg-routed-worker-id`.

A clause is judged as on vLLM, on each engine the gateway fronts: the replicas are the engines."""

from __future__ import annotations

from pytest_rlrollout.engines import vllm
from pytest_rlrollout.engines.spec import EngineSpec

NAME = "smg"
ROUTING_KEY = "x-smg-routing-key"  # the gateway's default routing-key header (--routing-key-headers)
ROUTED_WORKER = "x-smg-routed-worker-id"  # names the engine that served an answer (its URL)
MEMBERS = f"engine={vllm.NAME}"  # the label selector of the engines a control call is fanned out to

ENGINE = EngineSpec(
    name=NAME,
    title="SGLang's model gateway (smg) over vLLM engines",
    driver="pytest_rlrollout.remote.drivers.smg:GatewayDriver",
    flags={**vllm.ENGINE.flags, "cached_tokens": "--enable-prompt-tokens-details (each engine)"},
    binds_like=vllm.NAME,
    affinity=True,  # a routing key sticks to one engine (consistent hashing)
    self_hosted=True,
    async_only="each engine's swap pauses generation and the requests in flight continue (ASYNC)",
    numerics=False,
)
