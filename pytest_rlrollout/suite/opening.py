"""The `rl_deployment` fixture: the deployment under test opened once per process (local, live or
replay, `suite.connecting`), what it offers discovered (the controller's preflight, the
recording's, or probed here), and when recording, the session's meta written at the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from pytest_rlrollout.suite.connecting import live_deployment, local_deployment, replayed_deployment
from pytest_rlrollout.suite.deployment import RLDeployment
from pytest_rlrollout.suite.run_config import RLConfig
from pytest_rlrollout.suite.run_start import fingerprint_start, run_id, run_state
from pytest_rlrollout.suite.run_state import Served
from pytest_rlrollout.suite.stash import DISCOVERED, WORKER_DISCOVERY

if TYPE_CHECKING:
    from pytest_rlrollout.remote.discovery import Discovery


@pytest.fixture(scope="session")
def rl_deployment(
    rl_config: RLConfig, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RLDeployment]:
    """The deployment under test (`--rl-deployment`); the bundled reference deployment by
    default; recorded with `--rl-record DIR`, or replayed offline with `--rl-replay DIR`."""
    config = request.config
    opts = rl_config
    opened = {
        "local": lambda: local_deployment(opts, tmp_path_factory),
        "live": lambda: live_deployment(opts, preflighted(config).engine, config),
        "replay": lambda: replayed_deployment(opts, tmp_path_factory),
    }[opts.mode]
    with opened() as dep:
        dep.discovery = config.stash[DISCOVERED] = discovered(config, dep)
        dep.run_id = run_id(config)
        if dep.mode == "live":  # for the report's restore instructions
            run_state(config).started(Served(dep.replicas()))
        yield dep
        if dep.mode == "live":
            # nothing answering (an rl_breaks test may leave the deployment dead): nothing served
            run_state(config).ended(Served(dep.replicas_if_answering() or []))
        cassettes = dep.cassettes
        if cassettes is not None and cassettes.mode == "record":
            served_bucket = getattr(dep.driver, "bucket", None)  # part of the recorded load requests
            if served_bucket is not None:
                cassettes.session.meta["served_bucket"] = served_bucket
            cassettes.session.meta.update(
                deployment=dep.target.deployment,
                model=dep.target.model,
                recorded_mode=dep.mode,
                transition=dep.discovery.transition,
                engine=dep.engine,
                discovery=dep.discovery.as_dict(),
                run_id=dep.run_id,
                served_dtype=dep.options.numerics.dtype,
                profile=dep.options.budget.profile,
            )
            cassettes.session.write(dep.target.api_key)


def preflighted(config: pytest.Config) -> Discovery:
    """What the controller's preflight found (a live run): here, or shipped to this xdist worker."""
    from pytest_rlrollout.remote.discovery import Discovery

    if DISCOVERED not in config.stash:
        config.stash[DISCOVERED] = Discovery.from_dict(json.loads(config.workerinput[WORKER_DISCOVERY]))  # type: ignore[attr-defined]
    return config.stash[DISCOVERED]


def discovered(config: pytest.Config, dep: RLDeployment) -> Discovery:
    """The deployment's capabilities: from the controller's preflight (live), the recording
    (replay), or probed here (the local reference deployment, one per worker)."""
    from pytest_rlrollout.remote.discovery import Discovery

    recorded = dep.options.replay_meta or {}
    if dep.mode == "live":
        found = preflighted(config)
    elif dep.mode == "replay" and "discovery" in recorded:
        found = Discovery.from_dict(recorded["discovery"])
    else:
        found = dep.driver.discover(transition=dep.options.transition, decided="the bundled reference deployment")
        if dep.mode == "local":  # a recording without its discovery holds no such exchanges
            fingerprint_start(dep.driver, found, dep.base_snapshot)
        return found
    dep.driver.adopt(found)
    return found
