"""The settings table: every setting of a run once (`SETTINGS`), as an ini key and, for the
dozen a person types on each run, a `--rl-*` option too. The plugin registers them
(`add_options`), `rlrollout conformance --help` lists them (`option_arguments`), the docs'
settings reference is written from them, and `setting` reads one, typed and checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import pytest

from pytest_rlrollout.engines import ENGINES, vllm
from pytest_rlrollout.numerics.tolerances import TOLERANCES
from pytest_rlrollout.remote.bucket import Store
from pytest_rlrollout.snapshot.layout import parse_size as byte_size
from pytest_rlrollout.suite.run_config import DEFAULT_BASE_URL, DEFAULT_CONTROL_URL, PROFILES, Numerics


def usage(message: str) -> NoReturn:
    """End the run before collection with `message` (pytest's usage error, exit 4)."""
    raise pytest.UsageError(message)


@dataclass(frozen=True)
class Setting:
    """One setting of a run: an ini key (`[tool.pytest.ini_options]`, pytest.ini, `-o key=value`),
    and for the dozen a person types on each run, a command-line option too (which wins)."""

    key: str  # the ini key, and the option's dest
    help: str
    kind: type | Callable[[str], int] = str  # str | float | int | bool | list (whitespace-separated words) | byte_size
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
            value: Any = _PARSERS.get(self.kind, str)(text)
        except ValueError:
            usage(f"{self.key} = {text!r} is not {_KIND_WORDS[self.kind]} ({self.example})")
        if self.choices:  # ASYNC or async alike
            value = next((c for c in self.choices if c.lower() == text.lower()), None)
            if value is None:
                usage(f"{self.key} = {text!r}: one of {', '.join(self.choices)}")
        if self.check == "positive" and not value > 0:  # `not >`: NaN is not positive either
            usage(f"{self.key} must be positive, not {text}")
        if self.check == "fraction" and not 0 <= value <= 1:
            usage(f"{self.key} is a fraction in [0, 1], not {text}")
        return value


_KIND_WORDS: dict[Any, str] = {
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


# how an ini value of each kind is read (any other: as the text it is)
_PARSERS: dict[Any, Callable[[str], Any]] = {float: float, int: int, bool: _boolean, byte_size: byte_size}


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
    assert s.option is not None, f"{s.key} is an ini key only"
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
            kind: Literal["args", "string"] = "args" if s.kind is list else "string"
            parser.addini(s.key, s.help, type=kind, default=[] if s.kind is list else "")


def setting(config: pytest.Config, key: str) -> Any:
    """A setting's value: the command-line option when given, else the ini key (None when unset)."""
    s = SETTING[key]
    if s.option is not None and config.getoption(key) not in (None, False):
        return config.getoption(key)
    return s.parse(config.getini(key)) if s.ini else None
