"""The bundled reference deployment as the weight-sync check reaches it, in each engine's dialect and
as fleets (smg's gateway in front of engines; a list of engine URLs with no gateway), and what a
check sent: counted where the check sends it (a counting transport) and where the reference
engines receive it (their request logs)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_rlrollout.engines import spec
from pytest_rlrollout.numerics.scorer import NumpyScorer
from pytest_rlrollout.reference import Running, reference_deployment
from pytest_rlrollout.reference.fleet import reference_fleet
from pytest_rlrollout.reference.settings import FIRST_LABEL
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.counting import CountingTransport, Crossed
from pytest_rlrollout.remote.drivers import Driver, driver_for
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.runs.weight_sync import WeightSync
from pytest_rlrollout.snapshot import build, tiny_moe

KEY = "rl-reference-key"
# the fleets, by the engine each is a fleet of; smg is the gateway in front of them
FLEETS = {"fleet": "vllm", "sglang-fleet": "sglang", "smg": "vllm"}
# where each dialect scores: the completion routes (smg's proxy route to an engine ends in one)
SCORING = ("/inference/v1/completions", "/v1/completions", "/inference/v1/generate", "/generate")
ANSWERING = ("/completions", "/generate")  # the routes that answer completions, whatever their prefix


@dataclass
class Served:
    """A reference deployment in `engine`'s dialect: its servers (one, or a fleet's engines) and
    WeightSync.connect's arguments to reach it."""

    engine: str
    bucket: Path
    engines: list[Running]
    connect: dict[str, Any]
    replicas: int  # the replicas the deployment has
    counted: CountingTransport = field(default_factory=CountingTransport)

    @property
    def base(self) -> Path:
        return self.bucket / tiny_moe.BASE_IDENTITY

    @contextlib.contextmanager
    def sync(self, **settings: Any) -> Iterator[WeightSync]:
        """A check over a client of its own, through the counting transport."""
        with WeightSync.connect(**self.connect, transport=self.counted, **settings) as sync:
            yield sync

    @contextlib.contextmanager
    def trainer(self) -> Iterator[Driver]:
        """The trainer's own loader: a driver that loads snapshots from the bucket (not counted)."""
        c = self.connect
        target = Target(
            c.get("deployment"),
            c["base_url"],
            c["model"],
            c["api_key"],
            engine=self.engine,
            members=tuple(c.get("fleet_urls", ())),
        )
        with DeploymentClient(target) as client:
            yield driver_for(self.engine, client, bucket=str(self.bucket.resolve()))

    def held(self) -> list[Any]:
        """What every reference engine holds and says: each replica's weights (the object served),
        snapshot, label, readiness, stage and pause; the label its status route reads."""
        return [
            (
                e.deployment.info_label,
                [
                    (r.name, id(r.model), r.identity, r.label, r.readiness, r.stage, r.paused)
                    for r in e.deployment.replicas
                ],
            )
            for e in self.engines
        ]

    def logs(self) -> list[int]:
        return [len(e.deployment.requests) for e in self.engines]

    def received(self, since: list[int]) -> list[list[tuple[str, str]]]:
        """Per engine, the (method, path) of every request it received after `since` (`logs()`)."""
        return [
            [(m, p) for m, p, _ in list(e.deployment.requests)[n:]] for e, n in zip(self.engines, since, strict=True)
        ]


def start_label(engine: str) -> str | None:
    """The label a reference deployment's answers carry before any load: the snapshot's identity
    (Fireworks), vLLM's and SGLang's weight version, none on CoreWeave's gateway."""
    if engine == "coreweave":
        return None
    return tiny_moe.BASE_IDENTITY if engine == "fireworks" else FIRST_LABEL


@contextlib.contextmanager
def served(engine: str, bucket: Path, *, faults: Any = ()) -> Iterator[Served]:
    """The reference deployment in `engine`'s dialect: a fleet of two engines for the fleets, the
    dialect's own replicas otherwise (Fireworks' and CoreWeave's two, one server's one). `faults`:
    its switches (a fleet's: {engine index: switches})."""
    if engine in FLEETS:
        gateway = engine == "smg"
        # smg is started with no key for its engines (`reference.fleet.smg_gateway`): they ask for none
        key = None if gateway else KEY
        with reference_fleet(
            bucket, 2, engine=FLEETS[engine], gateway=gateway, faults=faults or None, api_key=key
        ) as f:
            members = {} if gateway else {"fleet_urls": f.urls}
            connect = {"base_url": f.base_url, "model": "tiny", "engine": engine, "api_key": key or "", **members}
            yield Served(engine, bucket, f.engines, connect, 2)
        return
    with reference_deployment(bucket, engine=engine, faults=frozenset(faults), api_key=KEY) as dep:
        name = {"path": dep.name, "uuid": dep.settings.deployment_id, None: None}[spec(engine).names]
        connect = {"base_url": dep.base_url, "model": dep.model, "engine": engine, "api_key": KEY, "deployment": name}
        yield Served(engine, bucket, [dep], connect, dep.settings.replicas)


def scored(snapshot: Path, sync: WeightSync) -> list[float]:
    """The trainer's numbers: the local scorer's logprob of each canary token after the first, on
    `snapshot` (its value for the first token, NaN, left out)."""
    return [float(x) for x in NumpyScorer(snapshot).score(sync.canary).logprobs[1:]]


def next_snapshot(bucket: Path, identity: str = "step-1") -> Path:
    """A snapshot of other weights in the bucket (every tensor of the base nudged)."""
    base = bucket / tiny_moe.BASE_IDENTITY
    return build.derive(base, bucket / identity, build.perturbed(base, seed=1, scale=0.1))


def scoring(crossed: list[Crossed]) -> list[Crossed]:
    """The scoring requests among `crossed`: POSTs to a completion route."""
    return [c for c in crossed if c.method == "POST" and c.path.endswith(SCORING)]


def checked_three_times(s: Served) -> None:
    """Three checks on the start weights: each green against the local scorer with the start label;
    the first finds the replicas, the next two send one scoring request to each replica and nothing
    else (at the transport and at every engine); nothing any engine holds or says changes. (CoreWeave
    lists replicas per hot-load only: before the first, the check is told how many there are.)"""
    with s.sync(replicas=s.replicas if s.engine == "coreweave" else None) as sync:
        expected = scored(s.base, sync)
        status_before = sync.driver.read_status().replicas
        held, since = s.held(), s.logs()
        s.counted.take()
        first = sync.check(expected, step=0)
        found = s.counted.take()
        assert first.probes > 0 and first.requests == len(first.replicas), first
        assert all(c.method == "GET" or c.path.endswith(ANSWERING) for c in found), found
        for step in (1, 2):
            engines_before = s.logs()
            result = sync.check(expected, step=step)
            crossed = s.counted.take()
            received = s.received(engines_before)
            assert result.ok and result.max_abs <= result.tolerance, "\n".join(result.lines())
            assert result.probes == 0 and result.requests == s.replicas == len(result.replicas), result
            assert [r.label for r in result.replicas] == [start_label(s.engine)] * s.replicas
            # on the wire: one scoring request per replica and nothing else, each to a replica of its own
            assert scoring(crossed) == crossed and len(crossed) == s.replicas, crossed
            reached = {c.replica or c.url for c in crossed}
            assert len(reached) == (s.replicas if result.named else 1), crossed
            # at the engines: each got its replicas' scoring requests and no other POST
            posts = [[p for m, p in got if m == "POST"] for got in received]
            assert all(p.endswith(ANSWERING) for got in posts for p in got), received
            assert [len(got) for got in posts] == [len(e.deployment.replicas) for e in s.engines], received
        assert s.held() == held, "the check changed what the deployment holds or says"
        assert not [(m, p) for got in s.received(since) for m, p in got if m != "GET" and not p.endswith(ANSWERING)], (
            "the check sent a request that could change something"
        )
        assert sync.driver.read_status().replicas == status_before


def stale_replica_named(s: Served, faulty: str | int) -> None:
    """A check on the start weights, a swap the faulty replica only pretends to make, a check on the
    new weights: the faulty replica, and only it, is out of sync and stale (closer to the previous
    check's numbers), though its label is the new one."""
    name = faulty if isinstance(faulty, str) else s.engines[faulty].base_url
    with s.sync() as sync, s.trainer() as trainer:
        assert sync.check(scored(s.base, sync), step=0).ok
        new = next_snapshot(s.bucket)
        loaded = trainer.load({"identity": new.name, "reset_prompt_cache": "all"})
        assert loaded.status_code == 200, loaded.text
        assert trainer.wait(new.name, timeout=60, poll=0.02).ok
        result = sync.check(scored(new, sync), step=1, label=new.name)
    said = "\n".join(result.lines())
    assert [r.replica for r in result.out_of_sync] == [name], said
    stale = result.out_of_sync[0]
    assert stale.stale and stale.verdict == "stale: serves the previous weights" and stale.max_abs > 0.1, said
    assert stale.previous_max_abs is not None and stale.previous_max_abs <= result.tolerance, said
    # its label notwithstanding: every replica says the new label, the faulty one too
    assert {r.label for r in result.replicas} == {new.name} and not result.mislabelled(), said
    assert f"{name} (label {new.name}): stale: serves the previous weights" in said
    assert result.metrics()["weight_sync/replicas_out_of_sync"] == 1.0
