"""Where a gap between the trainer's logprobs and the deployment's comes from.

Given what the trainer believes the deployment serves (its logprobs of a canary sequence, or a
snapshot directory scored here), each cause is measured on its own, the others held still:

- **weights**: every replica scores the canary fresh (an isolation key no request used), uncached
  and alone; a replica whose numbers stand apart from the others', or from the trainer's by more
  than the served precision explains, serves other weights, whatever its label says.
- **prompt cache**: the canary continued through the replica's shared cache (no isolation key, as
  a rollout reads it: KV that earlier traffic cached, before the last swap too) against the same
  continuation under an unused isolation key.
- **batching**: the canary scored alone against scored beside concurrent decoding streams.
- **decode path**: the logprobs a replica reports while decoding sampled tokens against the echo
  of the same tokens (prefill).
- **numerics**: what remains: the in-sync replicas' gap to the trainer's numbers, within what the
  served precision produces. Reported, never blamed.

Cache, batching and decode compare the deployment with itself, within the run's own tolerance
(`self_tolerance`: the served dtype's fingerprint tolerance); the weights' gap to the trainer is
judged against `numerics_band`, the largest gap the precision the snapshot declares produces
against a float32 scorer (`numerics.tolerances`). Every request is a completion: no weights, label
or setting change; the one trace left is the canary's prefix in each replica's shared prompt cache
(the cache measurement reads it as a rollout does). Costs (n replicas, k load streams): 1 + 3 scoring requests per replica, 2 + k
for batching, 2 for the decode path.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.numerics.tolerances import TOLERANCES, served_dtype
from pytest_rlrollout.remote.fingerprint import (
    ECHO,
    ISOLATION,
    Continuation,
    FingerprintError,
    continuation,
    largest_difference,
    prompt_logprobs,
)
from pytest_rlrollout.runs.weight_sync import SESSION, SyncResult, WeightSync, WeightSyncError

if TYPE_CHECKING:
    from pytest_rlrollout.remote.drivers import Driver

CAUSES = ("weights", "prompt cache", "batching", "decode path", "numerics")
EXPECTED_FORMAT = "rlrollout-expected/1"
LOAD_STREAMS = 3  # streams decoding beside the request judged for batching
LOAD_TOKENS = 256  # how long each load stream decodes: long enough to outlast the request judged
DECODED = 16  # sampled tokens whose decode logprobs are compared with their echo
DECODE_PROMPT = 24  # canary tokens that prompt the decode-path measurement


class DiagnoseError(ValueError):
    """The diagnosis cannot be made: what the trainer gave cannot be read, or the deployment's
    answers cannot be scored (which answer, and what it lacks)."""


@dataclass(frozen=True)
class Expected:
    """What the trainer believes the deployment serves: its logprob of each token of `tokens`
    after the first."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    source: str  # where the numbers come from (a file, a snapshot scored here)
    label: str | None = None  # the version the trainer expects served

    def __post_init__(self) -> None:
        if len(self.tokens) < 2 or len(self.logprobs) != len(self.tokens) - 1:
            raise DiagnoseError(
                f"{self.source}: {len(self.logprobs)} logprobs for {len(self.tokens)} tokens "
                "(want one per token after the first, and at least 2 tokens)"
            )

    @classmethod
    def from_file(cls, path: Path) -> Expected:
        """The trainer's numbers as `write` wrote them: {"format", "tokens", "logprobs", "label"}."""
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise DiagnoseError(f"{path}: cannot be read as JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != EXPECTED_FORMAT:
            raise DiagnoseError(f'{path}: not an expected-logprobs file (want "format": {EXPECTED_FORMAT!r})')
        tokens, logprobs, label = doc.get("tokens"), doc.get("logprobs"), doc.get("label")
        if not (isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens)):
            raise DiagnoseError(f'{path}: "tokens" is not a list of token ids')
        if not (isinstance(logprobs, list) and all(_number(x) for x in logprobs)):
            raise DiagnoseError(f'{path}: "logprobs" is not a list of numbers')
        if label is not None and not isinstance(label, str):
            raise DiagnoseError(f'{path}: "label" is not a string')
        return cls(tuple(tokens), tuple(float(x) for x in logprobs), str(path), label)

    @classmethod
    def from_snapshot(
        cls, snapshot: Path, tokens: Sequence[int], *, scorer: str = "auto", device: str = "cpu"
    ) -> Expected:
        """`tokens` scored here by a local forward pass of `snapshot` (float32)."""
        from pytest_rlrollout.numerics.scorer import local_scorer

        scored = local_scorer(snapshot, scorer, device).score(list(tokens))
        return cls(tuple(tokens), tuple(float(x) for x in scored.logprobs[1:]), f"{snapshot} ({scorer} scorer)")

    def write(self, path: Path) -> Path:
        doc = {"format": EXPECTED_FORMAT, "tokens": list(self.tokens), "logprobs": list(self.logprobs)}
        if self.label is not None:
            doc["label"] = self.label
        Path(path).write_text(json.dumps(doc) + "\n")
        return Path(path)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def numerics_band(logprob_tolerance: float, declared: Mapping[str, Any] | None) -> float:
    """The largest gap to the trainer's numbers that a replica serving its weights may show: the
    run's logprob tolerance, or the tolerance of the precision `declared` (a checkpoint's
    config.json: `torch_dtype`, or `dtype` as transformers 5 writes it) says, whichever is larger.

    Why the declared precision counts even where the run says the deployment serves float32: a
    deployment may compute in the precision its checkpoint declares (an engine loads a bf16
    checkpoint in bf16 unless told otherwise), and the gap such a precision produces against a
    float32 scorer is numerics, not weights. `declared`: the snapshot's config.json, or for the
    trainer's numbers given as a file the deployment's base's when known; None: the run's
    tolerance alone."""
    dtype = served_dtype(declared)
    return max(logprob_tolerance, TOLERANCES[dtype].logprob) if dtype is not None else logprob_tolerance


@dataclass(frozen=True)
class Finding:
    """One cause, measured: the gap it accounts for, against its threshold."""

    cause: str
    gap: float | None  # None: not measured (`detail` says why)
    threshold: float
    blamed: bool  # the cause crosses its threshold (never for numerics)
    detail: str
    figures: dict[str, float] = field(default_factory=dict)
    replicas: tuple[str, ...] = ()  # the replicas it is blamed on (weights: each serving other weights)

    @property
    def measured(self) -> bool:
        return self.gap is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "gap": json_gap(self.gap),
            "threshold": self.threshold,
            "blamed": self.blamed,
            "measured": self.measured,
            "detail": self.detail,
            "figures": {k: json_gap(v) for k, v in self.figures.items()},
            "replicas": list(self.replicas),
        }


def json_gap(x: float | None) -> float | str | None:
    """A gap as JSON can hold it: infinity and NaN as words (JSON has neither)."""
    return x if x is None or math.isfinite(x) else str(x)


def verdict(cause: str, gap: float | None, blamed: bool) -> str:
    """What a finding's row says: not measured, the numerics' remainder (never blamed), or
    whether the cause crosses its threshold."""
    if gap is None:
        return "not measured"
    if cause == "numerics":
        return "remainder"  # what is left once every other cause is held still
    return "CAUSE" if blamed else "within"


@dataclass(frozen=True)
class Diagnosis:
    """Every cause's finding, the replicas' weights against the trainer's numbers, and the cost."""

    findings: tuple[Finding, ...]
    sync: SyncResult
    expected: Expected
    self_tolerance: float
    numerics_band: float
    requests: int
    seconds: float

    @property
    def blamed(self) -> list[Finding]:
        return [f for f in self.findings if f.blamed]

    @property
    def ok(self) -> bool:
        return not self.blamed

    def finding(self, cause: str) -> Finding:
        return next(f for f in self.findings if f.cause == cause)

    def as_dict(self) -> dict[str, Any]:
        return {
            "expected": {
                "source": self.expected.source,
                "tokens": len(self.expected.tokens),
                "label": self.expected.label,
            },
            "self_tolerance": self.self_tolerance,
            "numerics_band": self.numerics_band,
            "replicas": [
                {
                    "replica": r.replica,
                    "label": r.label,
                    "max_abs_dlogprob": json_gap(r.max_abs),
                    "mean_abs_dlogprob": json_gap(r.mean_abs),
                    "worst_token": r.worst_token,
                    "blamed": r.replica in self.finding("weights").replicas,
                }
                for r in self.sync.replicas
            ],
            "findings": [f.as_dict() for f in self.findings],
            "blamed": [f.cause for f in self.blamed],
            "requests": self.requests,
            "seconds": self.seconds,
        }

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """The terminal table: cause, gap, threshold, verdict, what was measured."""
        out = []
        for f in self.findings:
            gap = "-" if f.gap is None else f"{f.gap:.3g}"
            out.append((f.cause, gap, f"{f.threshold:.3g}", verdict(f.cause, f.gap, f.blamed), f.detail))
        return out

    def lines(self) -> list[str]:
        rows = [("cause", "max |Δ|", "threshold", "verdict", "measured"), *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        table = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows]
        blamed = ", ".join(f.cause for f in self.blamed)
        verdict = f"the gap comes from: {blamed}" if blamed else "no cause past its threshold but numerics"
        head = (
            f"diagnosis against {self.expected.source}: {len(self.sync.replicas)} replica(s), "
            f"{self.requests} requests, {self.seconds:.1f} s"
        )
        return [head, *table, verdict]


@dataclass
class Diagnose:
    """The measurements, over a driver of the deployment. `paced` slows a deployment that decodes
    too fast for a load to overlap a request (the bundled reference deployment's pace); each
    measurement says when it could not be made. `salt` names the diagnosis's requests (their
    session and isolation keys): a recorded diagnosis replays when it is the recording's."""

    driver: Driver
    expected: Expected
    self_tolerance: float
    numerics_band: float
    replicas: int | None = None
    load_streams: int = LOAD_STREAMS
    load_tokens: int = LOAD_TOKENS
    paced: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
    timeout: float = 120.0
    tell: Callable[[str], None] = lambda _: None
    salt: str = field(default_factory=lambda: uuid.uuid4().hex[:12], repr=False)
    _sent: int = field(default=0, repr=False)

    def run(self) -> Diagnosis:
        started = time.monotonic()
        sync = WeightSync(
            self.driver,
            tolerance=self.numerics_band,
            replicas=self.replicas,
            sequence=self.expected.tokens,
            salt=self.salt,
        )
        self.tell("weights: the canary scored fresh on every replica")
        try:
            result = sync.check(self.expected.logprobs, label=self.expected.label)
        except WeightSyncError as e:
            raise DiagnoseError(str(e)) from None
        self._sent += result.requests + result.probes
        sessions = sync.sessions
        weights, numerics = self.weights(result)
        self.tell("prompt cache: the canary continued through each replica's shared cache and fresh")
        cache = self.prompt_cache(sessions)
        first = next(iter(sessions.values()))
        self.tell(f"batching: the canary alone and beside {self.load_streams} decoding streams")
        batching = self.batching(first)
        self.tell("decode path: sampled tokens' decode logprobs against their echo")
        decode = self.decode_path(first)
        return Diagnosis(
            (weights, cache, batching, decode, numerics),
            result,
            self.expected,
            self.self_tolerance,
            self.numerics_band,
            self._sent,
            time.monotonic() - started,
        )

    # ------------------------------------------------------------------ weights and numerics

    def weights(self, result: SyncResult) -> tuple[Finding, Finding]:
        """Which replicas serve other weights: apart from the replica closest to the trainer by
        more than the run's tolerance, or from the trainer by more than the numerics band."""
        rows = result.replicas
        best = min(rows, key=lambda r: r.max_abs)
        apart = {r.replica: largest_difference(r.served, best.served)[0] for r in rows}
        blamed = [r for r in rows if r.max_abs > self.numerics_band or apart[r.replica] > self.self_tolerance]
        said = []
        for r in blamed:
            label = f"labelled {r.label!r}" if r.label else "unlabelled"
            peers = [p.label for p in rows if p is not r and p not in blamed]
            same = " like the replicas in sync" if r.label is not None and r.label in peers else ""
            peer = "" if r is best else f" and from {best.replica} by {apart[r.replica]:.3g}"
            said.append(
                f"{r.replica} ({label}{same}) differs from the trainer by {r.max_abs:.3g} (token {r.worst_token}){peer}"
            )
        in_sync = [r for r in rows if r not in blamed]
        figures = {f"{r.replica}: max |Δ|": r.max_abs for r in rows}
        weights = Finding(
            "weights",
            max(r.max_abs for r in rows),
            self.numerics_band,
            bool(blamed),
            "; ".join(said)
            or f"{len(rows)} replica(s) agree within {self.self_tolerance:g} and with the trainer within the band",
            figures,
            tuple(r.replica for r in blamed),
        )
        if in_sync:
            rest = max(r.max_abs for r in in_sync)
            mean = sum(r.mean_abs for r in in_sync) / len(in_sync)
            numerics = Finding(
                "numerics",
                rest,
                self.numerics_band,
                False,
                f"the in-sync replicas' gap to the trainer (mean {mean:.3g}), within what the served precision "
                "produces",
                {"mean_abs_dlogprob": mean},
            )
        else:
            numerics = Finding("numerics", None, self.numerics_band, False, "no replica serves the trainer's weights")
        return weights, numerics

    # ------------------------------------------------------------------ the deployment against itself

    def prompt_cache(self, sessions: dict[str, str]) -> Finding:
        """Per replica: the canary continued through its shared cache (what earlier traffic left,
        then what this request cached) against the same continuation fresh."""
        tokens = list(self.expected.tokens)
        worst: tuple[float, str] = (0.0, "")
        figures: dict[str, float] = {}
        crossed: list[str] = []
        for n, (replica, session) in enumerate(sessions.items()):
            try:
                shared = self._continued(tokens, {SESSION: session})
                fresh = self._continued(tokens, {SESSION: session, ISOLATION: self._key(f"cache-{n}")})
                again = self._continued(tokens, {SESSION: session})
            except FingerprintError as e:
                return Finding("prompt cache", None, self.self_tolerance, False, f"{replica}: {e}")
            for name, read in (("cached by earlier traffic", shared), ("cached by this diagnosis", again)):
                d, where = read.difference(fresh)
                figures[f"{replica}: {name}"] = d
                if d > self.self_tolerance and replica not in crossed:
                    crossed.append(replica)
                if d > worst[0] or not worst[1]:
                    worst = (d, f"{replica}, {name} ({read.cached} cached tokens reported): {where}")
        gap = worst[0]
        return Finding(
            "prompt cache",
            gap,
            self.self_tolerance,
            gap > self.self_tolerance,
            f"continuations through the shared cache against fresh; worst: {worst[1]}",
            figures,
            tuple(crossed),
        )

    def batching(self, session: str) -> Finding:
        """The canary's echo alone against beside `load_streams` streams decoding on its replica."""
        tokens = list(self.expected.tokens)
        try:
            alone = self._echo(tokens, {SESSION: session, ISOLATION: self._key("alone")})
        except FingerprintError as e:
            return Finding("batching", None, self.self_tolerance, False, str(e))
        started = [threading.Event() for _ in range(self.load_streams)]
        ended: dict[int, float] = {}

        def load(i: int) -> None:
            body = {
                "prompt": tokens[: DECODE_PROMPT - i],  # a prompt of its own: no cache hit shortens it
                "stream": True,
                "temperature": 0,
                "max_tokens": self.load_tokens,
                "ignore_eos": True,
            }
            headers = {SESSION: session, ISOLATION: self._key(f"load-{i}")}
            try:
                self.driver.complete(body, headers=headers, on_chunk=lambda _: started[i].set())
            finally:
                started[i].set()
                ended[i] = time.monotonic()

        with self.paced():
            threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(self.load_streams)]
            for t in threads:
                t.start()
            for event in started:
                event.wait(self.timeout)
            failed = ""
            try:
                crowded: list[float] | None = self._echo(tokens, {SESSION: session, ISOLATION: self._key("crowded")})
            except FingerprintError as e:
                crowded, failed = None, str(e)
            answered = time.monotonic()
            for t in threads:
                t.join(self.timeout)
        self._sent += self.load_streams
        if crowded is None:
            return Finding("batching", None, self.self_tolerance, False, f"beside the load: {failed}")
        # whether each stream was still decoding when the answer came: decided on the live clock
        # (a replay answers at once), recorded with a recording and replayed from it
        overlapped = sum(
            self.driver.client.decide(f"{self._key('overlap')}-{i}", ended.get(i, math.inf) > answered)
            for i in range(self.load_streams)
        )
        if overlapped == 0:
            return Finding(
                "batching",
                None,
                self.self_tolerance,
                False,
                f"every load stream ({self.load_tokens} tokens) had ended before the request judged was answered",
            )
        d, i = largest_difference(alone, crowded)
        return Finding(
            "batching",
            d,
            self.self_tolerance,
            d > self.self_tolerance,
            f"the canary alone and beside {overlapped} decoding stream(s): max |Δ| at token {i + 1}",
            {"concurrent_streams": float(overlapped)},
        )

    def decode_path(self, session: str) -> Finding:
        """Sampled tokens' logprobs as reported while decoding against the echo of the same tokens."""
        prompt = list(self.expected.tokens[:DECODE_PROMPT])
        headers = {SESSION: session, ISOLATION: self._key("decode")}
        # sampled, as a rollout is: tokens less likely than the greedy ones, whose logprobs are far
        # enough from 0 that a rounding of them (bf16's 2^-9) shows above a float32 tolerance
        body = {
            "prompt": prompt,
            "max_tokens": DECODED,
            "temperature": 1,
            "logprobs": True,
            "ignore_eos": True,
            "stream": True,
        }
        s = self.driver.complete(body, headers=headers)
        self._sent += 1
        generated = [(e.get("token_id"), e.get("logprob")) for e in s.entries] if s.ok else []
        if not generated or not all(isinstance(t, int) and _number(x) for t, x in generated):
            why = f"HTTP {s.status}" if not s.ok else "the generated tokens carry no token_id and logprob"
            return Finding("decode path", None, self.self_tolerance, False, why)
        ids = prompt + [int(t) for t, _ in generated]  # type: ignore[arg-type]  # checked above
        try:
            echoed = self._echo(ids, {SESSION: session, ISOLATION: self._key("decode-echo")})[len(prompt) - 1 :]
        except FingerprintError as e:
            return Finding("decode path", None, self.self_tolerance, False, str(e))
        d, i = largest_difference([float(x) for _, x in generated], echoed)  # type: ignore[arg-type]
        return Finding(
            "decode path",
            d,
            self.self_tolerance,
            d > self.self_tolerance,
            f"{len(generated)} sampled tokens: decode logprob against echo, max |Δ| at generated token {i}",
        )

    # ------------------------------------------------------------------ requests

    def _key(self, name: str) -> str:
        return f"rlrollout-diagnose-{self.salt}-{name}"

    def _echo(self, ids: list[int], headers: dict[str, str]) -> list[float]:
        s = self.driver.complete({"prompt": ids, **ECHO}, headers=headers)
        self._sent += 1
        if not s.ok:
            raise FingerprintError(f"an echo was answered HTTP {s.status}: {s.body[:200]}")
        return prompt_logprobs(s, len(ids))

    def _continued(self, ids: list[int], headers: dict[str, str]) -> Continuation:
        self._sent += 1
        return continuation(self.driver, ids, headers)
