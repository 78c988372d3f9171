"""The run's settings: a dozen `--rl-*` options and the ini keys (`SETTINGS`, one table the
plugin and `rlrollout conformance --help` both read), read once into one typed `RLConfig` (kept
in `config.stash`, handed out by the `rl_config` fixture).

Which deployment is under test (local / live / replay) is decided here and nowhere else, every
wait of the suite lives in one `Timeouts` profile, and every usage error (a missing model, key
or bucket, a replay directory that is not one, options that contradict each other) ends the run
before collection with one message.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import pytest

from pytest_rlrollout.engines import DEFAULT, DIALECTS, ENGINES, Engine, presumed, spec, vllm, with_control_plane
from pytest_rlrollout.numerics import MIN_ROUTE_AGREEMENT
from pytest_rlrollout.numerics.tolerances import TOLERANCES
from pytest_rlrollout.remote.bucket import Store
from pytest_rlrollout.remote.limits import Limits
from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.shipped import shipped
from pytest_rlrollout.snapshot.layout import parse_size as byte_size

Mode = Literal["local", "live", "replay"]
DEFAULT_BASE_URL = "https://api.fireworks.ai"
DEFAULT_CONTROL_URL = "https://api.coreweave.com"  # CoreWeave's hot-load API (v1alpha1)
CONFORMANCE = shipped("conformance")
SHIPPED_CASSETTES = shipped("cassettes")


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


PROFILES = ("read-only", "core", "full")


@dataclass(frozen=True)
class Budget:
    """What a run may do to a live deployment (`rl_profile`, `rl_max_*`), and the swap time its
    plan estimates wall time with. A test left out by them is reported so, never as a pass."""

    profile: Literal["read-only", "core", "full"] = "full"
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
            return (self.replay_meta or {}).get("recorded_mode", "live")
        return self.mode

    @property
    def limits(self) -> Limits:
        """The bounds every exchange with the deployment is held to (time from the timeouts)."""
        return Limits(exchange=self.timeouts.exchange)


@dataclass(frozen=True)
class Setting:
    """One setting of a run: an ini key (`[tool.pytest.ini_options]`, pytest.ini, `-o key=value`),
    and for the dozen a person types on each run, a command-line option too (which wins)."""

    key: str  # the ini key, and the option's dest
    help: str
    kind: type = str  # str | float | int | bool | list (whitespace-separated words) | byte_size
    option: str | None = None  # the command-line flag
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    check: Literal["positive", "fraction"] | None = None
    ini: bool = True  # False: typed per run only (a key kept in a file lands in git; a safety switch stays explicit)

    @property
    def example(self) -> str:
        """How to set it for one run."""
        value = {float: "SECONDS" if "timeout" in self.key else "X", int: "N", bool: "true", byte_size: "SIZE"}.get(
            self.kind, self.metavar or "VALUE"
        )
        return f"-o {self.key}={value}"

    def parse(self, raw: Any) -> Any:
        """The ini value, typed (None when unset); raises pytest.UsageError naming the key."""
        if raw in (None, "", []):
            return None
        if self.kind is list:
            return list(raw)
        text = str(raw).strip()
        try:
            value: Any = {float: float, int: int, bool: _boolean, byte_size: byte_size}.get(self.kind, str)(text)
        except ValueError:
            _usage(f"{self.key} = {text!r} is not {_KIND_WORDS[self.kind]} ({self.example})")
        if self.choices:  # ASYNC or async alike
            value = next((c for c in self.choices if c.lower() == text.lower()), None)
            if value is None:
                _usage(f"{self.key} = {text!r}: one of {', '.join(self.choices)}")
        if self.check == "positive" and not value > 0:  # `not >`: NaN is not positive either
            _usage(f"{self.key} must be positive, not {text}")
        if self.check == "fraction" and not 0 <= value <= 1:
            _usage(f"{self.key} is a fraction in [0, 1], not {text}")
        return value


_KIND_WORDS = {
    float: "a number",
    int: "a whole number",
    bool: "true or false",
    byte_size: "a size (61GB, 500MiB: powers of 1024)",
}


def _boolean(text: str) -> bool:
    words = {"true": True, "yes": True, "1": True, "on": True, "false": False, "no": False, "0": False, "off": False}
    if text.lower() not in words:
        raise ValueError(text)
    return words[text.lower()]


# Every setting of a run, once: the plugin registers them, `rlrollout conformance --help` lists
# them, and `read_options` reads them. Options are what a person types per run; tolerances,
# timeouts, thresholds and the rest of a deployment's description are ini keys.
SETTINGS = (
    Setting(
        "rl_deployment",
        "accounts/<a>/deployments/<d>, or a CoreWeave deployment's UUID (default: start the "
        "bundled reference deployment)",
        option="--rl-deployment",
        metavar="NAME",
    ),
    Setting(
        "rl_engine",
        "whose wire the deployment speaks: a Fireworks hot-load deployment, a vLLM server through "
        "its RL API (VLLM_SERVER_DEV_MODE=1), an SGLang server through its RL routes, a CoreWeave deployment "
        "(hot-load API and gateway), a plain OpenAI-compatible server, or auto (the default: decided from what "
        "answers, and said)",
        option="--rl-engine",
        choices=("auto", *ENGINES),
    ),
    Setting(
        "rl_base_url", f"the deployment's API base (default {DEFAULT_BASE_URL})", option="--rl-base-url", metavar="URL"
    ),
    Setting("rl_model", "the model the deployment serves (fireworks-model)", option="--rl-model", metavar="NAME"),
    Setting(
        "rl_api_key",
        "default: $FIREWORKS_API_KEY (CoreWeave: the gateway's key, no default)",
        option="--rl-api-key",
        metavar="KEY",
        ini=False,
    ),
    Setting(
        "rl_allow_hot_load",
        "allow state changes (hot-loads, ledger resets) on a live deployment",
        bool,
        option="--rl-allow-hot-load",
        ini=False,
    ),
    Setting(
        "rl_profile",
        "how much of the contract a live run may change the deployment to judge: read-only (nothing), core (the "
        "MUST clauses the engine binds), full (every clause; the default with --rl-allow-hot-load)",
        choices=PROFILES,
        metavar="read-only|core|full",
    ),
    Setting(
        "rl_plan",
        "plan only: print what the run would load (tests, swaps, bytes, time) and write it to PATH as JSON; "
        "nothing is run and no state changes (`rlrollout plan` sets it)",
        metavar="PATH",
    ),
    Setting("rl_max_swaps", "the most loads a run may have the deployment serve (MUST clauses first)", int),
    Setting(
        "rl_max_upload_bytes",
        "the most bytes a run may send to the bucket (61GB, 500MiB: powers of 1024; copies inside the bucket are free)",
        byte_size,
    ),
    Setting("rl_max_full_uploads", "the most whole snapshots a run may send to the bucket", int),
    Setting(
        "rl_swap_seconds",
        "how long one swap takes on the deployment, as you know it: the plan's wall-time estimate",
        float,
        check="positive",
    ),
    Setting(
        "rl_bucket_url",
        "where the suite uploads the snapshots it swaps in (the deployment's bucket; fsspec URL or directory)",
        option="--rl-bucket-url",
        metavar="URL",
    ),
    Setting(
        "rl_bucket_endpoint_url",
        "an object store's endpoint, for an s3:// bucket on an S3-compatible store (CoreWeave AI Object "
        "Storage, MinIO) or a gs:// one elsewhere than Google; credentials come from the environment or a profile",
        metavar="URL",
    ),
    Setting("rl_bucket_profile", "s3://: the credentials profile to use (a section of ~/.aws/credentials)"),
    Setting(
        "rl_bucket_concurrency",
        f"files uploaded to the bucket at once (default {Store.concurrency})",
        int,
        check="positive",
    ),
    Setting(
        "rl_bucket_options",
        "further fsspec storage options for the bucket, as a JSON object (never credentials)",
        metavar="JSON",
    ),
    Setting(
        "rl_base_snapshot",
        "a local copy of the base model the deployment serves (its directory name = its identity)",
        option="--rl-base-snapshot",
        metavar="DIR",
    ),
    Setting(
        "rl_report",
        "write the per-clause report as JSON (and .md, .html beside it)",
        option="--rl-report",
        metavar="PATH",
    ),
    Setting(
        "rl_record",
        "record every exchange with the deployment into cassettes in DIR",
        option="--rl-record",
        metavar="DIR",
    ),
    Setting(
        "rl_replay",
        "replay the cassettes in DIR (or a shipped set: reference, reference-sync) instead of talking to a deployment",
        option="--rl-replay",
        metavar="DIR",
    ),
    Setting(
        "rl_snapshot",
        "validate this snapshot directory (the exporter gate; rl_parent, rl_signal describe it)",
        option="--rl-snapshot",
        metavar="DIR",
    ),
    # the deployment, further described
    Setting("rl_inference_url", "the inference API (default: base URL + /inference)", metavar="URL"),
    Setting(
        "rl_control_url",
        f"CoreWeave: the hot-load API (default {DEFAULT_CONTROL_URL}; its key: "
        "$COREWEAVE_API_KEY); rl_base_url is then the deployment's OpenAI-compatible gateway",
        metavar="URL",
    ),
    Setting(
        "rl_fleet_urls",
        "a fleet with no gateway: every engine's URL, space-separated (rl_base_url: the first); the suite fans "
        "control calls out to them and routes sessions itself",
        metavar="URLS",
    ),
    Setting(
        "rl_transition",
        "the deployment's transition type (local: start the reference deployment with it)",
        choices=("ASYNC", "SYNC"),
        metavar="ASYNC|SYNC",
    ),
    # how the run goes
    Setting(
        "rl_level",
        "'must': failures of SHOULD clauses are reported but do not fail the run (default should)",
        choices=("must", "should"),
        metavar="must|should",
    ),
    Setting(
        "rl_record_mode",
        "rewrite: record every test anew (default); once: only tests without a cassette; "
        "none: replay the --rl-record directory",
        choices=("rewrite", "once", "none"),
        metavar="MODE",
    ),
    Setting(
        "rl_local_faults",
        "fault switches the bundled reference deployment starts with (mutation testing; "
        "`rlrollout serve --list-faults`)",
        list,
        metavar="CLAUSE-ID ...",
    ),
    Setting(
        "rl_local_vllm_release",
        f"the vLLM release the bundled reference deployment speaks with --rl-engine={vllm.NAME} "
        f"({vllm.DIALECT_VERSION}: measured on vLLM's CPU build; 0.33.0: read from its wheel)",
        choices=vllm.RELEASES,
        metavar="RELEASE",
    ),
    # waits
    Setting("rl_swap_timeout", "how long a swap may take (default: 3 local, 900 live)", float, check="positive"),
    Setting(
        "rl_poll_interval",
        "seconds between status polls while a swap is under way (default: 0.01 local, 0.5 live: at most two a second)",
        float,
        check="positive",
    ),
    Setting(
        "rl_exchange_timeout",
        "the longest one request and its whole answer (a stream included) may take (default: 60 local, 600 live)",
        float,
        check="positive",
    ),
    Setting(
        "rl_test_timeout",
        "the longest one test may spend talking to the deployment (default: 120 local, 5400 live)",
        float,
        check="positive",
    ),
    Setting(
        "rl_long_stream_tokens",
        "length of the streams swaps must land in (default: 64 local, 256 live)",
        int,
        check="positive",
    ),
    # numbers
    Setting(
        "rl_fingerprint_tolerance",
        "FID: the largest |Δlogprob| between two fingerprints of the same weights (default: the served dtype's; "
        f"{Numerics.fingerprint_tolerance:g} for float32)",
        float,
        check="positive",
    ),
    Setting(
        "rl_logprob_tolerance",
        "NUM-LOGPROB-1: the largest |Δlogprob| against the local scorer (default: the served dtype's)",
        float,
        check="positive",
    ),
    Setting(
        "rl_served_dtype",
        "the precision the deployment computes in, which the tolerances follow (default: the base's "
        "config.json torch_dtype; float32 for the bundled reference deployment)",
        choices=tuple(TOLERANCES),
        metavar="|".join(TOLERANCES),
    ),
    Setting(
        "rl_min_route_agreement",
        "NUM-ROUTE-1: the least (layer, token) routing agreement with the local "
        f"router (default {Numerics.min_route_agreement:g})",
        float,
        check="fraction",
    ),
    Setting(
        "rl_numerics_tokens", f"NUM: generated tokens to compare (default {Numerics.tokens})", int, check="positive"
    ),
    Setting(
        "rl_scorer",
        "NUM: the local scorer (default auto: on the CPU the numpy engine, its weights streamed layer by layer "
        "for models over 200M parameters; transformers on another device)",
        choices=("auto", "numpy", "streaming", "transformers"),
        metavar="auto|numpy|streaming|transformers",
    ),
    Setting("rl_scorer_device", "NUM: where the transformers scorer runs (default cpu; cuda)", metavar="DEVICE"),
    # the soak (`rlrollout soak`, or -o rl_soak=true)
    Setting(
        "rl_soak",
        "run the soak (`rlrollout soak` sets it): rollouts on Locust at concurrency across many swaps, judged "
        "throughout; its tests are left out otherwise",
        bool,
    ),
    Setting("rl_soak_seconds", "the soak ends after this long (default 600)", float, check="positive"),
    Setting("rl_soak_swaps", "... or after this many swaps (default 20; 0: load alone)", int),
    Setting("rl_soak_every", "seconds of load before each swap (default 20)", float, check="positive"),
    Setting("rl_soak_users", "rollouts in flight at once, each a session (default 64)", int, check="positive"),
    Setting("rl_soak_workers", "Locust worker processes on this machine (default 0: Locust in one process)", int),
    Setting("rl_soak_remote_workers", "Locust workers from other machines the master also waits for (default 0)", int),
    Setting("rl_soak_turns", "turns of each rollout (default 4)", int, check="positive"),
    Setting("rl_soak_max_tokens", "tokens each turn generates at most (default 32)", int, check="positive"),
    Setting(
        "rl_soak_full_every",
        "every n-th swap loads a full snapshot, the others an ARC2 delta (default 5; 0: never)",
        int,
    ),
    Setting(
        "rl_soak_resets",
        "each swap's reset_prompt_cache, in turn (default all)",
        list,
        metavar="all|new_session|none ...",
    ),
    # the exporter gate (--rl-snapshot)
    Setting("rl_parent", "the parent snapshot: --rl-snapshot is an ARC2 diff of it", metavar="DIR"),
    Setting("rl_signal", "the hot-load request body (JSON file) announcing --rl-snapshot", metavar="FILE"),
    Setting(
        "rl_after_ledger_reset",
        "the deployment's ledger was just reset (the snapshot must then be full: SNAP-INC-7)",
        bool,
    ),
    Setting("rl_base_models", "names adapter_config.json may use for the base model", list, metavar="NAME ..."),
    Setting("rl_check_model_type", "ask transformers whether it knows config.json's model_type (default true)", bool),
)
SETTING = {s.key: s for s in SETTINGS}


def option_arguments(s: Setting) -> tuple[tuple[str, ...], dict[str, Any]]:
    """`add_argument`'s arguments for a setting's command-line option (pytest's and argparse's)."""
    if s.kind is bool:
        return (s.option,), {"dest": s.key, "action": "store_true", "default": False, "help": s.help}
    names = (s.option, "--rl-base") if s.key == "rl_base_snapshot" else (s.option,)  # --rl-base: its old spelling
    more = {"choices": list(s.choices)} if s.choices else {"metavar": s.metavar}
    return names, {"dest": s.key, "help": s.help, **more}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("rlrollout", "RL-rollout deployment contract")
    for s in SETTINGS:
        if s.option:
            names, kwargs = option_arguments(s)
            group.addoption(*names, **kwargs)
        if s.ini:
            parser.addini(
                s.key, s.help, type="args" if s.kind is list else "string", default=[] if s.kind is list else ""
            )


def setting(config: pytest.Config, key: str) -> Any:
    """A setting's value: the command-line option when given, else the ini key (None when unset)."""
    s = SETTING[key]
    if s.option is not None and config.getoption(key) not in (None, False):
        return config.getoption(key)
    return s.parse(config.getini(key)) if s.ini else None


def read_options(config: pytest.Config) -> RLConfig:
    """The settings of this run, checked; raises pytest.UsageError naming what to fix."""

    def get(key: str) -> Any:
        return setting(config, key)

    record, replay = get("rl_record"), get("rl_replay")
    if record and get("rl_record_mode") == "none":
        record, replay = None, record
    if record and replay:
        _usage("--rl-record and --rl-replay exclude each other")
    base = _directory(get("rl_base_snapshot"), "--rl-base-snapshot", need="config.json")
    common: dict[str, Any] = dict(
        base_snapshot=base,
        level=get("rl_level") or "should",
        report=Path(get("rl_report")) if get("rl_report") else None,
        record=Path(record) if record else None,
        record_mode=get("rl_record_mode") or "rewrite",
        transition=get("rl_transition"),
        numerics=_numerics(config, base),
        soak=_soak_options(config),
        **_gate_options(config),
    )
    deployment = get("rl_deployment")
    if replay:
        return _replay_options(config, replay, common)
    if deployment == "local" or not (deployment or get("rl_base_url") or get("rl_fleet_urls")):
        if get("rl_engine") not in (None, "auto", *DIALECTS):  # an engine the bundled deployment does not speak
            _usage(
                f"--rl-engine={get('rl_engine')}: also pass --rl-base-url (the server) and --rl-model (what it serves)"
            )
        return _local_options(config, common)
    return _live_options(config, deployment, common)


def _replay_options(config: pytest.Config, replay: str, common: dict[str, Any]) -> RLConfig:
    # the deployment's further description (rl_inference_url, rl_control_url) is ini keys: left alone
    given = _given(
        config, "rl_deployment", "rl_base_url", "rl_bucket_url", "rl_local_faults", "rl_local_vllm_release", "rl_engine"
    )
    if given:
        _usage(f"--rl-replay replays a recorded run and talks to no deployment; drop {', '.join(given)}")
    directory = cassette_dir(replay)
    meta = _session_meta(directory)
    # answers come from the cassette at once: polling needs no interval; stream lengths are the recording's
    recorded = LIVE if meta.get("recorded_mode") == "live" else LOCAL
    timeouts = LOCAL.with_(poll=0.0, probe=0.0, retry=0.0, hold=0.0, long_stream_tokens=recorded.long_stream_tokens)
    common["transition"] = common["transition"] or meta.get("transition")
    # judged as recorded: with the precision the recording's deployment served in (float32: the reference's)
    served = meta.get("served_dtype") or ("float32" if meta.get("recorded_mode") == "local" else None)
    common["numerics"] = _numerics(config, common["base_snapshot"], served=served)
    # the tests the recording ran, on the swaps it made: a core run's shared swaps are replayed shared
    budget = Budget(profile=meta.get("profile") or "full")
    return RLConfig(
        mode="replay",
        deployment=meta["deployment"],
        base_url=None,
        inference_url=None,
        model=meta.get("model"),
        replay=directory,
        replay_meta=meta,
        allow_hot_load=True,
        budget=budget,
        engine=meta.get("engine", DEFAULT),
        timeouts=_timeouts(config, timeouts),
        **common,
    )


def _local_options(config: pytest.Config, common: dict[str, Any]) -> RLConfig:
    stray = _given(
        config, "rl_inference_url", "rl_control_url", "rl_fleet_urls", "rl_model", "rl_bucket_url", "rl_api_key"
    )
    if stray:
        _usage(f"{', '.join(stray)} describe a live deployment; also pass --rl-deployment=accounts/<a>/deployments/<d>")
    faults = frozenset(setting(config, "rl_local_faults") or ())
    if faults:
        from pytest_rlrollout.reference.faults import check_faults

        try:
            check_faults(faults)
        except ValueError as e:
            _usage(f"rl_local_faults: {e}")
    common["transition"] = common["transition"] or "ASYNC"
    given = setting(config, "rl_engine")
    engine = given if given in DIALECTS else DEFAULT  # the bundled deployment's dialect (auto: its default)
    release = setting(config, "rl_local_vllm_release")
    if release is not None and engine != vllm.NAME:
        _usage(f"rl_local_vllm_release is the {vllm.ENGINE.title} dialect's: also pass --rl-engine={vllm.NAME}")
    budget = _budget(functools.partial(setting, config), allow=True)
    common["numerics"] = _numerics(config, common["base_snapshot"], served="float32")  # the reference's numpy engine
    return RLConfig(
        mode="local",
        deployment=None,
        base_url=None,
        inference_url=None,
        model=None,
        local_faults=faults,
        local_vllm_release=release,
        allow_hot_load=True,
        budget=budget,
        engine=engine,
        timeouts=_timeouts(config, LOCAL),
        **common,
    )


def _live_options(config: pytest.Config, deployment: str | None, common: dict[str, Any]) -> RLConfig:
    def get(key: str) -> Any:
        return setting(config, key)

    engine: Engine | None = None if get("rl_engine") in (None, "auto") else get("rl_engine")
    # the engine given, or the one its names point to before the preflight asks (a UUID: CoreWeave's)
    named = spec(engine or presumed(deployment=deployment, uuid=_is_uuid(deployment)))
    controlled = named.control_plane
    if deployment is not None and not (
        _is_uuid(deployment) if named.names == "uuid" else _is_deployment_name(deployment)
    ):
        _usage(
            f"--rl-deployment {deployment!r} is not "
            + (
                f"a {named.title} deployment's UUID"
                if named.names == "uuid"
                else "accounts/<account>/deployments/<deployment>"
            )
        )
    if engine is not None and named.names == "path" and deployment is None:
        _usage(f"--rl-engine={engine}: also pass --rl-deployment=accounts/<a>/deployments/<d>")
    if get("rl_control_url") and not controlled:
        control_plane = with_control_plane()
        _usage(
            f"rl_control_url is {control_plane.title}'s hot-load API: also pass --rl-engine={control_plane.name} "
            "(or auto) and --rl-deployment=<the deployment's UUID>"
        )
    control: dict[str, Any] = {}
    if controlled:  # its control plane and gateway are two hosts with keys of their own
        control = _control_plane(config, deployment)
    for local in ("rl_local_faults", "rl_local_vllm_release"):
        if get(local):
            _usage(
                f"{local} configures the bundled reference deployment; it cannot apply to "
                f"{deployment or get('rl_base_url')}"
            )
    model = get("rl_model")
    if not model:
        _usage(f"{'--rl-deployment' if deployment else '--rl-base-url'}: also pass --rl-model (the model it serves)")
    key = get("rl_api_key") or (None if controlled else os.environ.get("FIREWORKS_API_KEY"))
    if not key and named.model_is_name and deployment is not None:
        _usage(f"--rl-deployment {deployment}: pass --rl-api-key or set FIREWORKS_API_KEY")
    bucket_url, allow = get("rl_bucket_url"), get("rl_allow_hot_load")
    budget = _budget(get, allow=bool(allow))
    if budget.plan is not None:  # a plan changes nothing and needs no permission; it prices what a run would load
        allow = True
    if allow and not bucket_url:
        _usage("--rl-allow-hot-load: also pass --rl-bucket-url (where the suite uploads the snapshots it swaps in)")
    if allow and common["base_snapshot"] is None:
        _usage(
            "--rl-allow-hot-load: also pass --rl-base-snapshot (a local copy of the served base, to build "
            "the snapshots it swaps in)"
        )
    store = _store(get)
    if bucket_url:
        from pytest_rlrollout.remote.bucket import Bucket, BucketError

        try:
            bucket = Bucket(bucket_url, store)
            if allow:  # one question to the store now, not a failure in every swap test
                bucket.check()
        except (ValueError, BucketError) as e:
            _usage(f"--rl-bucket-url: {e}")
    fleet = tuple(u.rstrip("/") for u in (get("rl_fleet_urls") or "").split())
    base_url = (get("rl_base_url") or (fleet[0] if fleet else DEFAULT_BASE_URL)).rstrip("/")
    if fleet and base_url not in fleet:
        _usage(f"rl_fleet_urls names the fleet's engines; --rl-base-url {base_url} is none of them (pass the first)")
    return RLConfig(
        mode="live",
        deployment=deployment,
        base_url=base_url,
        model=model,
        api_key=Secret(key or ""),
        inference_url=get("rl_inference_url"),
        allow_hot_load=bool(allow),
        bucket_url=bucket_url,
        budget=budget,
        store=store,
        engine=engine,
        timeouts=_timeouts(config, LIVE),
        fleet_urls=fleet,
        **control,
        **common,
    )


def _budget(get: Callable[[str], Any], *, allow: bool) -> Budget:
    """The profile and limits of a live run; a profile that changes state needs --rl-allow-hot-load
    (a plan does not: it changes nothing)."""
    plan = Path(get("rl_plan")) if get("rl_plan") else None
    profile = get("rl_profile") or ("full" if allow or plan is not None else "read-only")
    if profile != "read-only" and not allow and plan is None and get("rl_profile"):
        _usage(
            f"rl_profile = {profile} changes what the deployment serves: also pass --rl-allow-hot-load "
            "(or see what it would do with `rlrollout plan`)"
        )
    for key in ("rl_max_swaps", "rl_max_full_uploads", "rl_max_upload_bytes"):
        if get(key) is not None and get(key) < 0:
            _usage(f"{key} is a count, not {get(key)}")
    return Budget(
        profile=profile,
        swaps=get("rl_max_swaps"),
        upload_bytes=get("rl_max_upload_bytes"),
        full_uploads=get("rl_max_full_uploads"),
        swap_seconds=get("rl_swap_seconds"),
        plan=plan,
    )


def _store(get: Callable[[str], Any]) -> Store:
    """The object store settings (`rl_bucket_*`)."""
    raw = get("rl_bucket_options")
    options: Any = {}
    if raw:
        try:
            options = json.loads(raw)
        except ValueError as e:
            _usage(f'rl_bucket_options is not JSON ({e}): give an object, e.g. {{"requester_pays": true}}')
        if not isinstance(options, dict):
            _usage(f"rl_bucket_options is a JSON object of fsspec storage options, not {type(options).__name__}")
    return Store(
        endpoint_url=get("rl_bucket_endpoint_url"),
        profile=get("rl_bucket_profile"),
        concurrency=get("rl_bucket_concurrency") or Store.concurrency,
        options=options,
    )


def _control_plane(config: pytest.Config, deployment: str | None) -> dict[str, Any]:
    """The control plane of the engine that has one of its own (CoreWeave's): its URL and its own
    key (never a setting: a key typed on a command line stays in the shell's history and the
    process list, one in an ini file in git)."""
    control_plane = with_control_plane()
    if deployment is None:
        _usage(
            f"--rl-engine={control_plane.name}: also pass --rl-deployment=<the deployment's UUID> (what its "
            "hot-loads name)"
        )
    what = (
        f"--rl-engine={control_plane.name}"
        if setting(config, "rl_engine") == control_plane.name
        else f"--rl-deployment {deployment} ({control_plane.title})"
    )
    if not setting(config, "rl_base_url"):
        _usage(f"{what}: also pass --rl-base-url (the deployment's OpenAI-compatible gateway)")
    key = os.environ.get("COREWEAVE_API_KEY")
    if not key:
        _usage(f"{what}: set COREWEAVE_API_KEY (the hot-load API's key)")
    if setting(config, "rl_record") and key != (setting(config, "rl_api_key") or ""):
        # a cassette keeps one key out of what it holds; two would leave one to chance
        _usage(
            "--rl-record: recording a CoreWeave deployment whose gateway and hot-load API have different keys "
            "is not supported"
        )
    url = (setting(config, "rl_control_url") or DEFAULT_CONTROL_URL).rstrip("/")
    return {"control_url": url, "control_key": Secret(key)}


def _is_uuid(name: str | None) -> bool:
    return name is not None and re.fullmatch(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", name) is not None


def _is_deployment_name(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 4 and parts[0] == "accounts" and parts[2] == "deployments" and all(parts)


def _given(config: pytest.Config, *keys: str) -> list[str]:
    """The settings among `keys` given for this run: an option typed on the command line (its
    ini key names the project's usual deployment, which a replay or a local run leaves alone), or
    an ini-only key with a value."""
    return [SETTING[k].option or k for k in keys if (config.getoption(k) if SETTING[k].option else setting(config, k))]


def _timeouts(config: pytest.Config, profile: Timeouts) -> Timeouts:
    """The profile with the waits the settings give, and the waits that follow them: a rollout
    is taken for stalled after the same share of a longer swap timeout, and the probes and the
    first poll go no faster than the status poll interval."""
    get = functools.partial(setting, config)
    swap, poll = get("rl_swap_timeout"), get("rl_poll_interval")
    stalled = None if swap is None else profile.stalled_after * swap / profile.swap
    polls = {} if poll is None else {"poll": poll, "probe": poll, "first_poll": min(profile.first_poll, poll)}
    return profile.with_(
        swap=swap,
        long_stream_tokens=get("rl_long_stream_tokens"),
        stalled_after=stalled,
        exchange=get("rl_exchange_timeout"),
        test=get("rl_test_timeout"),
        **polls,
    )


def _numerics(config: pytest.Config, base: Path | None, served: str | None = None) -> Numerics:
    """The numbers' settings: the tolerances of the precision served (`rl_served_dtype`, else
    `served`: what the deployment is known to compute in, else the base's config.json, else
    float32), each one an ini key sets taken instead."""
    from pytest_rlrollout.numerics.tolerances import dtype_name, served_dtype

    get = functools.partial(setting, config)
    dtype, said = get("rl_served_dtype"), "rl_served_dtype"
    if dtype is None and served is not None:
        dtype, said = served, "the deployment's"
    if dtype is None and base is not None:
        dtype, said = served_dtype(json.loads((base / "config.json").read_text())), "the base's config.json"
    t = TOLERANCES[dtype_name(dtype or "float32")]  # every one named here has figures (the key's choices)
    source = f"{t.dtype} ({said if dtype else 'no dtype declared'}): {t.source}"
    given = {
        "fingerprint_tolerance": get("rl_fingerprint_tolerance"),
        "logprob_tolerance": get("rl_logprob_tolerance"),
        "min_route_agreement": get("rl_min_route_agreement"),
        "tokens": get("rl_numerics_tokens"),
        "scorer": get("rl_scorer"),
        "scorer_device": get("rl_scorer_device"),
    }
    if given["fingerprint_tolerance"] is not None or given["logprob_tolerance"] is not None:
        source += "; set by rl_*_tolerance where given"
    resolved = Numerics(fingerprint_tolerance=t.fingerprint, logprob_tolerance=t.logprob, dtype=t.dtype, source=source)
    return replace(resolved, **{k: v for k, v in given.items() if v is not None})


def _soak_options(config: pytest.Config) -> dict[str, Any] | None:
    """The soak's settings (rl_soak true), by `soak.run.Settings`'s field names (only those given); None without it."""
    if not setting(config, "rl_soak"):
        return None
    given = {k.removeprefix("rl_soak_"): setting(config, k) for k in SETTING if k.startswith("rl_soak_")}
    out = {k: v for k, v in given.items() if v is not None}
    if "resets" in out:
        bad = [r for r in out["resets"] if r not in ("all", "new_session", "none")]
        if bad or not out["resets"]:
            _usage(f"rl_soak_resets = {out['resets']}: each one of all, new_session, none")
        out["resets"] = tuple(out["resets"])
    negative = [k for k in ("swaps", "workers", "remote_workers", "full_every") if out.get(k, 0) < 0]
    if negative:
        _usage(f"{', '.join('rl_soak_' + k for k in negative)}: 0 or more")
    return out


def _gate_options(config: pytest.Config) -> dict[str, Any]:
    get = functools.partial(setting, config)
    signal = None
    if get("rl_signal"):
        from pytest_rlrollout.snapshot.validate import load_signal

        try:  # read as untrusted: a regular file, bounded in size and in JSON depth
            signal = load_signal(get("rl_signal"))
        except (OSError, ValueError) as e:
            _usage(f"rl_signal: cannot read a JSON body ({e})")
    return dict(
        snapshot=_directory(get("rl_snapshot"), "--rl-snapshot"),
        parent=_directory(get("rl_parent"), "rl_parent"),
        signal=signal,
        after_ledger_reset=bool(get("rl_after_ledger_reset")),
        base_models=tuple(get("rl_base_models") or ()),
        hf_config=get("rl_check_model_type") is not False,
    )


def _directory(value: str | None, option: str, need: str | None = None) -> Path | None:
    if not value:
        return None
    path = Path(value)
    if not path.is_dir():
        _usage(f"{option} {value}: not a directory")
    if need and not (path / need).is_file():
        _usage(f"{option} {value}: no {need} in it")
    return path


def cassette_dir(value: str | os.PathLike[str]) -> Path:
    """A cassette directory, or the name of a set shipped with the package (`reference`)."""
    path = Path(value)
    if not path.is_dir() and (SHIPPED_CASSETTES / str(value)).is_dir():
        path = SHIPPED_CASSETTES / str(value)
    if not path.is_dir():
        shipped = ", ".join(sorted(p.name for p in SHIPPED_CASSETTES.iterdir() if p.is_dir()))
        _usage(f"--rl-replay {value}: no such directory (shipped sets: {shipped})")
    return path


def _session_meta(directory: Path) -> dict[str, Any]:
    """The recording's meta, checked: a cassette directory may come from anyone, and its values
    become file names, snapshot identities and URLs."""
    from pytest_rlrollout.remote.cassette import Cassette
    from pytest_rlrollout.remote.cassette_file import CassetteError

    session = directory / "_session.json"
    if not session.is_file():
        _usage(f"--rl-replay {directory}: no _session.json (record a run with --rl-record first)")
    try:
        meta = Cassette.load(session).meta
    except CassetteError as e:
        _usage(f"--rl-replay {directory}: {e}")
    wrong = meta_problems(meta)
    if wrong:
        _usage(f"--rl-replay {directory}: _session.json is not a recorded session: {wrong[0]}")
    return meta


RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # it becomes part of snapshot identities and file names
DEPLOYMENT = re.compile(r"accounts/[A-Za-z0-9_.-]{1,128}/deployments/[A-Za-z0-9_.-]{1,128}")


def meta_problems(meta: Any) -> list[str]:
    """What is wrong with a recording's meta (empty: nothing)."""
    if not isinstance(meta, dict):
        return ["its meta is not an object"]
    checks = {
        "run_id": lambda v: isinstance(v, str) and RUN_ID.fullmatch(v),
        "deployment": lambda v: v is None or (isinstance(v, str) and DEPLOYMENT.fullmatch(v)),
        "model": lambda v: isinstance(v, str) and 0 < len(v) <= 512 and v.isprintable(),
        "engine": lambda v: v is None or v in ENGINES,
        # the directory a path-loading engine was told to read snapshots from: printable, no NUL
        "served_bucket": lambda v: v is None or (isinstance(v, str) and 0 < len(v) <= 4096 and v.isprintable()),
        "transition": lambda v: v in (None, "ASYNC", "SYNC"),
        "recorded_mode": lambda v: v in (None, "local", "live"),
        "served_dtype": lambda v: v is None or v in TOLERANCES,
        "profile": lambda v: v is None or v in PROFILES,
        "discovery": lambda v: v is None or _discovery_ok(v),
    }
    required = ("run_id", "deployment", "model")
    problems = [f"meta.{k} is missing" for k in required if k not in meta]
    problems += [
        f"meta.{k} is not allowed: {str(meta[k])[:80]!r}" for k, ok in checks.items() if k in meta and not ok(meta[k])
    ]
    engine = meta.get("engine") or DEFAULT
    if engine in ENGINES and spec(engine).names == "path" and meta.get("deployment") is None:
        problems.append("meta.deployment is missing: a Fireworks recording names its deployment")
    return problems


def _discovery_ok(d: Any) -> bool:
    from pytest_rlrollout.contract.capabilities import CAPABILITIES

    return (
        isinstance(d, dict)
        and d.keys() - {"start", "version", "routes"}
        == {"engine", "decided", "capabilities", "seen", "replicas", "transition"}
        and d["engine"] in ENGINES
        and isinstance(d["decided"], str)
        and isinstance(d["capabilities"], dict)
        and all(k in CAPABILITIES and isinstance(v, bool) for k, v in d["capabilities"].items())
        and isinstance(d["seen"], dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in d["seen"].items())
        and isinstance(d["replicas"], int)
        and d["transition"] in (None, "ASYNC", "SYNC")
        and _start_ok(d.get("start"))
        and (d.get("version") is None or (isinstance(d["version"], str) and 0 < len(d["version"]) <= 40))
        and _routes_ok(d.get("routes", []))
    )


def _routes_ok(routes: Any) -> bool:
    """Recorded engine routes: a few paths."""
    return (
        isinstance(routes, list)
        and len(routes) <= 8
        and all(isinstance(r, str) and r.startswith("/") and len(r) <= 100 for r in routes)
    )


def _start_ok(start: Any) -> bool:
    """A recorded start fingerprint: an identity and rows of numbers, no bigger than a canary set."""
    if start is None:
        return True
    rows = start.get("logprobs") if isinstance(start, dict) else None
    return (
        isinstance(start, dict)
        and start.keys() == {"identity", "logprobs"}
        and isinstance(start["identity"], str)
        and 0 < len(start["identity"]) <= 512
        and isinstance(rows, list)
        and len(rows) <= 64
        and all(isinstance(r, list) and len(r) <= 4096 for r in rows)
        and all(isinstance(x, float | int) and not isinstance(x, bool) for r in rows for x in r)
    )


def _usage(message: str):
    raise pytest.UsageError(message)


OPTIONS = pytest.StashKey[RLConfig]()


def options(config: pytest.Config) -> RLConfig:
    """This run's options (read in pytest_configure)."""
    return config.stash[OPTIONS]
