"""The snapshots a conformance run swaps into a deployment (the `rl_snapshot_factory` fixture).

Every snapshot is the base (a local copy, `--rl-base-snapshot`) with a few tensors changed by a
named operation, so any worker can rebuild any snapshot's bytes from the base and a small
record. Swaps go along a chain of **sentinel deltas**: ARC2 diffs against the snapshot being
served that change one small tensor (a norm vector, or the MoE routers when routing must
change). Their diff files are zero frames except for that tensor, so a live swap uploads a few
kilobytes per shard, far below 1% of a full snapshot. A full snapshot is uploaded only when the
chain has no known start (the deployment serves a snapshot the run did not make and the base
copy is not named after it) or after a ledger reset.

Identities are unique per run (`rlt-<run>-<n>-<label>`); everything uploaded is removed at the
end. The record of what each identity holds lives in a JSON file shared by xdist workers; it is
only written under the deployment's exclusive lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_rlrollout.remote.bucket import Bucket
from pytest_rlrollout.snapshot import arc2, build
from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot.layout import CONFIG, INDEX, SPEC

Op = list  # ["scale", factor] | ["negate"]: applied to the base tensor
Overlay = dict[str, Op]  # tensor name -> op; tensors not listed equal the base

IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # what the suite names its snapshots
ROUTER = re.compile(r"\.(mlp|block_sparse_moe)\.gate\.weight$")
EXPERT = re.compile(r"layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.\d+\.")
LAYER_NORM = re.compile(r"layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight$")
FINAL_NORM = re.compile(r"^(model\.)?norm\.weight$")
FLOATS = ("BF16", "F16", "F32")


@dataclass
class Built:
    """A snapshot in the bucket, ready to signal."""

    identity: str
    kind: str  # full | incremental | lora
    signal: dict[str, Any]
    local: Path
    uploaded_bytes: int
    overlay: Overlay | None = None  # None for LoRA
    copied_bytes: int = 0  # copied inside the bucket (bucket-side, nothing uploaded)

    def note(self, full_bytes: int) -> dict[str, Any]:
        """What building it cost, for the report."""
        return {"identity": self.identity, "kind": self.kind, "uploaded": self.uploaded_bytes,
                "copied": self.copied_bytes, "of_full": round(self.uploaded_bytes / max(full_bytes, 1), 6)}  # fmt: skip


@dataclass
class Record:
    """What each identity holds; shared by the workers of one run through a JSON file."""

    path: Path
    overlays: dict[str, Overlay] = field(default_factory=dict)
    needs_full: bool = False

    def load(self) -> Record:
        if self.path.is_file():
            doc = json.loads(self.path.read_text())
            self.overlays, self.needs_full = doc["overlays"], doc["needs_full"]
        return self

    def save(self) -> None:
        doc = {"overlays": self.overlays, "needs_full": self.needs_full}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)


def _apply(t: st.Tensor, op: Op) -> st.Tensor:
    x = t.float32()
    y = -x if op[0] == "negate" else x * float(op[1])
    return st.Tensor.bf16(y) if t.dtype == "BF16" else st.Tensor(t.dtype, t.shape, y.astype(t.data.dtype))


class SnapshotFactory:
    def __init__(
        self,
        base: Path,
        bucket: Bucket,
        workdir: Path,
        run_id: str,
        record_path: Path,
        *,
        model: str,
        incremental: bool = True,
    ):
        self.base, self.bucket, self.workdir, self.run_id, self.model = Path(base), bucket, Path(workdir), run_id, model
        self.incremental = incremental  # the engine loads ARC2 diffs: swaps go along sentinel deltas
        self.record = Record(record_path).load()
        self.uploaded: list[str] = []  # by this process: each worker removes its own at the end
        self.test_key, self._serial, self.last_serial = "000000", {}, 0
        if not self.record.overlays:
            self.record.overlays[self.base.name] = {}  # the base copy is named after the identity it holds
            self.record.save()
        self.index = json.loads((self.base / INDEX).read_text())
        self._headers = {f: st.read_header(self.base / f) for f in sorted(set(self.index["weight_map"].values()))}
        self._checksums: dict[str, str] = {}
        self.notes: list[dict[str, Any]] = []  # what the current test built (the report states it)
        self.adapters: dict[str, Path] = {}  # LoRA identity -> its local directory (built by this process)
        self.full_bytes = sum((self.base / f).stat().st_size for f in self._headers)

    # ----------------------------------------------------------------------- what tensors to change

    def _info(self, name: str) -> st.TensorInfo:
        return self._headers[self.index["weight_map"][name]].tensors[name]

    @property
    def sentinel_tensor(self) -> str:
        """The smallest floating norm vector (else the smallest floating tensor)."""
        floats = [n for n in self.index["weight_map"] if self._info(n).dtype in FLOATS]
        norms = [n for n in floats if "norm" in n] or floats
        return min(norms, key=lambda n: (self._info(n).nbytes, n))

    @property
    def router_tensors(self) -> list[str]:
        return sorted(n for n in self.index["weight_map"] if ROUTER.search(n))

    @property
    def expert_tensors(self) -> list[str]:
        """The smallest floating expert tensor of every MoE layer (changing one per layer costs
        a small fraction of a snapshot and reaches every layer's experts)."""
        by_layer: dict[int, list[str]] = {}
        for n in self.index["weight_map"]:
            m = EXPERT.search(n)
            if m and self._info(n).dtype in FLOATS:
                by_layer.setdefault(int(m.group(1)), []).append(n)
        return [min(names, key=lambda n: (self._info(n).nbytes, n)) for _, names in sorted(by_layer.items())]

    def visible_change(self, serving: str | None, *, kv: bool = False) -> dict[str, Op]:
        """A change no fingerprint can miss: a norm vector doubled (the final norm doubles every
        logit; `kv`: a layer's input norm, which changes the KV of every later position). The
        tensor is one that `serving` holds at its base value, so a diff of it XORs base bytes."""
        overlay = self.record.overlays.get(serving or "", {})
        names = list(self.index["weight_map"])
        layers = sorted((n for n in names if LAYER_NORM.search(n) and "input" in n),
                        key=lambda n: int(LAYER_NORM.search(n).group(1)))  # fmt: skip
        finals = [] if kv else [n for n in names if FINAL_NORM.search(n)]
        candidates = [n for n in [*finals, *layers] if n != self.sentinel_tensor]
        if not candidates:
            raise LookupError("no norm vector (model.norm.weight, layers.N.input_layernorm.weight) to change")
        for name in candidates:
            if overlay.get(name, ["scale", 1.0]) == ["scale", 1.0]:
                return {name: ["scale", 2.0]}
        return {candidates[0]: ["scale", 1.0]}  # every one is changed: undo the first

    # ----------------------------------------------------------------------- bytes of a snapshot

    def _base_tensor(self, name: str) -> st.Tensor:
        return st.read_tensor(self._info(name), self.base / self.index["weight_map"][name])

    def _bytes(self, name: str, overlay: Overlay) -> bytes:
        t = self._base_tensor(name)
        return bytes((_apply(t, overlay[name]) if name in overlay else t).buffer())

    def _checksum(self, name: str, overlay: Overlay) -> str:
        if name in overlay:
            return str(zlib.adler32(self._bytes(name, overlay)))
        if name not in self._checksums:
            info, path = self._info(name), self.base / self.index["weight_map"][name]
            adler = zlib.adler32(b"")
            with open(path, "rb") as f:
                f.seek(info.start)
                left = info.nbytes
                while left:
                    block = f.read(min(arc2.CHUNK, left))
                    adler, left = zlib.adler32(block, adler), left - len(block)
            self._checksums[name] = str(adler)
        return self._checksums[name]

    # ----------------------------------------------------------------------- building

    def know(self, identity: str, overlay: Overlay) -> None:
        """Record what a snapshot the run did not build holds (the deployment served it at the start)."""
        self.record.load()
        if identity not in self.record.overlays:
            self.record.overlays[identity] = overlay
            self.record.save()

    def knows(self, identity: str | None) -> bool:
        return identity is not None and identity in self.record.overlays

    def for_test(self, nodeid: str, notes: list[dict[str, Any]] | None = None) -> None:
        """Name what follows after this test (identities are then the same in every replay);
        what it builds is noted in `notes`."""
        self.test_key = hashlib.sha1(nodeid.encode()).hexdigest()[:6]
        self.notes = notes if notes is not None else []

    def new_identity(self, label: str) -> str:
        self._serial[self.test_key] = n = self._serial.get(self.test_key, 0) + 1
        self.last_serial = n + int(self.test_key, 16)
        return self._checked(f"rlt-{self.run_id}-{self.test_key}-{n:02d}-{label}")

    @staticmethod
    def _checked(identity: str) -> str:
        """`identity`, if it is one safe path segment: the run id in it may come from a cassette."""
        if not IDENTITY.fullmatch(identity):
            raise ValueError(f"refusing to build snapshot identity {identity[:100]!r}: not one safe path segment")
        return identity

    def state(self) -> dict:
        """What this run knows (for a cassette: replay restores it before the test)."""
        self.record.load()
        return {"overlays": self.record.overlays, "needs_full": self.record.needs_full}

    def restore(self, state: dict) -> None:
        self.record.load()
        self.record.overlays.update(state["overlays"])
        self.record.needs_full = state["needs_full"]
        self.record.save()

    def _remember(self, identity: str, overlay: Overlay | None) -> None:
        self.record.load()
        if overlay is not None:
            self.record.overlays[identity] = overlay
        self.record.save()
        self.uploaded.append(identity)

    def _upload(self, local: Path, identity: str, kind: str, signal: dict, overlay: Overlay | None) -> Built:
        sent = self.bucket.upload(local, identity)
        self._remember(identity, overlay)
        return self._noted(Built(identity, kind, signal, local, sent, overlay))

    def _noted(self, built: Built) -> Built:
        self.notes.append(built.note(self.full_bytes))
        return built

    def base_copy(self, label: str = "full") -> Built:
        """A full snapshot of the base weights under a new identity: copied inside the bucket when
        it holds the base under its name (nothing uploaded), else uploaded whole."""
        if not self.bucket.exists(self.base.name):
            return self.full(label)
        identity = self.new_identity(label)
        copied = self.bucket.copy(self.base.name, identity)
        self._remember(identity, {})
        return self._noted(Built(identity, "full", {"identity": identity}, self.base, 0, {}, copied))

    def _config(self, edit: Callable[[dict], object] | None) -> dict | None:
        if edit is None:
            return None
        cfg = json.loads((self.base / CONFIG).read_text())
        edit(cfg)
        return cfg

    def full(self, label: str = "full", overlay: Overlay | None = None, config_edit=None) -> Built:
        """A full snapshot: the base with `overlay` applied (a whole upload)."""
        overlay = dict(overlay or {})
        identity = self.new_identity(label)
        local = self.workdir / identity
        change = {n: _apply(self._base_tensor(n), op) for n, op in overlay.items()}
        build.derive(self.base, local, change, config=self._config(config_edit))
        return self._upload(local, identity, "full", {"identity": identity}, overlay)

    def sentinel(
        self, parent: str, label: str = "step", change: Mapping[str, Op] | None = None, config_edit=None
    ) -> Built:
        """An ARC2 diff against `parent` (a snapshot this run knows) changing only `change`
        (default: the sentinel tensor, scaled by a factor no neighbour in the chain shares)."""
        if not self.knows(parent):
            raise LookupError(f"{parent} is not a snapshot this run built; swap to a full snapshot first")
        before = self.record.overlays[parent]
        identity = self.new_identity(label)
        if change is None:
            step = self.last_serial
            change = {self.sentinel_tensor: ["scale", 1 + ((step % 8) + 1) / 64]}
        after = {**before, **{k: list(v) for k, v in change.items()}}
        local = self.workdir / identity
        local.mkdir(parents=True)
        for file, header in self._headers.items():
            changes = {
                n: (self._bytes(n, before), self._bytes(n, after))
                for n in header.tensors
                if n in change and before.get(n) != after.get(n)
            }
            checksums = {n: self._checksum(n, before) for n in header.tensors if n not in changes}
            arc2.encode_changes(self.base / file, local / file, changes, checksums)
        shutil.copyfile(self.base / INDEX, local / INDEX)
        shutil.copyfile(self.base / SPEC, local / SPEC)
        build.carry_files(self.base, local)
        if config_edit is not None:
            (local / CONFIG).write_text(json.dumps(self._config(config_edit), indent=2) + "\n")
        return self._upload(local, identity, "incremental", build.incremental_signal(identity, parent), after)

    def lora(self, label: str = "lora", seed: int = 0) -> Built:
        identity = self.new_identity(label)
        local = build.make_lora(self.base, self.workdir / identity, base_model=self.model, seed=seed)
        self.adapters[identity] = local
        return self._upload(local, identity, "lora", {"identity": identity}, None)

    def local_copy(self, identity: str) -> Path:
        """The weights of a snapshot this run knows, on this machine (built once, from the base
        and the snapshot's overlay): what a local scorer loads. LookupError for others."""
        self.record.load()
        if identity not in self.record.overlays:
            raise LookupError(f"{identity} is not a snapshot this run built or was given a local copy of")
        overlay = self.record.overlays[identity]
        if not overlay:
            return self.base
        local = self.workdir / "local" / identity
        if not local.is_dir():
            change = {n: _apply(self._base_tensor(n), op) for n, op in overlay.items()}
            build.derive(self.base, local, change)
        return local

    def step(
        self, serving: str | None, label: str = "step", change: Mapping[str, Op] | None = None, config_edit=None
    ) -> Built:
        """The next snapshot to swap to: a sentinel delta on what is served, or a full snapshot
        when the chain has no known start, the ledger was reset, or the engine takes no diffs."""
        self.record.load()
        if self.record.needs_full or not self.knows(serving) or not self.incremental:
            overlay = {**self.record.overlays.get(serving or "", {}), **{k: list(v) for k, v in (change or {}).items()}}
            return self.full(label, overlay, config_edit)
        return self.sentinel(serving, label, change, config_edit)

    def upload_nested(self, local: Path, outer: str, inner: str) -> int:
        """Upload a directory as `<outer>/<inner>` (what a nested identity would name; SNAP-ID-1):
        the bucket itself is only ever given one-segment identities. Removed at the end."""
        wrapper = self.workdir / f"{outer}.nested"
        shutil.copytree(local, wrapper / inner)
        sent = self.bucket.upload(wrapper, self._checked(outer))
        self.uploaded.append(outer)
        return sent

    def copy_in(self, local: Path, label: str, signal: Mapping[str, Any] | None = None) -> Built:
        """Upload a ready-made directory (a broken variant) under a new identity."""
        identity = self.new_identity(label)
        body = {**(signal or {}), "identity": identity}
        return self._upload(local, identity, "given", body, None)

    # ----------------------------------------------------------------------- state shared with the deployment

    def loaded_full(self) -> None:
        self.record.load()
        self.record.needs_full = False
        self.record.save()

    def ledger_reset(self) -> None:
        self.record.load()
        self.record.needs_full = True
        self.record.save()

    def cleanup(self, keep: set[str] = frozenset()) -> tuple[list[str], list[str]]:
        """Remove every snapshot this run uploaded but those in `keep` (what the deployment
        still serves: a deployment may read its snapshot again, and the report names it).
        Returns (removed, kept) identities."""
        removed, kept = [], []
        for identity in dict.fromkeys(self.uploaded):
            if identity in keep:
                kept.append(identity)
            else:
                self.bucket.remove(identity)
                removed.append(identity)
        self.uploaded = []
        shutil.rmtree(self.workdir, ignore_errors=True)
        return removed, kept
