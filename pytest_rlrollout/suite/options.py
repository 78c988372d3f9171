"""Reading a run's configuration: the settings (`suite.settings`) read once into one typed
`RLConfig` (`suite.run_config`), kept in `config.stash` and handed out by the `rl_config` fixture.

Which deployment is under test (local / live / replay) is decided here and nowhere else, and
every usage error (a missing model, key or bucket, a replay directory that is not one, options
that contradict each other) ends the run before collection with one message.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_rlrollout.engines import DEFAULT, DIALECTS, Engine, presumed, spec, vllm, with_control_plane
from pytest_rlrollout.numerics.tolerances import TOLERANCES
from pytest_rlrollout.remote.bucket import Store
from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.shipped import shipped
from pytest_rlrollout.suite.recorded_session import cassette_dir, session_meta
from pytest_rlrollout.suite.run_config import (
    DEFAULT_BASE_URL,
    DEFAULT_CONTROL_URL,
    LIVE,
    LOCAL,
    Budget,
    Numerics,
    Profile,
    RLConfig,
    Timeouts,
)
from pytest_rlrollout.suite.settings import SETTING, setting, usage

CONFORMANCE = shipped("conformance")


def read_options(config: pytest.Config) -> RLConfig:
    """The settings of this run, checked; raises pytest.UsageError naming what to fix."""

    def get(key: str) -> Any:
        return setting(config, key)

    record, replay = get("rl_record"), get("rl_replay")
    if record and get("rl_record_mode") == "none":
        record, replay = None, record
    if record and replay:
        usage("--rl-record and --rl-replay exclude each other")
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
            usage(
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
        usage(f"--rl-replay replays a recorded run and talks to no deployment; drop {', '.join(given)}")
    directory = cassette_dir(replay)
    meta = session_meta(directory)
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
        usage(f"{', '.join(stray)} describe a live deployment; also pass --rl-deployment=accounts/<a>/deployments/<d>")
    faults = frozenset(setting(config, "rl_local_faults") or ())
    if faults:
        from pytest_rlrollout.reference.faults import check_faults

        try:
            check_faults(faults)
        except ValueError as e:
            usage(f"rl_local_faults: {e}")
    common["transition"] = common["transition"] or "ASYNC"
    given = setting(config, "rl_engine")
    engine = given if given in DIALECTS else DEFAULT  # the bundled deployment's dialect (auto: its default)
    release = setting(config, "rl_local_vllm_release")
    if release is not None and engine != vllm.NAME:
        usage(f"rl_local_vllm_release is the {vllm.ENGINE.title} dialect's: also pass --rl-engine={vllm.NAME}")
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
        usage(
            f"--rl-deployment {deployment!r} is not "
            + (
                f"a {named.title} deployment's UUID"
                if named.names == "uuid"
                else "accounts/<account>/deployments/<deployment>"
            )
        )
    if engine is not None and named.names == "path" and deployment is None:
        usage(f"--rl-engine={engine}: also pass --rl-deployment=accounts/<a>/deployments/<d>")
    if get("rl_control_url") and not controlled:
        control_plane = with_control_plane()
        usage(
            f"rl_control_url is {control_plane.title}'s hot-load API: also pass --rl-engine={control_plane.name} "
            "(or auto) and --rl-deployment=<the deployment's UUID>"
        )
    control: dict[str, Any] = {}
    if controlled:  # its control plane and gateway are two hosts with keys of their own
        control = _control_plane(config, deployment)
    for local in ("rl_local_faults", "rl_local_vllm_release"):
        if get(local):
            usage(
                f"{local} configures the bundled reference deployment; it cannot apply to "
                f"{deployment or get('rl_base_url')}"
            )
    model = get("rl_model")
    if not model:
        usage(f"{'--rl-deployment' if deployment else '--rl-base-url'}: also pass --rl-model (the model it serves)")
    key = get("rl_api_key") or (None if controlled else os.environ.get("FIREWORKS_API_KEY"))
    if not key and named.model_is_name and deployment is not None:
        usage(f"--rl-deployment {deployment}: pass --rl-api-key or set FIREWORKS_API_KEY")
    bucket_url, allow = get("rl_bucket_url"), get("rl_allow_hot_load")
    budget = _budget(get, allow=bool(allow))
    if budget.plan is not None:  # a plan changes nothing and needs no permission; it prices what a run would load
        allow = True
    if allow and not bucket_url:
        usage("--rl-allow-hot-load: also pass --rl-bucket-url (where the suite uploads the snapshots it swaps in)")
    if allow and common["base_snapshot"] is None:
        usage(
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
            usage(f"--rl-bucket-url: {e}")
    fleet = tuple(u.rstrip("/") for u in (get("rl_fleet_urls") or "").split())
    base_url = (get("rl_base_url") or (fleet[0] if fleet else DEFAULT_BASE_URL)).rstrip("/")
    if fleet and base_url not in fleet:
        usage(f"rl_fleet_urls names the fleet's engines; --rl-base-url {base_url} is none of them (pass the first)")
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
    # one of PROFILES: the setting's choices
    profile: Profile = get("rl_profile") or ("full" if allow or plan is not None else "read-only")
    if profile != "read-only" and not allow and plan is None and get("rl_profile"):
        usage(
            f"rl_profile = {profile} changes what the deployment serves: also pass --rl-allow-hot-load "
            "(or see what it would do with `rlrollout plan`)"
        )
    for key in ("rl_max_swaps", "rl_max_full_uploads", "rl_max_upload_bytes"):
        if get(key) is not None and get(key) < 0:
            usage(f"{key} is a count, not {get(key)}")
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
            usage(f'rl_bucket_options is not JSON ({e}): give an object, e.g. {{"requester_pays": true}}')
        if not isinstance(options, dict):
            usage(f"rl_bucket_options is a JSON object of fsspec storage options, not {type(options).__name__}")
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
        usage(
            f"--rl-engine={control_plane.name}: also pass --rl-deployment=<the deployment's UUID> (what its "
            "hot-loads name)"
        )
    what = (
        f"--rl-engine={control_plane.name}"
        if setting(config, "rl_engine") == control_plane.name
        else f"--rl-deployment {deployment} ({control_plane.title})"
    )
    if not setting(config, "rl_base_url"):
        usage(f"{what}: also pass --rl-base-url (the deployment's OpenAI-compatible gateway)")
    key = os.environ.get("COREWEAVE_API_KEY")
    if not key:
        usage(f"{what}: set COREWEAVE_API_KEY (the hot-load API's key)")
    if setting(config, "rl_record") and key != (setting(config, "rl_api_key") or ""):
        # a cassette keeps one key out of what it holds; two would leave one to chance
        usage(
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
            usage(f"rl_soak_resets = {out['resets']}: each one of all, new_session, none")
        out["resets"] = tuple(out["resets"])
    negative = [k for k in ("swaps", "workers", "remote_workers", "full_every") if out.get(k, 0) < 0]
    if negative:
        usage(f"{', '.join('rl_soak_' + k for k in negative)}: 0 or more")
    return out


def _gate_options(config: pytest.Config) -> dict[str, Any]:
    get = functools.partial(setting, config)
    signal = None
    if get("rl_signal"):
        from pytest_rlrollout.snapshot.validate import load_signal

        try:  # read as untrusted: a regular file, bounded in size and in JSON depth
            signal = load_signal(get("rl_signal"))
        except (OSError, ValueError) as e:
            usage(f"rl_signal: cannot read a JSON body ({e})")
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
        usage(f"{option} {value}: not a directory")
    if need and not (path / need).is_file():
        usage(f"{option} {value}: no {need} in it")
    return path


OPTIONS = pytest.StashKey[RLConfig]()


def options(config: pytest.Config) -> RLConfig:
    """This run's options (read in pytest_configure)."""
    return config.stash[OPTIONS]
