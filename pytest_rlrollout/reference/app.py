"""The reference deployment's HTTP app: one engine core (`controller.Deployment`) behind the router
of the dialect it speaks (`Settings.engine`): Fireworks' hot-load API (`fireworks_app`) or vLLM's
RL routes (`vllm_app`), SGLang's (`sglang_app`), or CoreWeave's hot-load API and gateway (`coreweave_app`)."""

from __future__ import annotations

from pytest_rlrollout.reference.controller import Deployment
from pytest_rlrollout.reference.coreweave_app import create_coreweave_app
from pytest_rlrollout.reference.fireworks_app import create_fireworks_app
from pytest_rlrollout.reference.sglang_app import create_sglang_app
from pytest_rlrollout.reference.vllm_app import create_vllm_app
from pytest_rlrollout.reference.wire import Guarded


def create_app(dep: Deployment) -> Guarded:
    """The ASGI app of `dep`, in its dialect."""
    create = {"vllm": create_vllm_app, "sglang": create_sglang_app, "coreweave": create_coreweave_app}.get(
        dep.settings.engine, create_fireworks_app
    )
    return create(dep)
