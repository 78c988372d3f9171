"""The reference deployment's HTTP app: one engine core (`controller.Deployment`) behind the router
of the dialect it speaks (`Settings.engine`), the one its engine's module names (Fireworks' hot-load
API in `fireworks_app`, vLLM's RL routes in `vllm_app`, ...)."""

from __future__ import annotations

from pytest_rlrollout.engines import dialect, load
from pytest_rlrollout.reference.controller import Deployment
from pytest_rlrollout.reference.wire import Guarded


def create_app(dep: Deployment) -> Guarded:
    """The ASGI app of `dep`, in its dialect."""
    return load(dialect(dep.settings.engine).app)(dep)
