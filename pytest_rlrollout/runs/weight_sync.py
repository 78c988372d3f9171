"""The training loop's weight-sync check: after every weight sync, did every replica get the
weights the trainer holds?

The trainer scores one fixed canary sequence with its own model (`score_canary` does it for a
transformers or any torch causal LM); `WeightSync.check` has every replica score the same tokens
(an echo with `max_tokens` 1, under a prompt-cache isolation key no request used before, so no KV
computed under other weights takes part) and compares. Per replica: the label it serves, the
largest and mean |Δlogprob| against the trainer's numbers, and a verdict against the tolerance of
the served precision. A replica's numbers are what is judged, never its label: a replica whose
load changed its label but kept its weights is out of sync however it is labelled.

Cost: one scoring request per replica per call (one prefill of the canary), and nothing else. The
first call also reads the status once (how many replicas), sends one-token probes to find a session
key that routes to each replica (`fingerprint.sessions_by_replica`) and, where an engine says the
policy version only on a route of its own, one request to find it (`Driver.find_version_route`).
Nothing on the deployment changes: only completions are sent.

A replica's label is what its answer to the canary says it served (the status is not read again: it
would cost a request per call, and says what a replica serves at another moment). Where an engine's
answers name no version (CoreWeave's gateway; vLLM 0.32 without `--enable-scale-out`), the label
is None. Where its answers name no replica and its status does not list exactly one (CoreWeave's
gateway), a row stands for a session key, not for a replica the check knows it reached:
`SyncResult.named` is False and its lines say so.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.numerics.tolerances import TOLERANCES, dtype_name
from pytest_rlrollout.remote.fingerprint import ECHO, ISOLATION, FingerprintError, canary, prompt_logprobs

if TYPE_CHECKING:
    import httpx

    from pytest_rlrollout.engines import Engine
    from pytest_rlrollout.remote.drivers import Driver
    from pytest_rlrollout.remote.stream import Stream

CANARY_TOKENS = 128  # one sequence: 127 scored logprobs in one prefill per replica
SESSION = "x-multi-turn-session-id"  # the contract's session header; every driver routes by it


class WeightSyncError(RuntimeError):
    """The check could not be made (a replica's answer cannot be read, the trainer's numbers do
    not line up with the canary), or `SyncResult.raise_for` found replicas out of sync."""


@dataclass(frozen=True)
class ReplicaSync:
    """One replica's numbers against the trainer's."""

    replica: str
    label: str | None  # the version the replica says it served the canary with
    max_abs: float  # largest |Δlogprob| over the canary (inf at a NaN)
    mean_abs: float
    worst_token: int  # the canary position of the largest |Δ|
    tolerance: float
    previous_max_abs: float | None = None  # against the trainer's numbers of the previous check
    # the replica's logprob of each canary token after the first
    served: tuple[float, ...] = field(default=(), repr=False)

    @property
    def in_sync(self) -> bool:
        return self.max_abs <= self.tolerance

    @property
    def stale(self) -> bool:
        """Out of sync and closer to the previous check's weights than to these: it serves what the
        trainer held one sync ago."""
        return (not self.in_sync) and self.previous_max_abs is not None and self.previous_max_abs < self.max_abs

    @property
    def verdict(self) -> str:
        if self.in_sync:
            return "in sync"
        return "stale: serves the previous weights" if self.stale else "out of sync"

    def line(self) -> str:
        label = f" (label {self.label})" if self.label else ""
        return (
            f"{self.replica}{label}: {self.verdict}: max |Δlogprob| {self.max_abs:.3g} at canary token "
            f"{self.worst_token}, mean {self.mean_abs:.3g} (tolerance {self.tolerance:g})"
        )


@dataclass(frozen=True)
class SyncResult:
    """Every replica's numbers against the trainer's after one sync."""

    replicas: tuple[ReplicaSync, ...]
    step: int | None
    expected_label: str | None
    dtype: str
    tolerance: float
    requests: int  # scoring requests this call sent (one per replica)
    probes: int  # one-token requests spent reaching the replicas (0 once they are known)
    seconds: float
    # each row is a replica the deployment named on its answers (or its only one); False: each row
    # is a session key, and routing decides which replica it reached (several may reach one)
    named: bool = True

    @property
    def ok(self) -> bool:
        return all(r.in_sync for r in self.replicas)

    @property
    def out_of_sync(self) -> list[ReplicaSync]:
        return [r for r in self.replicas if not r.in_sync]

    @property
    def max_abs(self) -> float:
        return max(r.max_abs for r in self.replicas)

    def mislabelled(self) -> list[ReplicaSync]:
        """Replicas whose label is not the one the trainer expects (when it said one)."""
        if self.expected_label is None:
            return []
        return [r for r in self.replicas if r.label is not None and r.label != self.expected_label]

    def metrics(self, prefix: str = "weight_sync") -> dict[str, float]:
        """Flat figures for a metrics logger (wandb, TensorBoard, MLflow): the worst and mean over
        replicas, how many are out of sync, and each replica's own under `{prefix}/replica{i}/`
        (replicas in the order of `replicas`, sorted by name)."""
        out = {
            f"{prefix}/max_abs_dlogprob": self.max_abs,
            f"{prefix}/mean_abs_dlogprob": sum(r.mean_abs for r in self.replicas) / len(self.replicas),
            f"{prefix}/replicas": float(len(self.replicas)),
            f"{prefix}/replicas_out_of_sync": float(len(self.out_of_sync)),
            f"{prefix}/tolerance": self.tolerance,
            f"{prefix}/seconds": self.seconds,
        }
        for i, r in enumerate(self.replicas):
            out[f"{prefix}/replica{i}/max_abs_dlogprob"] = r.max_abs
            out[f"{prefix}/replica{i}/mean_abs_dlogprob"] = r.mean_abs
            out[f"{prefix}/replica{i}/in_sync"] = 1.0 if r.in_sync else 0.0
        return out

    def lines(self) -> list[str]:
        step = f"step {self.step}: " if self.step is not None else ""
        head = (
            f"{step}{len(self.replicas) - len(self.out_of_sync)}/{len(self.replicas)} replicas in sync with the "
            f"trainer ({self.dtype}, tolerance {self.tolerance:g}; {self.requests} scoring requests, {self.seconds:.2f} s)"
        )
        said = [
            f"{r.replica} says {r.label!r}, the trainer expects {self.expected_label!r}" for r in self.mislabelled()
        ]
        unnamed = (
            []
            if self.named
            else [
                f"  the deployment names no replica on its answers: {len(self.replicas)} session key(s) stood for "
                "its replicas, and its routing decided which each reached (a replica none reached is not judged)"
            ]
        )
        return [head, *(f"  {r.line()}" for r in self.replicas), *(f"  label: {s}" for s in said), *unnamed]

    def raise_for(self) -> SyncResult:
        """This result, or WeightSyncError naming every replica out of sync."""
        if not self.ok:
            raise WeightSyncError("\n".join(self.lines()))
        return self


@dataclass
class WeightSync:
    """The per-step check, over a driver of the deployment (`WeightSync.connect` makes one).

    `dtype` is the precision the deployment serves in (its tolerance: `numerics.tolerances`), or
    give `tolerance` directly. Keep one object for the whole run: it remembers how to reach each
    replica and the trainer's numbers of the previous check (to tell a stale replica)."""

    driver: Driver
    dtype: str = "float32"
    tolerance: float = math.nan  # default: the dtype's (TOLERANCES[dtype].logprob)
    replicas: int | None = None  # how many to reach; default: as many as the status lists (at least 1)
    vocab: int | None = None  # the model's vocabulary size: canary ids stay below it
    tokens: int = CANARY_TOKENS
    sequence: Sequence[int] | None = None  # a canary of the trainer's own (default: the fixed one)
    # names the check's session keys and isolation keys (unique per object; a recorded check replays with its own)
    salt: str = field(default_factory=lambda: uuid.uuid4().hex[:12], repr=False)
    _sessions: dict[str, str] = field(default_factory=dict, repr=False)
    _named: bool = field(default=True, repr=False)  # the answers name the replica that served them
    _known: bool = field(default=True, repr=False)  # each session reaches a replica of its own
    _previous: tuple[float, ...] | None = field(default=None, repr=False)
    _calls: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self.dtype = dtype_name(self.dtype)
        if math.isnan(self.tolerance):
            self.tolerance = TOLERANCES[self.dtype].logprob
        if self.sequence is not None:
            self.sequence = [int(t) for t in self.sequence]
            self.tokens = len(self.sequence)
        if self.tokens < 2:
            raise ValueError(f"a canary of {self.tokens} tokens scores nothing (at least 2)")

    @property
    def sessions(self) -> dict[str, str]:
        """Each replica reached so far, and the session key that reaches it (sorted by replica)."""
        return dict(sorted(self._sessions.items()))

    @property
    def canary(self) -> list[int]:
        """The token ids the trainer scores (with `score_canary`, or its own framework): the same in
        every run and every tool."""
        if self.sequence is not None:
            return list(self.sequence)
        return canary(self.vocab, sequences=1, tokens=self.tokens)[0]

    @classmethod
    @contextlib.contextmanager
    def connect(
        cls,
        base_url: str,
        model: str,
        *,
        engine: Engine,
        api_key: str = "",
        deployment: str | None = None,
        fleet_urls: Sequence[str] = (),
        inference_url: str = "",
        control_url: str = "",
        control_api_key: str | None = None,
        bucket: str | None = None,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        **settings: Any,
    ) -> Iterator[WeightSync]:
        """A check over a new client of the deployment at `base_url` (`engine`: its binding, as the
        suite names it: fireworks, vllm, sglang, smg, fleet, sglang-fleet, coreweave, openai), as
        the suite's options name it: `deployment` (Fireworks: accounts/<a>/deployments/<d>;
        CoreWeave: its UUID), `fleet_urls` (a fleet's engines, no gateway), `inference_url`,
        `control_url` and `control_api_key` (CoreWeave's hot-load API, where it has a host or key of
        its own). `bucket`: where a self-hosted engine (vLLM, SGLang) reads snapshots from, a
        directory the server sees, so that the trainer's loop can load through the same driver
        (`sync.driver`). `transport`: httpx's, to send through (a proxy, a recorder); closed on exit."""
        from pytest_rlrollout.remote.client import DeploymentClient
        from pytest_rlrollout.remote.drivers import driver_for
        from pytest_rlrollout.remote.secret import Secret
        from pytest_rlrollout.remote.target import Target

        target = Target(
            deployment,
            base_url,
            model,
            Secret(api_key),
            inference_url=inference_url,
            engine=engine,
            control_url=control_url,
            control_key=None if control_api_key is None else Secret(control_api_key),
            members=tuple(fleet_urls),
        )
        with DeploymentClient(target, timeout=timeout, transport=transport) as client:
            yield cls(driver_for(engine, client, bucket=bucket), **settings)

    def check(self, expected: Sequence[float], *, label: str | None = None, step: int | None = None) -> SyncResult:
        """Every replica scores the canary; each is compared with `expected`, the trainer's logprob
        of each canary token after the first (`len(canary) - 1` numbers; a leading NaN for the
        first token, as some scorers give it, is dropped). `label`: the version the trainer
        expects served, reported where a replica says another."""
        want = self._expected(expected)
        started = time.monotonic()
        self._calls += 1
        probes = self._reach()
        rows = [
            self._judge(replica, self._score(replica, session, n), want)
            for n, (replica, session) in enumerate(sorted(self._sessions.items()))
        ]
        result = SyncResult(
            tuple(rows),
            step,
            label,
            self.dtype,
            self.tolerance,
            len(rows),
            probes,
            time.monotonic() - started,
            self._known,
        )
        self._previous = tuple(want)
        return result

    # ------------------------------------------------------------------ the parts

    def _expected(self, expected: Sequence[float]) -> list[float]:
        values = [float(x) for x in expected]
        n = self.tokens - 1
        if len(values) == n + 1 and math.isnan(values[0]):
            values = values[1:]
        if len(values) != n:
            raise WeightSyncError(
                f"the trainer's numbers: {len(values)} logprobs for a canary of {self.tokens} tokens "
                f"(want {n}: one per token after the first)"
            )
        return values

    def _reach(self) -> int:
        """Find a session key per replica, and the route whose answers say their version (once);
        the one-token requests it took."""
        if self._sessions:
            return 0
        from pytest_rlrollout.remote.fingerprint import sessions_by_replica

        probes = self.driver.find_version_route()
        listed = self.driver.replicas()
        count = self.replicas or max(1, len(listed))
        found, self._named, reached = sessions_by_replica(
            self.driver, count, lambda n: f"rlrollout-sync-{self.salt}-{n}"
        )
        if self._named and len(found) < count:
            raise WeightSyncError(
                f"{len(found)} of {count} replicas answered {reached} session keys ({', '.join(sorted(found))}): "
                "the others cannot be reached by a session key (pass `replicas` if the deployment has fewer)"
            )
        only = listed[0].get("name") if len(listed) == 1 else None
        self._known = self._named or (count == 1 and isinstance(only, str))
        if not self._named and self._known:  # one replica, unnamed on the answers: the one the status lists
            found = {str(only): next(iter(found.values()))}
        self._sessions = found
        return probes + reached

    def _score(self, replica: str, session: str, n: int) -> Stream:
        """The canary scored on `replica`, under an isolation key of its own."""
        ids = self.canary
        headers = {SESSION: session, ISOLATION: f"rlrollout-sync-{self.salt}-{self._calls}-{n}"}
        s = self.driver.complete({"prompt": ids, **ECHO}, headers=headers)
        if not s.ok:
            raise WeightSyncError(f"{replica}: the canary was answered HTTP {s.status}: {s.body[:200]}")
        if self._named and s.replica is not None and s.replica != replica:
            raise WeightSyncError(
                f"the session key that reached {replica} now reaches {s.replica}: the deployment's replicas "
                "changed; make a new WeightSync"
            )
        return s

    def _judge(self, replica: str, s: Stream, want: list[float]) -> ReplicaSync:
        try:
            served = prompt_logprobs(s, self.tokens)
        except FingerprintError as e:
            raise WeightSyncError(f"{replica}: {e}") from None
        worst, at, total = 0.0, 0, 0.0
        for i, (a, b) in enumerate(zip(served, want, strict=True)):
            d = abs(a - b)
            if math.isnan(d):
                worst, at, total = math.inf, i + 1, math.inf
                break
            total += d
            if d > worst:
                worst, at = d, i + 1
        previous = None
        if self._previous is not None:
            previous = max((abs(a - b) for a, b in zip(served, self._previous, strict=True)), default=0.0)
        return ReplicaSync(
            replica,
            self._label(s),
            worst,
            total / len(want),
            at,
            self.tolerance,
            previous,
            tuple(served),
        )

    @staticmethod
    def _label(s: Stream) -> str | None:
        """The version the replica's answer says it served the canary with (None: it says none).
        Never the status: reading it would cost a request per call, and a status says what a
        replica serves at another moment than its answer."""
        versions = [v for v in s.versions if v]
        return versions[-1] if versions else None


def score_canary(model: Any, tokens: Sequence[int], *, device: Any = None) -> list[float]:
    """The trainer's numbers for `tokens` (`WeightSync.canary`): the logprob of each token after the
    first, teacher-forced through `model` (a transformers causal LM, or any torch module whose
    output has `.logits` or is the logits), in float64 after the model's own precision."""
    import torch

    was_training = bool(getattr(model, "training", False))
    if device is None:
        device = next(model.parameters()).device
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.tensor([list(tokens)], device=device))
            logits = getattr(out, "logits", out)[0].double()
            lp = torch.log_softmax(logits, -1)
            ids = torch.tensor(list(tokens)[1:], device=lp.device)
            picked = lp[:-1].gather(1, ids[:, None])[:, 0]
        return [float(x) for x in picked.cpu().tolist()]
    finally:
        if was_training:
            model.train()
