"""Swapping the deployment to new snapshots: the `rl_snapshots`, `rl_snapshot_factory` and `rl_swap` fixtures."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlrollout.contract.catalogue import catalogue
from pytest_rlrollout.suite.deployment import RLDeployment
from pytest_rlrollout.suite.holding import RLTest
from pytest_rlrollout.suite.outcomes import inconclusive
from pytest_rlrollout.suite.run_start import run_dir, run_id, run_state
from pytest_rlrollout.suite.run_state import Cleanup

if TYPE_CHECKING:
    import httpx

    from pytest_rlrollout.remote.replicas import Waited
    from pytest_rlrollout.runs.snapshots import Built, Op, SnapshotFactory
    from pytest_rlrollout.snapshot.cases import ReferenceCases
    from pytest_rlrollout.suite.evidence import Observed


@dataclass
class SwapResult:
    """How one swap went: the snapshot signalled, the answer to the signal, how the wait ended."""

    built: Built  # the snapshot signalled
    response: httpx.Response  # the answer to the signal
    waited: Waited | None  # how the wait ended; None when the signal was refused


class Swapper:
    """`rl_swap`: build the next snapshot and swap the deployment to it."""

    def __init__(self, deployment: RLDeployment, factory: SnapshotFactory, seen: Observed | None = None):
        self.deployment, self.factory = deployment, factory
        self.seen = seen  # the test's observations: its swaps are counted there (its plan's figures)

    def __call__(self, label: str = "step", change: dict[str, Op] | None = None, **signal: Any) -> SwapResult:
        """Swap to a new snapshot (a sentinel delta when possible) and wait. A swap that fails
        here is a precondition of the calling test, so the test is inconclusive, not failed."""
        return self.to(self.build(label, change), **signal)

    def to(self, built: Built, **signal: Any) -> SwapResult:
        """Swap to a snapshot already built, and wait; inconclusive when the swap fails."""
        return completed(self.signal(built, **signal))

    def build(self, label: str = "step", change: dict[str, Op] | None = None) -> Built:
        """The next snapshot, built and uploaded but not signalled."""
        return self.factory.step(self.deployment.serving(), label, change)

    def signal(self, built: Built, **signal: Any) -> SwapResult:
        """Signal `built` (with extra body fields) and wait until it is served or fails."""
        return self.follow(built, self.post(built, **signal))

    def post(self, built: Built, midway: Callable[[], None] | None = None, **signal: Any) -> httpx.Response:
        """Only the signal: tests that act between it and the rollout call `follow` after (or in
        `midway`, where the driver sequences the swap itself: see `Driver.load`)."""
        self.factory.signalled(built.identity)
        self.deployment.driver.swapping = True  # status reads paced until `follow` ends
        return self.deployment.hot_load({**built.signal, **signal}, midway=midway)

    def follow(
        self, built: Built, response: httpx.Response, progress: Callable[[list[dict[str, Any]]], None] | None = None
    ) -> SwapResult:
        """Wait until the signalled snapshot is served everywhere or fails (`progress` sees
        every status poll), and leave the deployment at rest either way."""
        try:
            return self._follow(built, response, progress)
        finally:
            self.deployment.driver.swapping = False

    def _follow(
        self, built: Built, response: httpx.Response, progress: Callable[[list[dict[str, Any]]], None] | None
    ) -> SwapResult:
        if response.status_code != 200:
            self.deployment.settle()
            return SwapResult(built, response, None)
        waited = self.deployment.wait_for(built.identity, lora=built.kind == "lora", progress=progress)
        if waited.ok and built.kind == "full":
            self.factory.loaded_full()
        if waited.ok and self.seen is not None:
            self.seen.swaps += 1
        if waited.ok:  # what no replica serves any more goes now, not at the end of the run
            self.factory.retire({i for r in waited.replicas for i in served_by(r)})
        if not waited.ok:
            self.deployment.settle()
        return SwapResult(built, response, waited)


def completed(result: SwapResult) -> SwapResult:
    """The swap a test relies on, served everywhere; inconclusive when it was not: a precondition
    of the test, not its clause."""
    if result.waited is None or not result.waited.ok:
        why = result.response.text[:300] if result.waited is None else result.waited.error
        inconclusive(f"the swap to {result.built.identity} did not complete ({why}); see HL-POST-1/HL-GET-2")
    return result


@pytest.fixture(scope="session")
def rl_snapshots(
    request: pytest.FixtureRequest, rl_deployment: RLDeployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SnapshotFactory | None]:
    """The run's one snapshot factory, shared by every test of the session, or None where the run
    has no bucket (--rl-bucket-url) or no base snapshot (--rl-base-snapshot). A test that swaps
    takes `rl_snapshot_factory` or `rl_swap` instead (they make it inconclusive, naming the missing
    option, and name its snapshots after it); a session fixture of one's own that drives swaps
    itself (the soak) takes this one. What it uploaded and no replica serves is removed at the
    end of the session."""
    from pytest_rlrollout.runs.snapshots import SnapshotFactory

    if rl_deployment.bucket is None or rl_deployment.base_snapshot is None:
        yield None
        return
    config = request.config
    record = run_dir(config) / f"rl-record-{hashlib.sha256(rl_deployment.key.encode()).hexdigest()[:12]}.json"
    made = SnapshotFactory(
        rl_deployment.base_snapshot,
        rl_deployment.bucket,
        tmp_path_factory.mktemp("rl-snapshots"),
        run_id(config),
        record,
        model=rl_deployment.target.model,
        incremental=rl_deployment.capabilities.has("incremental"),
        layout=catalogue()["SNAP-INDEX-2"].binds(rl_deployment.engine),
    )
    label = rl_deployment.driver.start_label()
    if label is not None and label in rl_deployment.served_identities():
        started = rl_deployment.driver.started_from()
        if started is not None and Path(started).resolve() == rl_deployment.base_snapshot.resolve():
            # the weights an engine started from, under its start label ("default" on vLLM), are the
            # base's, as a base copy named after its identity is on Fireworks
            made.know(label, {})
    yield made
    replicas = rl_deployment.replicas_if_answering()
    # a deployment that does not answer may still serve any of them: all kept (the report names them)
    served = set(made.uploaded) if replicas is None else {i for r in replicas for i in served_by(r)}
    removed, kept = made.cleanup(keep=served)
    if rl_deployment.mode == "live":
        run_state(config).cleaned(Cleanup(removed, kept))


@pytest.fixture(scope="session")
def rl_base_cases(
    request: pytest.FixtureRequest,
    rl_deployment: RLDeployment,
    rl_snapshots: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> ReferenceCases | None:
    """Valid snapshots of every kind of the model the deployment serves, which HL-POST-5's broken
    variants start from: the reference model's where it serves that model, else built from the
    run's base (`ReferenceCases.of`: what each writes follows what it changes); None without a
    snapshot factory."""
    if rl_snapshots is None:
        return None
    reference = request.getfixturevalue("rl_reference_cases")
    if rl_deployment.base_config == json.loads((reference.base / "config.json").read_text()):
        return reference
    from pytest_rlrollout.snapshot.cases import ReferenceCases

    return ReferenceCases.of(tmp_path_factory.mktemp("rl-base-cases"), rl_snapshots.base, rl_deployment.target.model)


def served_by(replica: dict[str, Any]) -> set[str]:
    """The snapshot and the loaded adapters of one replica in a status."""
    adapters = {a.get("identity") for a in replica.get("loaded_adapters") or [] if isinstance(a, dict)}
    return {i for i in {replica.get("current_snapshot_identity"), *adapters} if isinstance(i, str)}


@pytest.fixture
def rl_snapshot_factory(
    request: pytest.FixtureRequest,
    rl_deployment: RLDeployment,
    rl_snapshots: SnapshotFactory | None,
    rl_test: RLTest | None,
) -> SnapshotFactory:
    """Builds and uploads the snapshots swap tests signal: `step(serving)`, `sentinel(parent,
    change=)`, `full()`, `lora()`, `copy_in(dir)`; identities are named after the test, so a
    replay builds the same bytes. Everything uploaded is removed at the end of the session."""
    from pytest_rlrollout.remote.cassette import portable_id

    if rl_snapshots is None:
        missing = [
            o
            for o, v in (("--rl-bucket-url", rl_deployment.bucket), ("--rl-base-snapshot", rl_deployment.base_snapshot))
            if v is None
        ]
        inconclusive(f"building snapshots to swap in needs {' and '.join(missing)}")
    from pytest_rlrollout.suite.evidence import observed

    factory = rl_snapshots
    factory.for_test(portable_id(request.node.nodeid), observed(request.node).uploads)
    cassette = rl_test.cassette if rl_test is not None else None
    if cassette is not None:  # what the factory knew travels with the test's cassette
        if rl_deployment.mode == "replay":
            if "factory" in cassette.meta:
                factory.restore(cassette.meta["factory"])
        else:
            cassette.meta["factory"] = factory.state()
    return factory


@pytest.fixture
def rl_swap(
    request: pytest.FixtureRequest, rl_deployment: RLDeployment, rl_snapshot_factory: SnapshotFactory
) -> Swapper:
    """`rl_swap(label, change=None, **signal_fields)` swaps to a new snapshot and waits for it;
    `build()`, `signal(built)`, `post(built)` and `follow(built, response)` split the steps."""
    from pytest_rlrollout.suite.evidence import observed

    return Swapper(rl_deployment, rl_snapshot_factory, observed(request.node))
