"""A run's start and what it leaves: the directory its processes share (`run_dir`), its state
records (`run_state`), its id (`run_id`: a recording's when replaying or adding to one), the
canary set scored on the served base before any test (`fingerprint_start`), and after a live
run that changed what is served, the start served again (`restore_start`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_rlrollout.suite.connecting import connect
from pytest_rlrollout.suite.options import options
from pytest_rlrollout.suite.recorded_session import usable_run_id
from pytest_rlrollout.suite.run_config import RLConfig
from pytest_rlrollout.suite.run_state import Cleanup, Restored, RunState
from pytest_rlrollout.suite.stash import DISCOVERED

if TYPE_CHECKING:
    from pytest_rlrollout.engines import Engine
    from pytest_rlrollout.remote.discovery import Discovery
    from pytest_rlrollout.remote.drivers import Driver
    from pytest_rlrollout.remote.fingerprint import Fingerprint


def run_dir(config: pytest.Config) -> Path:
    """A directory shared by the controller and every xdist worker of this run."""
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return base.parent if hasattr(config, "workerinput") else base


def run_state(config: pytest.Config) -> RunState:
    """What a live run leaves for its report (start, ends, restore, cleanups), typed."""
    return RunState(run_dir(config) / "rl-state")


def base_served_now(driver: Driver, base: Path) -> str | None:
    """The identity under which every replica serves the base snapshot `base` now, or None: the
    base's own identity (its directory's name), or the engine's start label when the engine was
    started from that directory (vLLM's "default")."""
    served = {r.get("current_snapshot_identity") for r in driver.replicas()}
    label = served.pop() if len(served) == 1 else None
    if not isinstance(label, str):
        return None
    if label == base.name:
        return label
    started = driver.started_from() if label == driver.start_label() else None
    return label if started is not None and Path(started).resolve() == base.resolve() else None


def fingerprint_start(driver: Driver, found: Discovery, base: Path | None) -> None:
    """Before any test loads anything: the canary set scored on the base, when the deployment
    serves it (`found.start`; FID-SAME-1 compares every later load path of the base with it, and
    the restore at the end of a live run its result). Nothing when the base is unknown or not
    served, or the canaries cannot be scored (the FID tests, scoring them again, say why)."""
    if base is None or not all(map(found.has, ("logprobs", "echo", "token_id_prompts"))):
        return
    label = base_served_now(driver, base)
    scored = _canaries(driver, base) if label is not None else None
    if scored is not None:
        found.start = {"identity": label, "logprobs": [list(row) for row in scored.logprobs]}


def _canaries(driver: Driver, base: Path) -> Fingerprint | None:
    """The canary set scored now, under an isolation key of its own (no KV of this or any run
    takes part); None when the answers cannot be read as a fingerprint."""
    import uuid

    from pytest_rlrollout.remote.fingerprint import FingerprintError, fingerprint

    config = base / "config.json"
    vocab = json.loads(config.read_text()).get("vocab_size") if config.is_file() else None
    try:
        return fingerprint(driver, f"rlrollout-start-{uuid.uuid4().hex}", vocab=vocab)
    except FingerprintError:
        return None


def _restored_numbers(driver: Driver, found: Discovery | None, label: str, opts: RLConfig) -> str:
    """Whether the restored weights score as the start's did (where the start was fingerprinted)."""
    from pytest_rlrollout.remote.fingerprint import Fingerprint

    if found is None or found.start is None or found.start["identity"] != label or opts.base_snapshot is None:
        return ""
    now = _canaries(driver, opts.base_snapshot)
    if now is None:
        return "; the canary set could not be scored again to compare the numbers"
    start = Fingerprint.of(found.start["logprobs"])
    tolerance = opts.numerics.fingerprint_tolerance
    if now.same(start, tolerance):
        return f"; the weights score as at the start ({now.describe(start)} <= {tolerance:g})"
    return (
        f"; but the weights do not score as at the start: {now.describe(start)} > {tolerance:g} (the label "
        f"is back, the start's weights are not)"
    )


def restore_start(config: pytest.Config, engine: Engine) -> None:
    """After a live run that changed what is served: what the engine's driver can do to serve the
    start's snapshot again (vLLM: reload the directory the server started from and set the start
    label back), written down beside the start and end states for the report."""
    import httpx

    from pytest_rlrollout.remote.limits import LimitExceeded

    opts = options(config)
    state = run_state(config)
    start = state.start if opts.mode == "live" and opts.allow_hot_load else None
    label = start.label if start is not None else None
    if label is None:
        return
    with connect(opts, engine) as driver:
        try:
            if driver.replicas() and {r.get("current_snapshot_identity") for r in driver.replicas()} == {label}:
                return
            done = driver.restore(label)
            if done is not None:
                done += _restored_numbers(driver, config.stash.get(DISCOVERED, None), label, opts)
            after = driver.replicas()
        except (httpx.HTTPError, LimitExceeded) as e:  # e.g. a deployment a refused load left broken
            done, after = f"the start could not be restored: {type(e).__name__}: {e}", []
    if done is None:
        return
    state.restored(Restored(after, restored=done))
    if after and {r.get("current_snapshot_identity") for r in after} == {label}:
        _remove_kept(state, opts)


def _remove_kept(state: RunState, opts: RLConfig) -> None:
    """Once the start is served again, what the run kept because it was served at the end goes."""
    from pytest_rlrollout.remote.bucket import Bucket

    kept = sorted({i for c in state.cleanups for i in c.kept})
    if kept and opts.bucket_url:
        bucket = Bucket(opts.bucket_url, opts.store)
        for identity in kept:
            bucket.remove(identity)
        state.cleaned(Cleanup(kept, []), name="restored")


def run_id(config: pytest.Config) -> str:
    """Unique per run; in replay, the recording's; when adding to existing cassettes
    (rl_record_mode = once), theirs, so that old and new cassettes name the same snapshots."""
    opts = options(config)
    if opts.replay_meta is not None:
        return opts.replay_meta["run_id"]
    session = opts.record / "_session.json" if opts.record else None
    if session is not None and opts.record_mode == "once" and session.exists():
        return recorded_run_id(session)
    worker_uid = (getattr(config, "workerinput", {}) or {}).get("testrunuid")
    if worker_uid:
        return worker_uid[:8]
    import uuid

    marker = run_dir(config) / "rl-run-id"
    if not marker.exists():
        marker.write_text(uuid.uuid4().hex)
    return marker.read_text()[:8]


def recorded_run_id(session: Path) -> str:
    """The run id of the recording being added to, checked: it names snapshots and files."""
    from pytest_rlrollout.remote.cassette import Cassette
    from pytest_rlrollout.remote.cassette_file import CassetteError

    try:
        found = Cassette.load(session).meta.get("run_id")
    except CassetteError as e:
        raise pytest.UsageError(f"rl_record_mode = once: {e}") from None
    if not isinstance(found, str) or not usable_run_id(found):
        raise pytest.UsageError(f"rl_record_mode = once: {session} holds no usable run_id ({str(found)[:80]!r})")
    return found
