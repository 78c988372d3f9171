"""CoreWeave: an OpenAI-compatible gateway (vLLM under NVIDIA Dynamo) beside a v1alpha1 hot-load
API of its own host and key, deployments named by UUID."""

from __future__ import annotations

from pytest_rlrollout.engines.spec import Dialect, EngineSpec

REFERENCE_DEPLOYMENT = "3f2b8c1e-6d0a-4e6b-9a55-0c1d2e3f4a5b"  # the reference's deployment UUID

ENGINE = EngineSpec(
    name="coreweave",
    title="CoreWeave",
    driver="pytest_rlrollout.remote.drivers.coreweave:CoreWeaveDriver",
    dialect=Dialect(
        app="pytest_rlrollout.reference.coreweave_app:create_coreweave_app",
        serving="CoreWeave's v1alpha1 dialect, TRANSITION_MODE_{transition}",
        # its gateway runs vLLM: the vLLM dialect's answers and blocks
        defaults={"model": "tiny", "block_size": 128, "deployment_id": REFERENCE_DEPLOYMENT},
        # no policy version on its chunks: a stream shows it crossed a swap only by outlasting
        # the whole rollout (every replica, one at a time)
        stream_tokens=512,
    ),
    names="uuid",
    control_plane=True,
    affinity=True,  # its gateway (NVIDIA Dynamo) routes a prefix to the worker holding its KV
    async_only="CoreWeave documents TRANSITION_MODE_ASYNC only",
    numerics=False,  # its hot-load API needs a control plane `rlrollout numerics` has no option for
)
