"""Everything that configures a reference deployment (names, replicas, timings, faults)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_rlrollout.engines import DEFAULT, Engine, coreweave, dialect, sglang, vllm
from pytest_rlrollout.reference.faults import check_faults
from pytest_rlrollout.snapshot import tiny_moe

Transition = Literal["ASYNC", "SYNC"]
# The wire the deployment speaks: an engine of the registry with a reference dialect
Dialect = Engine
COREWEAVE_DEPLOYMENT = coreweave.REFERENCE_DEPLOYMENT  # CoreWeave names deployments by UUID
VLLM_VERSION = vllm.DIALECT_VERSION  # what GET /version says in the vLLM dialect (the release measured)
SGLANG_VERSION = sglang.DIALECT_VERSION  # what GET /server_info says in the SGLang dialect (the release read, not run)
FIRST_LABEL = "default"  # vLLM's weight version until one is set
# A pace at which swaps can be observed from outside: streams last long enough, and loads and
# swaps pause long enough, for a probe to land inside them (the tiny model alone swaps in ms).
# A swap of 0.1 s once ended, in CI, before any probe was sent inside it (SWAP-ASYNC-4 inconclusive).
OBSERVABLE_PACE = {"token_delay": 0.003, "swap_delay": 0.2, "load_delay": 0.03}
# `rlrollout serve`'s: a run against it takes the live timing profile, whose status polls (two a
# second) see a swap in progress only if it lasts longer than that, as a real one does
SERVED_PACE = OBSERVABLE_PACE | {"swap_delay": 1.0}


@dataclass(frozen=True)
class Settings:
    bucket: Path
    account: str = "rlrollout"
    deployment_id: str = "reference"
    model: str = tiny_moe.MODEL_NAME
    api_key: str | None = "rl-reference-key"  # None: no key asked for (the vLLM dialect's default)
    # CoreWeave's hot-load API, where it has a key of its own; None: api_key
    control_api_key: str | None = None
    replicas: int = 2
    transition: Transition = "ASYNC"
    base_identity: str = tiny_moe.BASE_IDENTITY
    layout: str = "tiny"  # the base it makes when the bucket holds none (tiny_moe.LAYOUTS)
    load_delay: float = 0.0  # seconds a replica spends downloading + loading a snapshot
    stagger: float = 0.0  # extra load delay per replica index, so replica swaps are staggered
    swap_delay: float = 0.0  # seconds a replica pauses at the swap itself
    token_delay: float = 0.0  # seconds per decode step, so streams last long enough to observe
    drain_timeout: float = 90.0  # default x-fireworks-hot-load-drain-timeout
    block_size: int = 16  # prompt-cache granularity (tokens)
    cache_entries: int = 256  # prompt-cache entries per replica
    max_context: int = 2048
    # a prompt is fed in chunks of this many tokens, one chunk per decode step, so a long prefill
    # delays the other streams of its replica by one chunk's time per step, not by all of it
    prefill_chunk: int = 64
    # request bodies: refused with 413 past this size (from Content-Length, and while read), and
    # with 408 when they have not arrived whole this many seconds after the headers
    max_body_bytes: int = 1 << 20
    # request headers, all of them: refused with 431 past this size (the HTTP layer refuses, with
    # 400, headers that do not arrive whole within its own 16 KiB read buffer)
    max_header_bytes: int = 32 << 10
    body_timeout: float = 30.0
    validate_timeout: float = 120.0  # seconds a snapshot's validation may take before it is refused
    workers: int = 4  # threads that decode, validate and tokenize requests off the event loop
    seed: int = 0
    faults: frozenset[str] = field(default_factory=frozenset)
    engine: Dialect = DEFAULT  # the wire it speaks; the engine under it is the same
    # vLLM's --enable-return-routed-experts: completions end with the experts every position was
    # routed to (`routed_experts`); off by default, as on the CPU build (it needs the GPU runner)
    routed_experts: bool = False
    # the vLLM release the vLLM dialect speaks (vllm.RELEASES): 0.33.0 refuses arrivals while paused
    # in abort or wait mode and returns policy-version spans on its OpenAI routes
    vllm_release: str = VLLM_VERSION
    # An object store the deployment downloads each snapshot from when it is first named (as a
    # hosted deployment reads its bucket); `bucket` is then its local copy. None: `bucket` is all.
    mirror: str | None = None  # an fsspec URL: s3://..., gs://...
    mirror_options: Mapping[str, Any] = field(default_factory=dict)  # fsspec storage options

    @classmethod
    def for_dialect(cls, engine: Dialect = DEFAULT, **given: Any) -> Settings:
        """Settings of a deployment speaking `engine`, its dialect's defaults under what is given."""
        return cls(engine=engine, **(dict(dialect(engine).defaults) | given))

    @property
    def deployment(self) -> str:
        return f"accounts/{self.account}/deployments/{self.deployment_id}"

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", check_faults(self.faults))
        if self.vllm_release not in vllm.RELEASES:
            raise ValueError(f"vllm_release {self.vllm_release!r}: one of {', '.join(vllm.RELEASES)}")

    def refuses_while_paused(self, mode: str | None) -> bool:
        """Whether a request arriving while generation is paused in `mode` is refused (vLLM 0.33's
        abort and wait modes), not held."""
        return (
            self.engine == vllm.NAME
            and mode in ("abort", "wait")
            and vllm.at_least(self.vllm_release, vllm.REFUSES_WHILE_PAUSED)
        )

    @property
    def spans_on_openai_routes(self) -> bool:
        """Whether /v1/completions and /v1/chat/completions take `return_weight_versions` (vLLM 0.33)."""
        return self.engine == vllm.NAME and vllm.at_least(self.vllm_release, vllm.SPANS_ON_OPENAI_ROUTES)

    def fault(self, clause: str) -> bool:
        return clause in self.faults
