"""Numerics alignment: a deployment's logprobs and routing against a local forward pass of the
same weights (the R3 paper's figures), and the pictures of them."""

from dataclasses import dataclass
from typing import Literal

from pytest_rlrollout.engines import Engine

# The thresholds' defaults, in one place for the suite's ini keys and `rlrollout numerics`.
MAX_KL = 1e-3  # the largest k3 KL of the deployment's logprobs against the local forward pass
MIN_ROUTE_AGREEMENT = 0.99  # NUM-ROUTE-1: the least (layer, token) agreement with the local router


@dataclass(frozen=True)
class Sampling:
    """How the rollouts compared are sampled; its defaults are `rlrollout numerics`'s (kept here,
    clear of httpx and the scorers, so that the CLI reads them without importing the workflow)."""

    prompts: int = 8  # one completion each
    tokens: int = 32  # generated per prompt
    seed: int = 0  # of the first prompt; prompt i samples with seed + i
    routing: bool = True  # ask for routing matrices (of an MoE model)
    # whose wire: auto (as the suite's preflight decides), fireworks, vllm, openai
    engine: Engine | Literal["auto"] = "auto"
    timeout: float = 120.0  # seconds per read
