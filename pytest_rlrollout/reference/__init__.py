"""The reference deployment: a real HTTP server that behaves as the contract says a hot-load
deployment behaves, serving the tiny reference MoE model from snapshots in a local bucket, on
Fireworks' wire or (`engine="vllm"`) on vLLM 0.32's RL routes."""

from pytest_rlrollout.reference.server import Running, reference_deployment
from pytest_rlrollout.reference.settings import Settings

__all__ = ["Running", "Settings", "reference_deployment"]
