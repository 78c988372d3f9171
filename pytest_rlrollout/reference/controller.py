"""The deployment, the engine core both wires share: replicas behind a session-affinity router,
the bucket of snapshots and what each load must pass (`admission`), and the operations the
dialects' routers call. Fireworks: hot-load signals (with the ledger and the hint) loaded in the
background on every replica. vLLM: reload_weights (a synchronous load of a full snapshot), the
weight-version label, pause and resume, and a prefix-cache reset."""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from pytest_rlrollout.contract.identity import identity_problem
from pytest_rlrollout.engines import spec
from pytest_rlrollout.reference import validator
from pytest_rlrollout.reference.admission import HotLoadError, LoadInProgress, admit
from pytest_rlrollout.reference.admission import finding as _finding
from pytest_rlrollout.reference.model import Lora, Model
from pytest_rlrollout.reference.replica import PAUSE_MODES, PendingSwap, Replica
from pytest_rlrollout.reference.settings import FIRST_LABEL, Settings
from pytest_rlrollout.reference.settings import OBSERVABLE_PACE as PACE
from pytest_rlrollout.reference.weights import keep_experts, misread_experts, moe_layers, xor_weights
from pytest_rlrollout.reference.wire import Logged
from pytest_rlrollout.snapshot import build, tiny_moe
from pytest_rlrollout.snapshot.layout import SnapshotDir, UnsafePath
from pytest_rlrollout.snapshot.validate import Context, signal_findings

log = logging.getLogger(__name__)

__all__ = ["HINT_REFUSAL", "Deployment", "HotLoadError", "reset_policy"]

REPLICA_STOP = 5.0  # seconds a closing deployment waits for its replicas' workers to end
LATE_SWAP_REQUESTS = 3  # the CTL-LABEL-1 fault: requests served on the old weights after a reload

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
        # written once however many engines share the bucket (a fleet), reused as it is
        base = tiny_moe.ensure_base(bucket / settings.base_identity, layout=settings.layout)
        self._workdir = Path(tempfile.mkdtemp(prefix="rlrollout-deployment-"))
        self.full_dirs: dict[str, Path] = {settings.base_identity: base}
        self.config = json.loads((base / "config.json").read_text())
        model = Model.load(base)
        self.replicas = [Replica(i, settings, model, settings.base_identity) for i in range(settings.replicas)]
        # self-hosted engines (vLLM, SGLang): tokens are versioned by a label set apart from the
        # weights, "default" at start
        self.labelled = spec(settings.engine).self_hosted
        for replica in self.replicas:
            replica.label = FIRST_LABEL if self.labelled else None
        self.info_label = FIRST_LABEL  # what GET /weight_info reads (HL-GET-2 fault: never updated)
        self.paused: str | None = None  # the pause mode POST /pause reported
        self.reloads = 0  # reload_weights calls that loaded (FID-SAME-1:experts fault)
        self.ledger: list[dict[str, Any]] = []
        self.kinds: dict[str, str] = {settings.base_identity: "full"}  # how each identity was loaded (kept past resets)
        self.ledger_reset = False
        self.loading: str | None = None
        self.closed = False  # set by close(): what still waits for a replica gives up
        self._closing = threading.Event()  # the same, for what waits out a delay
        self._lock = threading.Lock()  # routing and the ledger: held for microseconds only
        self._signal_lock = threading.Lock()  # one signal judged at a time (validation included)
        self.workers = ThreadPoolExecutor(settings.workers, thread_name_prefix="rlrollout-request")
        # signals are judged on a thread of their own, so a validation taking seconds holds no
        # request worker; `_signal_lock`, not this pool, orders signals from every caller
        self.signals = ThreadPoolExecutor(1, thread_name_prefix="rlrollout-signal")
        # pause and resume block until the replicas settle (wait mode: until the requests in
        # flight finished), on threads of their own
        self.control = ThreadPoolExecutor(4, thread_name_prefix="rlrollout-control")
        self._round_robin = 0
        self.requests: collections.deque[Logged] = collections.deque(maxlen=100_000)  # what was asked, and when
        validator.shared().warm()  # its imports run while the deployment starts, not at the first signal

    def set_pace(self, **delays: float) -> None:
        """Change how long loads, swaps and decode steps take (`load_delay`, `swap_delay`,
        `token_delay`): the suite slows an in-process deployment only while a test observes a
        swap in progress, and runs everything else at full speed."""
        unknown = set(delays) - set(PACE)
        if unknown:
            raise ValueError(f"not a pace setting: {sorted(unknown)} (known: {', '.join(PACE)})")
        changes: dict[str, Any] = delays  # the pace settings' names, checked above
        self.settings = replace(self.settings, **changes)
        for replica in self.replicas:
            replica.settings = self.settings

    # ----------------------------------------------------------------------- routing

    def route(self, session: str | None, affinity: str | None) -> Replica:
        """x-multi-turn-session-id decides, then x-session-affinity; otherwise the least loaded."""
        f = self.settings.fault
        if affinity is None and f("SESS-1"):  # a lone session id is ignored (with both, it still decides)
            session = None
        if session is None and f("SESS-3"):
            affinity = None
        key = affinity if affinity is not None and f("SESS-2") else session if session is not None else affinity
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
        if path == bucket or not path.is_relative_to(bucket):
            return None
        if self.settings.mirror is not None and not path.exists():
            self._download(identity, bucket / identity)
        return bucket / identity

    def _download(self, identity: str, local: Path) -> None:
        """Copy snapshot `identity` from the object store into the local bucket, whole or not at
        all (a snapshot the store does not hold stays absent: 'not found in the bucket')."""
        import fsspec

        fs, root = fsspec.core.url_to_fs(self.settings.mirror, **self.settings.mirror_options)
        remote = f"{root.rstrip('/')}/{identity}"
        if not fs.isdir(remote):
            return
        partial = Path(tempfile.mkdtemp(prefix=f".{identity[:50]}-", dir=local.parent))
        try:
            fs.get(remote + "/", str(partial) + "/", recursive=True)
            os.replace(partial, local)
        finally:
            shutil.rmtree(partial, ignore_errors=True)

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
        # each switch is asked about only where it changes the answer: the mutation matrix runs a
        # switch's row on the tests that read it (tests/suite/test_mutation_matrix.py)
        extra = any("Extra inputs" in p.message for p in problems)
        if extra and f("HL-POST-2"):  # only the unknown-field rejection is broken; a missing identity is still refused
            problems = [p for p in problems if "Extra inputs" not in p.message]
        problems = [p for p in problems if p.clause == "HL-POST-2" or not f(p.clause)]
        if extra and f("HL-POST-2a"):
            problems = [
                _finding(p.clause, p.message.replace("Extra inputs are not permitted, field:", "unknown field:"))
                for p in problems
            ]
        identity = body.get("identity")
        why = identity_problem(identity)
        if why and f("HL-POST-4"):
            raise HotLoadError(500, f"internal error resolving identity {_quote(identity)}")
        if why and not ("'/'" in why and f("SNAP-ID-1")):
            problems.insert(0, _finding("SNAP-ID-1", f"identity {_quote(identity)} {why}; it must be one path segment"))
        if problems:
            raise HotLoadError(
                400, "; ".join(p.message for p in problems)[:2000], clauses=sorted({p.clause for p in problems})
            )
        # a cast: an identity that is not a string has a SNAP-ID-1 problem, raised just above
        identity = cast("str", identity)
        policy = reset_policy(body.get("reset_prompt_cache"))
        meta = body.get("incremental_snapshot_metadata") or None
        if meta is not None and not isinstance(meta, dict):  # only a fault switch lets one through
            raise HotLoadError(400, "incremental_snapshot_metadata must be an object")
        with self._lock:
            if self.loading is not None:
                raise LoadInProgress(409, f"snapshot {self.loading} is still loading; signal again once it is ready")
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
            signal={k: v for k, v in body.items() if k != "validation"}
            if "validation" in body and f("HL-CONFIG-2")
            else body,
            identity=identity,
            served=tuple(r.identity for r in self.replicas),
            ledger_reset=self.ledger_reset,
            base_model=(self.settings.model, self.settings.deployment, self.settings.base_identity),
        )
        admission = admit(self.settings, path, ctx)  # outside self._lock: routing takes it for every request
        kind = admission.kind
        if meta and parent is None and not f("HL-POST-5"):
            raise HotLoadError(400, "SNAP-INC-5: previous_snapshot_identity is not a loaded snapshot")
        entry: dict[str, Any] = {
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
            args = (
                replica,
                i,
                identity,
                path,
                kind,
                meta,
                policy,
                entry,
                remaining,
                admission.deferred,
                admission.swallow,
            )
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
        return f("FID-SWAP-1") or (replica is self.replicas[-1] and f("FID-SWAP-1:one"))

    def _misapplied(self, replica: Replica, model: Model, previous: str) -> Model:
        """An ARC2 diff's result as the FID-SAME-1 faults corrupt it (else `model` itself)."""
        f = self.settings.fault
        if f("FID-SAME-1"):  # the diff (parent XOR target) lands on the base: base ^ parent ^ target
            base = Model.load(self.full_dirs[self.settings.base_identity])
            model = xor_weights(base, Model.load(self.full_dirs[previous]), model)
        if self.kinds.get(replica.identity) == "incremental" and f("FID-SAME-1:experts"):
            model = keep_experts(model, replica.model, moe_layers(model)[:1])
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
        if self.loading is None and identity not in self.full_dirs and self.settings.fault("HL-HINT-1"):
            self.hot_load({"identity": identity})
        return {}

    # ----------------------------------------------------------------------- vLLM's RL routes

    def reload_weights(self, weights_path: object) -> None:
        """vLLM's collective_rpc reload_weights: load the full snapshot at `weights_path` (a
        directory of the bucket) on every replica and return once they serve it, swapped at a
        token boundary; in-flight requests continue on it (or, frozen by a pause, once resumed).
        The label does not change, nor does the prefix cache (it keeps what was computed on the
        weights before: the reason a trainer resets it). A snapshot that fails validation or
        loading is refused (HotLoadError) and the previous weights keep serving."""
        f = self.settings.fault
        identity, path = self._weights_dir(weights_path)
        with self._signal_lock:
            ctx = Context(
                base=self.full_dirs[self.settings.base_identity],
                parent=None,
                signal={"identity": identity},
                identity=identity,
                served=tuple(r.identity for r in self.replicas),
                ledger_reset=self.ledger_reset,
                base_model=(self.settings.model, self.settings.deployment, self.settings.base_identity),
            )
            admission = admit(self.settings, path, ctx)
            if admission.kind != "full":
                raise HotLoadError(400, f"reload_weights loads full checkpoints; {identity} is {admission.kind}")
            # reading the weights takes `load_delay` (minutes for a production model), and the
            # request is answered only after it, as vLLM's is
            if self._closing.wait(self.settings.load_delay):
                raise HotLoadError(503, "the deployment is shutting down")
            models = [self._reloaded(replica, identity, path, admission) for replica in self.replicas]
            self.reloads += 1
            self.full_dirs[identity] = path
            swapped = []
            for replica, model in zip(self.replicas, models, strict=True):
                done = threading.Event()
                swap = PendingSwap(identity, model, None, "none", done.set)
                if f("CTL-LABEL-1"):  # the bug: answered now, swapped once a few requests went by
                    replica.defer_swap(swap, LATE_SWAP_REQUESTS)
                else:
                    replica.request_swap(swap)
                    swapped.append(done)
            for done in swapped:
                # a replica stopped with the deployment never swaps: the request waiting here (in
                # a pool thread the interpreter joins at exit) must not wait for it for good
                while not done.wait(timeout=0.05):
                    if self.closed:
                        raise HotLoadError(503, "the deployment is shutting down")

    def _reloaded(self, replica: Replica, identity: str, path: Path, admission: Any) -> Model:
        """The weights `replica` serves after reloading `path` (as the fault switches corrupt them)."""
        f = self.settings.fault
        try:
            if admission.deferred:  # HL-POST-5a fault: what validation should have refused fails now
                raise ValueError("; ".join(str(x) for x in admission.deferred[:4]))
            model = Model.load(path)
        except Exception as e:
            if admission.swallow:  # a SNAP fault's violation "recovered" by keeping the old weights
                return replica.model
            raise HotLoadError(400, f"snapshot {identity} could not be loaded: {type(e).__name__}: {e}") from None
        if self._label_only(replica):
            return replica.model
        if f("FID-SAME-1"):  # the experts read in the checkpoint's layout (vLLM 0.32's CPU reload)
            return misread_experts(model, moe_layers(model))
        if self.reloads >= 1 and f("FID-SAME-1:experts"):  # only the first MoE layer's, from the second on
            return misread_experts(model, moe_layers(model)[:1])
        return model

    def _weights_dir(self, weights_path: object) -> tuple[str, Path]:
        """The identity and directory a reload names: an absolute path whose parent is the bucket
        and whose name is one path segment, still inside the bucket once symlinks are followed."""
        bucket = self.settings.bucket.resolve()
        refusal = HotLoadError(
            400,
            f"weights_path {_quote(weights_path)} is not a snapshot directory of the bucket {bucket} (SNAP-ID-1)",
            clauses=["SNAP-ID-1"],
        )
        if not isinstance(weights_path, str) or not weights_path or "\x00" in weights_path:
            raise refusal
        path = Path(os.path.normpath(weights_path))
        try:
            parent = path.parent.resolve() if path.is_absolute() else None
        except (OSError, RuntimeError, ValueError):
            parent = None
        if parent != bucket or identity_problem(path.name) is not None:
            raise refusal
        inside = self.in_bucket(path.name)
        if inside is None:
            raise refusal
        if not inside.is_dir():
            raise HotLoadError(400, f"snapshot {path.name} not found in the bucket")
        return path.name, inside

    def set_label(self, label: str) -> None:
        """vLLM's /update_weight_version: tokens generated from now on carry `label`; no weights change."""
        for replica in self.replicas:
            replica.label = label
        if not self.settings.fault("HL-GET-2"):
            self.info_label = label
        if self.settings.fault("CTL-LABEL-1:aborts"):  # the bug: a label change aborts the requests in flight
            for replica in self.replicas:
                replica.end_in_flight(("end", "abort"))

    def pause(self, mode: str, clear_cache: bool, recompute: bool | None = None) -> None:
        """vLLM's /pause: `mode` one of PAUSE_MODES (ValueError otherwise); returns once the
        pause took hold (wait: once the requests in flight finished). `clear_cache` resets the
        prefix cache after it; in keep mode the frozen requests also recompute their KV (or as
        `recompute` says: SGLang's retract recomputes and keeps the cache)."""
        f = self.settings.fault
        if mode not in PAUSE_MODES:
            if not f("CTL-PAUSE-5"):
                raise ValueError(f"Invalid pause mode: {mode}")
            mode = "abort"  # the bug: an unknown mode falls through to the default
        self.paused = mode
        if f("CTL-PAUSE-1"):  # the bug: the pause is reported and generation goes on (after a drain, in wait mode)
            if mode == "wait":
                for replica in self.replicas:
                    replica.pause("wait")
                    replica.settle()
                    replica.resume()
            return
        held = "keep" if mode == "wait" and f("CTL-PAUSE-4") else mode
        for replica in self.replicas:
            replica.pause(held, recompute=clear_cache if recompute is None else recompute)
        for replica in self.replicas:
            replica.settle()
        if clear_cache:  # vLLM preempts what still runs so that the reset cannot fail
            self.reset_prefix_cache(running=True)

    def resume(self) -> None:
        self.paused = None
        for replica in self.replicas:
            replica.resume()

    def reset_prefix_cache(self, running: bool = False) -> bool:
        """vLLM's /reset_prefix_cache: every replica forgets every cached prefix; False (nothing
        reset) while requests decode on KV of their own, as vLLM refuses while blocks are held,
        unless `running` (vLLM's reset_running_requests: they recompute their KV). Requests
        frozen by a keep pause hold it up too (measured on vLLM 0.32: `success: false`)."""
        f = self.settings.fault
        lies = f("CTL-CACHE-1") or f("SWAP-KV-1")  # both bugs report success whatever runs
        if not running and not lies and any(r.running() for r in self.replicas):
            return False
        for replica in self.replicas:
            replica.reset_cache(preempt=running)
        return True

    def close(self) -> None:
        for pool in (self.workers, self.signals, self.control):
            pool.shutdown(wait=False, cancel_futures=True)
        self.closed = True
        self._closing.set()
        for r in self.replicas:  # all told first, then joined: the stop takes one replica's time, not the sum
            r.stop()
        deadline = time.monotonic() + REPLICA_STOP
        for r in self.replicas:
            r.join(timeout=max(0.0, deadline - time.monotonic()))
        shutil.rmtree(self._workdir, ignore_errors=True)
