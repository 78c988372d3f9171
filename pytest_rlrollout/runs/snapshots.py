"""The snapshots a conformance run swaps into a deployment (the `rl_snapshot_factory` fixture).

Every snapshot is the base (a local copy, `--rl-base-snapshot`) with a few tensors changed by a
named operation, always relative to the base (a test's change never carries an earlier test's),
so any worker can rebuild any snapshot's bytes from the base and a small record.

What a swap costs follows what it changes. An engine that takes ARC2 diffs swaps along a chain
of **sentinel deltas** against the snapshot being served: zero frames except for the tensors that
differ, a few kilobytes per shard. A full snapshot of the base is a copy inside the bucket (the
store copies it; a bucket on this machine hard-links it) whenever the bucket holds the base
under its name. A full snapshot with changes, what an engine that reloads a directory takes, is
written as the shards that hold a changed tensor; every other file is linked or copied from the
base. A whole upload happens only when the bucket does not hold the base.

Identities are unique per run (`rlt-<run>-<n>-<label>`). A snapshot is removed as soon as nothing
serves it and nothing served descends from it; the rest at the end. The record of what each
identity holds lives in a JSON file shared by xdist workers; it is only written under the
deployment's exclusive lock.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import zlib
from collections.abc import Callable, Mapping, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from pytest_rlrollout.remote.bucket import Bucket, Transfer
from pytest_rlrollout.snapshot import arc2, build
from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot.layout import CONFIG, INDEX, SPEC

Op = list  # ["scale", factor] | ["negate"]: applied to the base tensor
Overlay = dict[str, Op]  # tensor name -> op; tensors not listed equal the base

IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # what the suite names its snapshots
# rlt-<run>-<test>-<n>-<label>: a run id (8 hex), a test's key (6 hex), its serial, a label
RUN_IDENTITY = re.compile(r"rlt-(?P<run>[0-9a-f]{8})-[0-9a-f]{6}-[0-9]{2,}-[A-Za-z0-9._-]+")
ROUTER = re.compile(r"\.(mlp|block_sparse_moe)\.gate\.weight$")
LAYER = re.compile(r"layers\.(\d+)\.")
EXPERT = re.compile(r"layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.\d+\.")
LAYER_NORM = re.compile(r"layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight$")
FINAL_NORM = re.compile(r"^(model\.)?norm\.weight$")
FLOATS = ("BF16", "F16", "F32")
CHECKSUM_BLOCK = 8 << 20
PROBE_KEY = "rlrollout_probe"  # an extra config key no model has


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
    linked_bytes: int = 0  # hard-linked into a bucket on this machine (nothing written)
    written_bytes: int = 0  # written on this machine to build it

    def note(self, full_bytes: int) -> dict[str, Any]:
        """What building it cost, for the report."""
        return {
            "identity": self.identity,
            "kind": self.kind,
            "uploaded": self.uploaded_bytes,
            "copied": self.copied_bytes,
            "linked": self.linked_bytes,
            "written": self.written_bytes,
            "of_full": round(self.uploaded_bytes / max(full_bytes, 1), 6),
        }


@dataclass
class Record:
    """What each identity holds; shared by the workers of one run through a JSON file."""

    path: Path
    overlays: dict[str, Overlay] = field(default_factory=dict)
    needs_full: bool = False
    parents: dict[str, str] = field(default_factory=dict)  # an ARC2 diff's identity -> its parent's

    def load(self) -> Record:
        if self.path.is_file():
            doc = json.loads(self.path.read_text())
            self.overlays, self.needs_full, self.parents = doc["overlays"], doc["needs_full"], doc.get("parents", {})
        return self

    def save(self) -> None:
        doc = {"overlays": self.overlays, "needs_full": self.needs_full, "parents": self.parents}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)


def normal(overlay: Mapping[str, Op]) -> Overlay:
    """`overlay` without the operations that change nothing (a scale by 1)."""
    return {n: list(op) for n, op in overlay.items() if list(op) != ["scale", 1.0]}


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
        layout: bool = False,
    ):
        self.base, self.bucket, self.workdir, self.run_id, self.model = Path(base), bucket, Path(workdir), run_id, model
        self.incremental = incremental  # the engine loads ARC2 diffs: swaps go along sentinel deltas
        # The engine checks the hot-load layout (index, spec, one layer per shard) and the base
        # is a checkpoint as `save_pretrained` writes it: laid out once, here, under its name
        self.relaid = build.layout_problem(self.base) if layout else None
        if self.relaid is not None:
            self.base = build.export_checkpoint(self.base, self.workdir / "base" / self.base.name)
        self.record = Record(record_path).load()
        self.uploaded: list[str] = []  # by this process: each worker removes its own
        self.removed: list[str] = []  # of those, already removed (nothing serves or descends from them)
        self._built_by: dict[str, str] = {}  # identity -> the test that built it
        self._signalled: set[str] = set()
        self._serial: dict[str, int] = {}  # test key -> the snapshots built under it so far
        self.test_key, self.last_serial = "000000", 0
        if not self.record.overlays:
            self.record.overlays[self.base.name] = {}  # the base copy is named after the identity it holds
            self.record.save()
        self.index = {"weight_map": build.weight_map(self.base)}
        self._headers = {f: st.read_header(self.base / f) for f in sorted(set(self.index["weight_map"].values()))}
        self._checksums: dict[str, str] = {}
        self.notes: list[dict[str, Any]] = []  # what the current test built (the report states it)
        self.adapters: dict[str, Path] = {}  # LoRA identity -> its local directory (built by this process)
        self.full_bytes = sum((self.base / f).stat().st_size for f in self._headers)
        # every file of a snapshot derived from the base: weights, index, spec, config, tokenizer
        self.files = [
            *self._headers,
            *(n for n in (INDEX, SPEC) if (self.base / n).is_file()),
            *build.carried_names(self.base),
        ]
        self._base_held: bool | None = None
        self.pricing = False  # a plan's twin (`dry`): whole shards are sized, not written

    def dry(self, bucket: Bucket, workdir: Path) -> SnapshotFactory:
        """A twin that builds in `workdir` and puts on `bucket` (a `DryBucket`: a plan's), with a
        record of its own holding what this one knows; what was computed of the base (its
        headers, its checksums) is shared, so a plan reads the base once with the run."""
        twin = copy.copy(self)
        twin.bucket, twin.workdir = bucket, Path(workdir)
        twin.record = Record(twin.workdir / "record.json")
        twin.restore(self.state())
        twin.uploaded, twin.removed, twin.notes, twin.adapters = [], [], [], {}
        twin._built_by, twin._signalled, twin._serial = {}, set(), {}
        twin.pricing = True
        return twin

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
    def routers_by_layer(self) -> dict[int, str]:
        """Every MoE layer's router, by layer number."""
        return {int(m.group(1)): n for n in self.router_tensors if (m := LAYER.search(n))}

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
        """A change no fingerprint can miss: the final norm doubled, or back where `serving`
        doubled it (every logit doubles, or halves: greedy tokens stay); `kv` (or no final norm):
        a layer's input norm doubled, which changes the KV of every later position, one `serving`
        holds at its base value, so a diff of it XORs base bytes."""
        overlay = self.record.overlays.get(serving or "", {})
        names = list(self.index["weight_map"])
        final = [n for n in names if FINAL_NORM.search(n) and n != self.sentinel_tensor]
        if final and not kv:
            return {final[0]: ["scale", 1.0 if overlay.get(final[0]) == ["scale", 2.0] else 2.0]}
        numbered = [(n, int(m.group(1))) for n in names if (m := LAYER_NORM.search(n)) and "input" in n]
        layers = [n for n, _ in sorted(numbered, key=lambda pair: pair[1])]
        finals = [] if kv else [n for n in names if FINAL_NORM.search(n)]
        candidates = [n for n in [*finals, *layers] if n != self.sentinel_tensor]
        if not candidates:
            raise LookupError("no norm vector (model.norm.weight, layers.N.input_layernorm.weight) to change")
        for name in candidates:
            if overlay.get(name, ["scale", 1.0]) == ["scale", 1.0]:
                return {name: ["scale", 2.0]}
        return {candidates[0]: ["scale", 1.0]}  # every one is changed: undo the first

    def router_change(self, serving: str | None) -> dict[str, Op]:
        """The routers of the first and the last MoE layer negated (top-k becomes bottom-k), or
        turned back where `serving` negated them: what a swap must carry to every layer's
        routing shows at both ends, and a directory snapshot changes two shards, not every one."""
        by_layer = self.routers_by_layer
        if not by_layer:
            raise LookupError("no router tensors (…mlp.gate.weight) in the base snapshot")
        current = self.record.overlays.get(serving or "", {})
        routers = [by_layer[n] for n in sorted({min(by_layer), max(by_layer)})]
        return {n: ["scale", 1.0] if current.get(n) == ["negate"] else ["negate"] for n in routers}

    def _away_experts(self) -> dict[str, Op]:
        """Expert tensors scaled, of every MoE layer where swaps are diffs (a few kilobytes each),
        of the first where a swap is a whole snapshot (one shard written, not every one)."""
        experts = self.expert_tensors if self.incremental else self.expert_tensors[:1]
        return {n: ["scale", 1.5] for n in experts}

    def change(self, name: str | None, serving: str | None) -> dict[str, Op] | None:
        """A change by its name (what a test's planned loads name): None is the factory's own
        (a sentinel's scale of the sentinel tensor); `away-kv`: a layer's input norm and experts;
        `moved`: the final norm toggled (greedy tokens stay) and, where swaps are diffs, experts."""
        if name is None:
            return None
        made = {
            "visible": lambda: self.visible_change(serving),
            "visible-kv": lambda: self.visible_change(serving, kv=True),
            "routers": lambda: self.router_change(serving),
            "none": dict,
            "away-kv": lambda: {**self.visible_change(serving, kv=True), **self._away_experts()},
            "moved": lambda: {**self.visible_change(serving), **(self._away_experts() if self.incremental else {})},
        }
        if name not in made:
            raise ValueError(f"unknown change {name!r} (known: {', '.join(made)})")
        return made[name]()

    # ----------------------------------------------------------------------- config edits

    def numeric_key(self) -> str:
        """A config value whose change is harmless to serve (for config-mismatch snapshots);
        LookupError when the config has none."""
        config = json.loads((self.base / CONFIG).read_text())
        for key in ("rms_norm_eps", "layer_norm_eps", "initializer_range"):
            if isinstance(config.get(key), float):
                return key
        floats = [k for k, v in sorted(config.items()) if isinstance(v, float)]
        if not floats:
            raise LookupError("the base's config.json has no float value to change")
        return floats[0]

    def config_edit(self, name: str | None) -> Callable[[dict], object] | None:
        """A config edit by its name: `scaled` (a float value ×10: a mismatch), `extra` (a key
        no model has) or `extra-scaled` (both)."""
        return None if name is None else self._config_edit(name)

    def _config_edit(self, name: str) -> Callable[[dict], object]:
        if name == "scaled":
            key = self.numeric_key()
            return lambda c: c.update({key: c[key] * 10})
        if name == "extra":
            return lambda c: c.update({PROBE_KEY: 1})
        if name == "extra-scaled":
            extra, scaled = self._config_edit("extra"), self._config_edit("scaled")
            return lambda c: (extra(c), scaled(c))
        raise ValueError(f"unknown config edit {name!r} (known: scaled, extra, extra-scaled)")

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
            self._checksum_base()
        return self._checksums[name]

    def _checksum_base(self) -> None:
        """The Adler-32 of every base tensor, in one sequential read of each shard, shards in
        parallel (zlib lets go of the GIL): the one pass over the whole base a run makes."""

        def shard(file: str) -> dict[str, str]:
            out, buf = {}, bytearray(CHECKSUM_BLOCK)
            with open(self.base / file, "rb", buffering=0) as f:
                for name, info in sorted(self._headers[file].tensors.items(), key=lambda kv: kv[1].start):
                    f.seek(info.start)
                    adler, left = zlib.adler32(b""), info.nbytes
                    while left:
                        n = f.readinto(memoryview(buf)[: min(len(buf), left)])
                        if not n:
                            raise EOFError(f"{file} ends inside tensor {name}")
                        adler, left = zlib.adler32(memoryview(buf)[:n], adler), left - n
                    out[name] = str(adler)
            return out

        with ThreadPoolExecutor(arc2.default_threads(), thread_name_prefix="checksum") as pool:
            for sums in pool.map(shard, self._headers):
                self._checksums.update(sums)

    # ----------------------------------------------------------------------- building

    def know(self, identity: str, overlay: Overlay) -> None:
        """Record what a snapshot the run did not build holds (the deployment served it at the start)."""
        self.record.load()
        if identity not in self.record.overlays:
            self.record.overlays[identity] = overlay
            self.record.save()

    def knows(self, identity: str | None) -> TypeGuard[str]:
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
        return {"overlays": self.record.overlays, "needs_full": self.record.needs_full, "parents": self.record.parents}

    def restore(self, state: dict) -> None:
        self.record.load()
        self.record.overlays.update(state["overlays"])
        self.record.needs_full = state["needs_full"]
        self.record.parents.update(state.get("parents", {}))
        self.record.save()

    def _remember(self, identity: str, overlay: Overlay | None, parent: str | None = None) -> None:
        self.record.load()
        if overlay is not None:
            self.record.overlays[identity] = overlay
        if parent is not None:
            self.record.parents[identity] = parent
        self.record.save()
        self.uploaded.append(identity)
        self._built_by[identity] = self.test_key

    def _upload(self, local: Path, identity: str, kind: str, signal: dict, overlay: Overlay | None) -> Built:
        sent = self.bucket.upload(local, identity)
        self._remember(identity, overlay)
        return self._noted(Built(identity, kind, signal, local, sent, overlay))

    def _put(
        self, local: Path, identity: str, kind: str, signal: dict, overlay: Overlay, parent: str | None = None
    ) -> Built:
        """Put a snapshot built in `local` (the files that differ from the base) and the base's
        other files in the bucket; the local build is removed once it is there."""
        written = {f.name: f for f in sorted(local.iterdir())}
        same = {name: self.base / name for name in self.files if name not in written}
        try:
            done = self.bucket.put(identity, written, same=same, source=self.base.name if self.base_held else None)
        finally:
            size = sum(f.stat().st_size for f in written.values())
            shutil.rmtree(local, ignore_errors=True)
        self._remember(identity, overlay, parent)
        return self._noted(Built(identity, kind, signal, local, done.sent, overlay, done.copied, done.linked, size))

    def _noted(self, built: Built) -> Built:
        self.notes.append(built.note(self.full_bytes))
        return built

    @property
    def base_held(self) -> bool:
        """Whether the bucket holds the base under its name: every file of it, of the same size,
        and the same index (asked once). A copy laid out otherwise is not the base: a file of
        the same name there may hold other tensors."""
        if self._base_held is None:
            self._base_held = self.bucket.exists(self.base.name) and self._same_as_held()
        return self._base_held

    def _same_as_held(self) -> bool:
        for name in self.files:
            try:
                size = self.bucket.size(self.base.name, name)
            except FileNotFoundError:
                return False
            if size != (self.base / name).stat().st_size:
                return False
        return INDEX not in self.files or json.loads(self.bucket.read_text(self.base.name, INDEX)) == json.loads(
            (self.base / INDEX).read_text()
        )

    def base_copy(self, label: str = "full") -> Built:
        """A full snapshot of the base weights under a new identity: copied inside the bucket when
        it holds the base under its name (nothing uploaded), else uploaded whole."""
        if not self.base_held:
            return self.full(label)
        identity = self.new_identity(label)
        done: Transfer = self.bucket.copy(self.base.name, identity)
        self._remember(identity, {})
        return self._noted(Built(identity, "full", {"identity": identity}, self.base, 0, {}, done.copied, done.linked))

    def _config(self, edit: Callable[[dict], object] | None) -> dict | None:
        if edit is None:
            return None
        cfg = json.loads((self.base / CONFIG).read_text())
        edit(cfg)
        return cfg

    def full(self, label: str = "full", overlay: Overlay | None = None, config_edit=None) -> Built:
        """A full snapshot: the base with `overlay` applied. Only the shards holding a changed
        tensor (and an edited config) are written and sent; every other file is the base's,
        copied inside the bucket or linked where it can be (else uploaded)."""
        overlay = normal(overlay or {})
        identity = self.new_identity(label)
        local = self.workdir / identity
        local.mkdir(parents=True)
        change = {} if self.pricing else {n: _apply(self._base_tensor(n), op) for n, op in overlay.items()}
        for file in sorted({self.index["weight_map"][n] for n in overlay}):
            if self.pricing:  # a plan's: a sparse file of the size the shard would have, nothing written
                with (local / file).open("wb") as f:
                    f.truncate(build.derived_size(self.base / file))
            else:
                build.derive_file(self.base / file, local / file, change)
        config = self._config(config_edit)
        if config is not None:
            (local / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        return self._put(local, identity, "full", {"identity": identity}, overlay)

    def sentinel(
        self, parent: str, label: str = "step", change: Mapping[str, Op] | None = None, config_edit=None
    ) -> Built:
        """An ARC2 diff against `parent` (a snapshot this run knows) to the base with `change`
        (default: the sentinel tensor, scaled by a factor no neighbour in the chain shares): the
        tensors `parent` changed and `change` does not are turned back to the base's."""
        if not self.knows(parent):
            raise LookupError(f"{parent} is not a snapshot this run built; swap to a full snapshot first")
        before = self.record.overlays[parent]
        identity = self.new_identity(label)
        if change is None:
            step = self.last_serial
            change = {self.sentinel_tensor: ["scale", 1 + ((step % 8) + 1) / 64]}
        after = normal(change)
        differ = {n for n in {*before, *after} if before.get(n) != after.get(n)}
        local = self.workdir / identity
        local.mkdir(parents=True)
        for file, header in self._headers.items():
            changes = {n: (self._bytes(n, before), self._bytes(n, after)) for n in header.tensors if n in differ}
            checksums = {n: self._checksum(n, before) for n in header.tensors if n not in changes}
            arc2.encode_changes(self.base / file, local / file, changes, checksums)
        if config_edit is not None:
            (local / CONFIG).write_text(json.dumps(self._config(config_edit), indent=2) + "\n")
        signal = build.incremental_signal(identity, parent)
        return self._put(local, identity, "incremental", signal, after, parent)

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
            return self.full(label, dict(change or {}), config_edit)
        return self.sentinel(serving, label, change, config_edit)

    def copy_nested(self, identity: str, outer: str, inner: str) -> Transfer:
        """Copy snapshot `identity` inside the bucket to `<outer>/<inner>` (what a nested
        identity would name; SNAP-ID-1): the bucket itself is only ever given one-segment
        identities. Removed at the end."""
        done = self.bucket.copy(identity, self._checked(outer), inner=inner)
        self.uploaded.append(outer)
        self._built_by[outer] = self.test_key
        self.notes.append(
            {
                "identity": outer,
                "kind": "nested",
                "uploaded": 0,
                "copied": done.copied,
                "linked": done.linked,
                "written": 0,
                "of_full": 0.0,
            }
        )
        return done

    def copy_in(self, local: Path, label: str, signal: Mapping[str, Any] | None = None) -> Built:
        """Put a ready-made directory (a broken variant) in the bucket under a new identity. Its
        files that are the base's own (hard links to them: a variant of `ReferenceCases.of`
        links every file it leaves alone) are copied inside the bucket or linked, as a step's
        are; only the rest is sent."""
        identity = self.new_identity(label)
        body = {**(signal or {}), "identity": identity}
        files = {f.relative_to(local).as_posix(): f for f in sorted(p for p in local.rglob("*") if p.is_file())}
        same = {n: f for n, f in files.items() if (self.base / n).is_file() and os.path.samefile(f, self.base / n)}
        own = {n: f for n, f in files.items() if n not in same}
        done = self.bucket.put(identity, own, same=same, source=self.base.name if self.base_held else None)
        self._remember(identity, None)
        written = sum(f.stat().st_size for f in own.values())
        return self._noted(Built(identity, "given", body, local, done.sent, None, done.copied, done.linked, written))

    # ----------------------------------------------------------------------- state shared with the deployment

    def loaded_full(self) -> None:
        self.record.load()
        self.record.needs_full = False
        self.record.save()

    def ledger_reset(self) -> None:
        self.record.load()
        self.record.needs_full = True
        self.record.save()

    def signalled(self, identity: str) -> None:
        """`identity` was signalled: once nothing serves it, nothing will again."""
        self._signalled.add(identity)

    def _needed(self, served: set[str]) -> set[str]:
        """What is served and every snapshot a served one descends from (a replica that loads
        an ARC2 diff again needs its parents)."""
        self.record.load()
        needed, todo = set(), list(served)
        while todo:
            identity = todo.pop()
            if identity not in needed:
                needed.add(identity)
                if identity in self.record.parents:
                    todo.append(self.record.parents[identity])
        return needed

    def retire(self, served: set[str]) -> list[str]:
        """Remove what this process uploaded that is done with: nothing in `served` (what every
        replica serves now) is it or descends from it, and it was signalled or built by an earlier
        test (a test's snapshots wait for its signals). Returns the identities removed."""
        needed = self._needed(served)
        done = [
            i for i in dict.fromkeys(self.uploaded) if i in self._signalled or self._built_by.get(i) != self.test_key
        ]
        return self._remove([i for i in done if i not in needed])

    def _remove(self, gone: list[str]) -> list[str]:
        """Remove `gone` from the bucket and from what is left to remove at the end."""
        for identity in gone:
            self.bucket.remove(identity)
        self.uploaded = [i for i in self.uploaded if i not in gone]
        self.removed += gone
        return gone

    def cleanup(self, keep: Set[str] = frozenset()) -> tuple[list[str], list[str]]:
        """Remove every snapshot this run uploaded but those in `keep` (what the deployment
        still serves: a deployment may read its snapshot again, and the report names it) and
        those a kept one descends from. Returns (removed, kept) identities, the removed including
        those retired during the run."""
        needed = self._needed(set(keep))
        kept = [i for i in dict.fromkeys(self.uploaded) if i in needed]
        self._remove([i for i in dict.fromkeys(self.uploaded) if i not in needed])
        shutil.rmtree(self.workdir, ignore_errors=True)
        return list(self.removed), kept


def left_behind(bucket: Bucket, run: str | None = None) -> list[str]:
    """The snapshots in `bucket` a conformance run made (of run `run` only, when given): what
    a run that did not end left there. Nothing named otherwise is ever among them."""
    return [i for i in bucket.identities() if (m := RUN_IDENTITY.fullmatch(i)) and run in (None, m["run"])]
