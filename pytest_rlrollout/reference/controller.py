"""The deployment: replicas behind a session-affinity router, the bucket of snapshots, the
ledger, and hot-load signals validated with the project's validator and loaded in the
background on every replica."""

from __future__ import annotations

import collections
import copy
import json
import logging
import shutil
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.contract.identity import identity_problem
from pytest_rlrollout.reference import validator
from pytest_rlrollout.reference.model import Lora, Model
from pytest_rlrollout.reference.replica import PendingSwap, Replica
from pytest_rlrollout.reference.settings import OBSERVABLE_PACE as PACE
from pytest_rlrollout.reference.settings import Settings
from pytest_rlrollout.reference.validator import ValidatorFailed
from pytest_rlrollout.snapshot import build, tiny_moe
from pytest_rlrollout.snapshot.layout import SnapshotDir, UnsafePath
from pytest_rlrollout.snapshot.validate import Context, Finding, signal_findings

log = logging.getLogger(__name__)


class HotLoadError(Exception):
    def __init__(self, status: int, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


RESET_POLICIES = {"all", "new_session", "none"}
# the hint's one answer to an identity it will not look up: the same whatever is on the disk
HINT_REFUSAL = "identity: not one path segment naming a directory of the bucket (SNAP-ID-1)"


def _quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."


def reset_policy(value: object) -> str:
    """reset_prompt_cache as the docs (strings) or the official SDK (booleans) send it."""
    if value is None:
        return "all"
    if isinstance(value, bool):
        return "all" if value else "none"
    return str(value)


class Deployment:
    def __init__(self, settings: Settings):
        self.settings = settings
        bucket = settings.bucket
        bucket.mkdir(parents=True, exist_ok=True)
        base = bucket / settings.base_identity
        if not base.exists():
            tiny_moe.make_base(base)
        self._workdir = Path(tempfile.mkdtemp(prefix="rlrollout-deployment-"))
        self.full_dirs: dict[str, Path] = {settings.base_identity: base}
        self.config = json.loads((base / "config.json").read_text())
        model = Model.load(base)
        self.replicas = [Replica(i, settings, model, settings.base_identity) for i in range(settings.replicas)]
        self.ledger: list[dict[str, Any]] = []
        self.kinds: dict[str, str] = {settings.base_identity: "full"}  # how each identity was loaded (kept past resets)
        self.ledger_reset = False
        self.loading: str | None = None
        self._lock = threading.Lock()  # routing and the ledger: held for microseconds only
        self._signal_lock = threading.Lock()  # one signal judged at a time (validation included)
        self.workers = ThreadPoolExecutor(settings.workers, thread_name_prefix="rlrollout-request")
        # signals are judged on a thread of their own, so a validation taking seconds holds no
        # request worker; `_signal_lock`, not this pool, orders signals from every caller
        self.signals = ThreadPoolExecutor(1, thread_name_prefix="rlrollout-signal")
        self._round_robin = 0
        self.requests: collections.deque[tuple[str, str]] = collections.deque(maxlen=100_000)  # (method, path)
        validator.shared().warm()  # its imports run while the deployment starts, not at the first signal

    def set_pace(self, **delays: float) -> None:
        """Change how long loads, swaps and decode steps take (`load_delay`, `swap_delay`,
        `token_delay`): the suite slows an in-process deployment only while a test observes a
        swap in progress, and runs everything else at full speed."""
        unknown = set(delays) - set(PACE)
        if unknown:
            raise ValueError(f"not a pace setting: {sorted(unknown)} (known: {', '.join(PACE)})")
        self.settings = replace(self.settings, **delays)
        for replica in self.replicas:
            replica.settings = self.settings

    # ----------------------------------------------------------------------- routing

    def route(self, session: str | None, affinity: str | None) -> Replica:
        """x-multi-turn-session-id decides, then x-session-affinity; otherwise the least loaded."""
        f = self.settings.fault
        if f("SESS-1") and affinity is None:  # a lone session id is ignored (with both, it still decides)
            session = None
        if f("SESS-3") and session is None:
            affinity = None
        key = affinity if f("SESS-2") and affinity is not None else session if session is not None else affinity
        if key is not None:
            return self.replicas[zlib.crc32(key.encode()) % len(self.replicas)]
        with self._lock:
            self._round_robin += 1
            order = (
                self.replicas[self._round_robin % len(self.replicas) :]
                + self.replicas[: self._round_robin % len(self.replicas)]
            )
        return min(order, key=lambda r: r.load())

    # ----------------------------------------------------------------------- hot-load

    def status(self) -> dict[str, Any]:
        replicas = [r.status() for r in self.replicas]
        if self.settings.fault("HL-GET-1a"):
            for r in replicas:
                r["loading_state"] = None
        return {"status": replicas} if self.settings.fault("HL-GET-1") else {"replicas": replicas}

    def in_bucket(self, identity: str) -> Path | None:
        """The bucket's directory `identity` names, if it stays inside the bucket once every
        symlink is followed (an identity already judged by `identity_problem`)."""
        bucket = self.settings.bucket.resolve()
        try:
            path = (bucket / identity).resolve()
        except (OSError, RuntimeError):  # a symlink loop, a name the OS refuses
            return None
        return bucket / identity if path != bucket and path.is_relative_to(bucket) else None

    def hot_load(self, body: Any) -> dict[str, Any]:
        """Judge a signal and start the load (on a worker thread: validation may take seconds).
        Whatever the validator raises is a refusal (400), never an answer of 500."""
        with self._signal_lock:
            return self._hot_load(body)

    def _hot_load(self, body: Any) -> dict[str, Any]:
        received = time.time()
        f = self.settings.fault
        if not isinstance(body, dict):
            raise HotLoadError(400, "the request body must be a JSON object")
        if isinstance(body.get("reset_prompt_cache"), bool) and f("HL-POST-3a"):
            raise HotLoadError(400, "reset_prompt_cache: Input should be a valid string")
        try:
            problems = signal_findings(body)
        except Exception as e:
            log.exception("checking a signal failed")
            raise HotLoadError(400, f"the signal could not be checked ({type(e).__name__})") from None
        if f("HL-POST-2"):  # only the unknown-field rejection is broken; a missing identity is still refused
            problems = [p for p in problems if "Extra inputs" not in p.message]
        problems = [p for p in problems if p.clause == "HL-POST-2" or not f(p.clause)]
        if f("HL-POST-2a"):
            problems = [
                _finding(p.clause, p.message.replace("Extra inputs are not permitted, field:", "unknown field:"))
                for p in problems
            ]
        identity = body.get("identity")
        why = identity_problem(identity)
        if why and f("HL-POST-4"):
            raise HotLoadError(500, f"internal error resolving identity {_quote(identity)}")
        if why and not (f("SNAP-ID-1") and "'/'" in why):
            problems.insert(0, _finding("SNAP-ID-1", f"identity {_quote(identity)} {why}; it must be one path segment"))
        if problems:
            raise HotLoadError(
                400, "; ".join(p.message for p in problems)[:2000], clauses=sorted({p.clause for p in problems})
            )
        policy = reset_policy(body.get("reset_prompt_cache"))
        meta = body.get("incremental_snapshot_metadata") or None
        if meta is not None and not isinstance(meta, dict):  # only a fault switch lets one through
            raise HotLoadError(400, "incremental_snapshot_metadata must be an object")
        with self._lock:
            if self.loading is not None:
                raise HotLoadError(409, f"snapshot {self.loading} is still loading; signal again once it is ready")
            if any(e["identity"] == identity for e in self.ledger):
                raise HotLoadError(
                    409, f"identity {identity} is already in the ledger; every snapshot needs a new identity"
                )
        path = self.in_bucket(identity)
        if path is None:
            raise HotLoadError(400, f"identity {_quote(identity)} leaves the bucket", clauses=["SNAP-ID-1"])
        if not path.is_dir():
            raise HotLoadError(400, f"snapshot {identity} not found in the bucket")
        previous = meta.get("previous_snapshot_identity") if meta else None
        parent = self.full_dirs.get(previous) if isinstance(previous, str) else None
        if meta and f("SNAP-INC-5"):  # the bug: apply the diff onto whatever is served
            meta = {**meta, "previous_snapshot_identity": self.replicas[0].identity}
            parent = self.full_dirs.get(self.replicas[0].identity)
        ctx = Context(
            base=self.full_dirs[self.settings.base_identity],
            parent=parent,
            signal={k: v for k, v in body.items() if k != "validation"} if f("HL-CONFIG-2") else body,
            identity=identity,
            served=tuple(r.identity for r in self.replicas),
            ledger_reset=self.ledger_reset,
            base_model=(self.settings.model, self.settings.deployment, self.settings.base_identity),
        )
        # outside self._lock: routing takes it for every request. In a process of its own: a
        # hostile snapshot's headers hold the GIL for as long as they take to parse, which a
        # thread would not spare the event loop and the replicas
        try:
            report = validator.shared().validate(path, ctx, self.settings.validate_timeout)
            failures = report.failures("MUST")
        except ValidatorFailed as e:
            raise HotLoadError(400, f"snapshot {identity} could not be validated: {e}") from None
        except Exception as e:
            log.exception("validating %s failed", path)
            raise HotLoadError(400, f"snapshot {identity} could not be validated ({type(e).__name__})") from None
        refused = [x for x in failures if not f(x.clause)]
        # a SNAP fault switch on: the violation is let through, and a load it breaks is
        # "recovered" by keeping the old weights under the new identity (a swallowed error)
        let_through = [x for x in failures if f(x.clause) and x.clause.startswith("SNAP-")]
        if f("HL-CONFIG-1"):
            refused = [
                _finding(x.clause, "config differs from the base model") if x.clause == "SNAP-CONFIG-2" else x
                for x in refused
            ]
        deferred = refused if f("HL-POST-5a") else []
        if refused and not (f("HL-POST-5") or f("HL-POST-5a")):
            raise HotLoadError(
                400, "; ".join(str(x) for x in refused[:8])[:4000], clauses=sorted({x.clause for x in refused})
            )
        kind = report.kind
        if meta and parent is None and not f("HL-POST-5"):
            raise HotLoadError(400, "SNAP-INC-5: previous_snapshot_identity is not a loaded snapshot")
        entry = {
            "identity": identity,
            "kind": kind,
            "received_at": received,
            "signalled_at": time.time(),
            "replicas": {},
            "error": None,
        }
        with self._lock:
            self.kinds[identity] = kind
            self.ledger.insert(0, entry)
            self.loading = identity
            if kind != "incremental":
                self.ledger_reset = False
        targets = self.replicas[:1] if f("HL-GET-2") else self.replicas
        remaining = [len(targets)]
        for i, replica in enumerate(targets):
            args = (replica, i, identity, path, kind, meta, policy, entry, remaining, deferred, bool(let_through))
            threading.Thread(target=self._load_on, args=args, daemon=True).start()
        return {"identity": identity, "kind": kind, "reset_prompt_cache": policy, "status": "accepted"}

    def _load_on(
        self, replica: Replica, i, identity, path: Path, kind, meta, policy, entry, remaining, deferred, swallow=False
    ) -> None:
        replica.set_loading("downloading", identity)
        time.sleep(self.settings.load_delay + self.settings.stagger * i)
        try:
            replica.set_loading("loading", identity)
            if deferred:  # HL-POST-5a fault: what POST should have refused fails now
                raise ValueError("; ".join(str(x) for x in deferred[:4]))
            model, lora = None, None
            if kind == "lora":
                lora = Lora.load(path, identity)
            elif kind == "incremental":
                previous = meta["previous_snapshot_identity"]
                model = self._misapplied(replica, Model.load(self._materialize(identity, path, previous)), previous)
            else:
                model = Model.load(path)
                self.full_dirs[identity] = path
            if model is not None and self._label_only(replica):
                model = replica.model
        except Exception as e:  # the previous snapshot keeps serving; the status says why
            if swallow:
                model, lora = replica.model, None
                replica.request_swap(
                    PendingSwap(identity, model, lora, policy, lambda: self._replica_finished(remaining))
                )
                return
            stage = "loading" if self.settings.fault("HL-GET-3") else "error"
            replica.set_loading(stage, identity, f"{type(e).__name__}: {e}")
            entry["error"] = f"{replica.name}: {type(e).__name__}: {e}"
            self._replica_finished(remaining)
            return

        def done() -> None:
            entry["replicas"][replica.name] = time.time()
            self._replica_finished(remaining)

        replica.request_swap(PendingSwap(identity, model, lora, policy, done))

    # ----------------------------------------------------------------------- weight-fidelity faults

    def _label_only(self, replica: Replica) -> bool:
        """FID-SWAP-1 faults: this replica's load changes the label and keeps the weights."""
        f = self.settings.fault
        return f("FID-SWAP-1") or (f("FID-SWAP-1:one") and replica is self.replicas[-1])

    def _misapplied(self, replica: Replica, model: Model, previous: str) -> Model:
        """An ARC2 diff's result as the FID-SAME-1 faults corrupt it (else `model` itself)."""
        f = self.settings.fault
        if f("FID-SAME-1"):  # the diff (parent XOR target) lands on the base: base ^ parent ^ target
            base = Model.load(self.full_dirs[self.settings.base_identity])
            model = _xor_weights(base, Model.load(self.full_dirs[previous]), model)
        if f("FID-SAME-1:experts") and self.kinds.get(replica.identity) == "incremental":
            first = next(i for i, layer in enumerate(model.layers) if layer.router is not None)
            kept = replica.model.layers[first]
            model.layers[first] = replace(model.layers[first], w_gate_up=kept.w_gate_up, w_down=kept.w_down)
        return model

    def _replica_finished(self, remaining: list[int]) -> None:
        with self._lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                self.loading = None

    def _materialize(self, identity: str, diff: Path, previous: str) -> Path:
        """The full snapshot an ARC2 diff describes, built once and shared by the replicas."""
        with self._lock:
            if identity in self.full_dirs:
                return self.full_dirs[identity]
            out = build.apply_incremental(self.full_dirs[previous], diff, self._workdir / identity)
            self.full_dirs[identity] = out
            return out

    def reset_ledger(self) -> dict[str, Any]:
        with self._lock:
            forgotten = len(self.ledger)
            self.ledger, self.ledger_reset = [], True
        return {"forgotten": forgotten}

    def hint(self, body: Any) -> dict[str, Any]:
        """{} when the file is in the named snapshot of the bucket, 404 when it is not. Every
        identity that is not a directory name inside the bucket gets one and the same refusal,
        decided before the disk is touched (or, for a symlink, whatever it points to): the hint
        tells nothing about paths outside the bucket."""
        if not (isinstance(body, dict) and isinstance(body.get("identity"), str) and isinstance(body.get("file"), str)):
            raise HotLoadError(400, "a hint is {'identity': str, 'file': str}")
        if set(body) - {"identity", "file"}:
            extra = sorted(set(body) - {"identity", "file"})[0]
            raise HotLoadError(400, f"Extra inputs are not permitted, field: {_quote(extra)}")
        identity, name = body["identity"], body["file"]
        root = self.in_bucket(identity) if identity_problem(identity) is None else None
        if root is None:
            raise HotLoadError(400, HINT_REFUSAL, clauses=["SNAP-ID-1"])
        try:
            known = identity_problem(name) is None and root.is_dir() and SnapshotDir(root).has(name)
        except (UnsafePath, OSError, ValueError):
            known = False
        if not known:
            raise HotLoadError(404, f"no file {_quote(name)} in snapshot {_quote(identity)}")
        if self.settings.fault("HL-HINT-1") and self.loading is None and identity not in self.full_dirs:
            self.hot_load({"identity": identity})
        return {}

    def close(self) -> None:
        for pool in (self.workers, self.signals):
            pool.shutdown(wait=False, cancel_futures=True)
        for r in self.replicas:
            r.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)


def _xor_weights(base: Model, parent: Model, target: Model) -> Model:
    """`target`'s diff applied onto `base` bit for bit: base ^ parent ^ target on every weight
    (float32 arrays widened from bfloat16 XOR as their bfloat16 bits do)."""

    def xor(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        bits = np.ascontiguousarray(a).view(np.uint32) ^ np.ascontiguousarray(b).view(np.uint32)
        return (bits ^ np.ascontiguousarray(c).view(np.uint32)).view(np.float32)

    out = copy.copy(target)
    for name in ("embed", "final_norm", "lm_head"):
        setattr(out, name, xor(getattr(base, name), getattr(parent, name), getattr(target, name)))
    out.layers = []
    for b, p, t in zip(base.layers, parent.layers, target.layers, strict=True):
        names = [f.name for f in fields(t) if getattr(t, f.name) is not None]
        out.layers.append(replace(t, **{n: xor(getattr(b, n), getattr(p, n), getattr(t, n)) for n in names}))
    return out


def _finding(clause: str, message: str):
    return Finding(clause, catalogue()[clause].level, "signal", message)
