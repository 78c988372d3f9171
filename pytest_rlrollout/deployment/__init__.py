"""The reference deployment: a real HTTP server that behaves as SPEC.md says a hot-load
deployment behaves, serving the tiny reference MoE model from snapshots in a local bucket."""

from pytest_rlrollout.deployment.server import Running, reference_deployment
from pytest_rlrollout.deployment.settings import Settings

__all__ = ["Running", "Settings", "reference_deployment"]
