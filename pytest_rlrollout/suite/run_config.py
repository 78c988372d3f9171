"""A run's configuration, typed: `RLConfig` (what `read_options` makes of the settings, kept in
`config.stash` and handed out by the `rl_config` fixture), every wait of the suite in one
`Timeouts` profile per kind of deployment (`LOCAL`, `LIVE`), how numbers are compared
(`Numerics`) and what a run may do to a live deployment (`Budget`, `PROFILES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

from pytest_rlrollout.engines import DEFAULT, Engine
from pytest_rlrollout.numerics import MIN_ROUTE_AGREEMENT
from pytest_rlrollout.remote.bucket import Store
from pytest_rlrollout.remote.limits import Limits
from pytest_rlrollout.remote.secret import Secret

Mode = Literal["local", "live", "replay"]
DEFAULT_BASE_URL = "https://api.fireworks.ai"
DEFAULT_CONTROL_URL = "https://api.coreweave.com"  # CoreWeave's hot-load API (v1alpha1)


@dataclass(frozen=True)
class Timeouts:
    """Every wait of the suite (one profile per kind of deployment)."""

    swap: float  # a signal until every replica serves the snapshot
    poll: float  # between status polls while waiting for a swap to finish
    probe: float  # between status polls while trying to catch a swap in progress (a short window)
    stalled_after: float  # a rollout that stopped part-way is given up after this long
    retry: float  # between retries of a refused-while-busy signal (409: one load at a time)
    request: float  # one read of an HTTP answer (the network's silence allowed)
    exchange: float  # one request and its whole answer, a whole stream included
    test: float  # everything one test asks of the deployment
    long_stream_tokens: int  # tokens a stream must last for a swap to land inside it
    hold: float = 0.2  # a pause held this long shows whether tokens are still generated
    # the first interval of a wait's polls, doubling up to `poll`: a quick swap is seen soon
    first_poll: float = 0.01
    # a chunk arriving this soon after an event (every replica serving the new snapshot, a pause
    # answered) may have been generated before it, on its way: at least this, or a few chunk gaps
    in_transit: float = 0.05

    def with_(self, **changes: Any) -> Timeouts:
        """A copy with the changes that are not None (options the user left out)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


# The reference deployment swaps in milliseconds; a real one takes minutes to load 60 GB, and is
# asked its status at most twice a second through it (rl_poll_interval), probes and waits alike.
# A test waits for at most a few swaps: its deadline is a few swap timeouts.
LOCAL = Timeouts(
    swap=3.0,
    poll=0.01,
    probe=0.01,
    stalled_after=0.5,
    retry=0.02,
    request=60.0,
    exchange=60.0,
    test=120.0,
    long_stream_tokens=64,
)
LIVE = Timeouts(
    swap=900.0,
    poll=0.5,
    probe=0.5,
    stalled_after=120.0,
    retry=1.0,
    request=120.0,
    exchange=600.0,
    test=5400.0,
    long_stream_tokens=256,
    hold=1.0,
    first_poll=0.5,
)


@dataclass(frozen=True)
class Numerics:
    """How the FID and NUM clauses compare numbers: the tolerances follow the precision the
    deployment serves in (`numerics.tolerances`) unless an ini key sets them."""

    fingerprint_tolerance: float = 1e-3  # |Δlogprob| two fingerprints of the same weights may differ by
    logprob_tolerance: float = 1e-3  # NUM-LOGPROB-1: the largest |Δlogprob| against the local scorer
    dtype: str = "float32"  # the precision the deployment serves in, which the tolerances follow
    source: str = "the contract's defaults (FID: 1e-3 absolute)"  # where the tolerances come from
    min_route_agreement: float = MIN_ROUTE_AGREEMENT  # NUM-ROUTE-1: (layer, token) agreement with the local router
    tokens: int = 64  # NUM: generated tokens compared (over several prompts)
    scorer: str = "auto"  # numpy | transformers | auto
    scorer_device: str = "cpu"


Profile = Literal["read-only", "core", "full"]
PROFILES: tuple[Profile, ...] = ("read-only", "core", "full")


@dataclass(frozen=True)
class Budget:
    """What a run may do to a live deployment (`rl_profile`, `rl_max_*`), and the swap time its
    plan estimates wall time with. A test left out by them is reported so, never as a pass."""

    profile: Profile = "full"
    swaps: int | None = None  # the most loads the deployment serves
    upload_bytes: int | None = None  # the most bytes sent to the bucket from this machine
    full_uploads: int | None = None  # the most whole snapshots sent (copies inside the bucket are not)
    swap_seconds: float | None = None  # how long one swap takes on this deployment (the user's word)
    plan: Path | None = None  # plan only: write the plan here (JSON) and run no test

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.swaps, self.upload_bytes, self.full_uploads))

    # What the profiles mean, said once: core runs only the tests of MUST clauses the engine binds,
    # on swaps shared by every test that can be judged on one (suite/shared.py).
    @property
    def musts_only(self) -> bool:
        return self.profile == "core"

    @property
    def shares_swaps(self) -> bool:
        return self.profile == "core"

    @property
    def musts_first(self) -> bool:
        """Whether the run spends what it may do on MUST clauses first (a budget, or core)."""
        return self.limited or self.musts_only

    def describe(self) -> str:
        limits = [
            f"{k} = {v}"
            for k, v in (
                ("rl_max_swaps", self.swaps),
                ("rl_max_upload_bytes", self.upload_bytes),
                ("rl_max_full_uploads", self.full_uploads),
            )
            if v is not None
        ]
        return f"profile {self.profile}" + (f", {', '.join(limits)}" if limits else "")


@dataclass(frozen=True)
class RLConfig:
    """The run's settings (options and ini keys), checked: its one source of configuration."""

    mode: Mode
    deployment: str | None  # accounts/<a>/deployments/<d>; None: the local reference deployment, or a plain server
    base_url: str | None
    inference_url: str | None  # as given
    model: str | None
    api_key: Secret | None = None
    # CoreWeave: the hot-load API's URL and key (the gateway's are base_url and api_key)
    control_url: str | None = None
    fleet_urls: tuple[str, ...] = ()  # rl_fleet_urls: a fleet's engines with no gateway
    control_key: Secret | None = None
    engine: Engine | None = DEFAULT  # None: decided by the preflight (--rl-engine=auto)
    allow_hot_load: bool = False
    budget: Budget = Budget()
    bucket_url: str | None = None
    store: Store = field(default_factory=Store)  # how to reach the bucket when it is an object store
    base_snapshot: Path | None = None
    transition: str | None = None  # ASYNC | SYNC, or None: ask the deployment
    level: Literal["must", "should"] = "should"
    report: Path | None = None
    record: Path | None = None
    record_mode: str = "rewrite"
    replay: Path | None = None
    replay_meta: dict[str, Any] | None = None  # the recording's _session.json meta
    local_faults: frozenset[str] = frozenset()
    local_vllm_release: str | None = None  # the vLLM release the bundled reference speaks (vllm dialect)
    timeouts: Timeouts = LOCAL
    soak: dict[str, Any] | None = None  # rl_soak: the soak's settings given (`soak.run.Settings` fields)
    numerics: Numerics = Numerics()
    # the exporter gate (--rl-snapshot)
    snapshot: Path | None = None
    parent: Path | None = None
    signal: dict[str, Any] | None = None
    after_ledger_reset: bool = False
    base_models: tuple[str, ...] = ()
    hf_config: bool = True  # ask transformers whether it knows the config's model_type

    @property
    def recorded_mode(self) -> Mode:
        """Where the exchanges come from: in replay, where they were recorded."""
        if self.mode == "replay":
            # the recorded session's schema allows only the modes (schemas/recorded-session.schema.json)
            return cast(Mode, (self.replay_meta or {}).get("recorded_mode", "live"))
        return self.mode

    @property
    def limits(self) -> Limits:
        """The bounds every exchange with the deployment is held to (time from the timeouts)."""
        return Limits(exchange=self.timeouts.exchange)
