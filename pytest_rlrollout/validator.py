"""The snapshot validator: every SNAP clause as a registered check, run offline or at hot-load time.

Each check carries exactly one clause ID and reports problems of that clause only. A check
whose input could not be read (because another clause already failed) is `inconclusive`
instead of piling up follow-on findings, so one defect yields one clause's finding.
The validator only reads: it opens files read-only and never writes into a snapshot.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pytest_rlrollout import arc2, dtypes, schemas
from pytest_rlrollout import safetensors_io as st
from pytest_rlrollout.catalogue import Level, catalogue
from pytest_rlrollout.snapshot import (
    ADAPTER_CONFIG,
    CONFIG,
    INDEX,
    SPEC,
    TOKENIZER_FILES,
    Kind,
    SnapshotDir,
    UnsafePath,
    group_name,
    layer_of,
)

Status = Literal["pass", "fail", "not-applicable", "inconclusive"]
MAX_FILE_BYTES = 5 * 1024**3  # SNAP-SIZE-1
IGNORED_CONFIG_KEYS = {"transformers_version", "_name_or_path", "quantization_config"}
CHECKSUM_FORMATS = ("alder32", "adler32")  # the documented misspelling, and the Decision's alias
SHOWN = 5  # names quoted per message before "and N more"


@dataclass(frozen=True)
class Finding:
    clause: str
    level: Level
    file: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: " if self.file else ""
        return f"{self.clause} [{self.level}] {where}{self.message}"


@dataclass(frozen=True)
class Outcome:
    status: Status
    reason: str = ""


@dataclass(frozen=True)
class Context:
    """What the validator knows besides the snapshot directory itself.

    Offline, an exporter passes the base and (for a diff) the parent snapshot; at hot-load
    time the deployment also passes the signal body and what its replicas serve.
    """

    base: Path | None = None
    parent: Path | None = None
    signal: Mapping[str, Any] | None = None
    identity: str | None = None  # default: the signal's identity, else the directory name
    parent_identity: str | None = None  # default: the parent directory name
    served: tuple[str | None, ...] | None = None  # current identity of every replica
    ledger_reset: bool = False
    base_model: tuple[str, ...] = ()  # names adapter_config.json may use for the base
    verify_data: bool = True  # decode ARC2 payloads (reads tensor data)
    hf_config: bool = True  # ask transformers, when installed, whether the config loads


@dataclass
class Report:
    snapshot: str
    kind: Kind
    identity: str
    findings: list[Finding] = field(default_factory=list)
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def failures(self, level: Level = "SHOULD") -> list[Finding]:
        """Findings that fail at this level: MUST only, or MUST and SHOULD."""
        keep = {"MUST"} if level == "MUST" else {"MUST", "SHOULD", "MAY"}
        return [f for f in self.findings if f.level in keep]

    def ok(self, level: Level = "SHOULD") -> bool:
        return not self.failures(level)

    def of(self, clause: str) -> list[Finding]:
        return [f for f in self.findings if f.clause == clause]

    def as_dict(self) -> dict[str, Any]:
        return {
            "snapshot": self.snapshot,
            "kind": self.kind,
            "identity": self.identity,
            "valid": self.ok("MUST"),
            "findings": [f.__dict__ for f in self.findings],
            "clauses": {k: {"status": o.status, "reason": o.reason} for k, o in sorted(self.outcomes.items())},
        }

    def text(self) -> str:
        lines = [f"{self.snapshot}: {self.kind} snapshot, identity {self.identity!r}"]
        lines += [f"  {f}" for f in self.findings]
        counts = defaultdict(int)
        for o in self.outcomes.values():
            counts[o.status] += 1
        must = len(self.failures("MUST"))
        verdict = "valid" if not self.findings else ("INVALID" if must else "valid with SHOULD findings")
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        lines.append(f"{verdict}: {len(self.findings)} finding(s); clauses: {summary}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Problem:
    file: str | None
    message: str


class NotApplicable(Exception):
    """The clause does not apply to this snapshot or context."""


class Inconclusive(Exception):
    """The check's input could not be read; another clause already reports why."""


@dataclass(frozen=True)
class Check:
    clause: str
    kinds: frozenset[str]
    fn: Callable[[Subject], Iterable[Problem]]


CHECKS: dict[str, Check] = {}
ALL_KINDS = frozenset({"full", "incremental", "lora"})
WEIGHTS = frozenset({"full", "incremental"})


def check(clause: str, kinds: frozenset[str] = ALL_KINDS):
    def register(fn: Callable[[Subject], Iterable[Problem]]):
        if clause not in catalogue():
            raise KeyError(f"check for unknown clause {clause}")
        if clause in CHECKS:
            raise KeyError(f"two checks for {clause}")
        CHECKS[clause] = Check(clause, kinds, fn)
        return fn

    return register


# --------------------------------------------------------------------------- what a check sees


class Subject:
    """A snapshot directory plus context, read lazily and at most once."""

    def __init__(self, root: str | os.PathLike[str], ctx: Context, kind: Kind | None = None):
        self.dir = SnapshotDir(root)
        self.ctx = ctx
        self.kind: Kind = kind or self._detect_kind()

    def _detect_kind(self) -> Kind:
        if self.dir.is_lora():
            return "lora"
        if self.ctx.parent is not None or self.incremental_metadata is not None:
            return "incremental"
        return "full"

    @cached_property
    def incremental_metadata(self) -> Mapping[str, Any] | None:
        meta = (self.ctx.signal or {}).get("incremental_snapshot_metadata")
        return meta if isinstance(meta, Mapping) and meta else None

    @cached_property
    def identity(self) -> str:
        if self.ctx.identity is not None:
            return self.ctx.identity
        signalled = (self.ctx.signal or {}).get("identity")
        return signalled if isinstance(signalled, str) else self.dir.name

    @cached_property
    def parent(self) -> Subject | None:
        return Subject(self.ctx.parent, Context(hf_config=False), "full") if self.ctx.parent else None

    @cached_property
    def base(self) -> Subject | None:
        return Subject(self.ctx.base, Context(hf_config=False), "full") if self.ctx.base else None

    # -- JSON documents: (value, error). Incremental snapshots inherit what they omit.

    def _json(self, name: str) -> tuple[Any, str | None]:
        if name not in self.dir.listing:
            if self.kind == "incremental":
                if self.parent is not None:
                    return self.parent._json(name)
                return None, "is missing; a diff inherits it from its parent, so pass --parent to check it"
            return None, "is missing"
        try:
            return self.dir.read_json(name), None
        except (ValueError, UnsafePath) as e:
            return None, str(e)

    @cached_property
    def config(self) -> tuple[Any, str | None]:
        return self._json(CONFIG)

    @cached_property
    def index(self) -> tuple[Any, str | None]:
        return self._json(INDEX)

    @cached_property
    def spec(self) -> tuple[Any, str | None]:
        return self._json(SPEC)

    def config_dict(self) -> dict[str, Any]:
        value, _ = self.config
        if not isinstance(value, dict):
            raise Inconclusive("config.json did not load (SNAP-CONFIG-1)")
        return value

    def weight_map(self) -> dict[str, str]:
        value, _ = self.index
        if not (isinstance(value, dict) and isinstance(value.get("weight_map"), dict)):
            raise Inconclusive("model.safetensors.index.json did not load (SNAP-INDEX-1)")
        return {k: v for k, v in value["weight_map"].items() if isinstance(v, str)}

    def tensor_map(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Spec entries as (normalised dtype, shape); malformed entries are left out (SNAP-SPEC-1/2)."""
        value, _ = self.spec
        if not (isinstance(value, dict) and isinstance(value.get("tensor_map"), dict)):
            raise Inconclusive("model.weight.spec.json did not load (SNAP-SPEC-1)")
        out = {}
        for name, e in value["tensor_map"].items():
            if isinstance(e, dict) and isinstance(e.get("dtype"), str) and _int_list(e.get("shape")):
                code = dtypes.normalise(e["dtype"])
                if code is not None:
                    out[name] = (code, tuple(e["shape"]))
        return out

    def quantization_config(self) -> dict[str, Any] | None:
        q = self.config_dict().get("quantization_config")
        return q if isinstance(q, dict) else None

    # -- safetensors files

    @cached_property
    def headers(self) -> dict[str, st.Header]:
        return {n: h for n, h in self._parsed.items() if isinstance(h, st.Header)}

    @cached_property
    def header_errors(self) -> dict[str, str]:
        return {n: h for n, h in self._parsed.items() if isinstance(h, str)}

    @cached_property
    def _parsed(self) -> dict[str, st.Header | str]:
        out: dict[str, st.Header | str] = {}
        for name in self.dir.safetensors_files:
            try:
                path = self.dir.path(name)
            except UnsafePath as e:
                out[name] = f"{e}; not read"
                continue
            if not self.dir.is_regular(name):
                out[name] = "not a regular file; not read"
                continue
            try:
                out[name] = st.read_header(path)
            except st.HeaderError as e:
                out[name] = str(e)
                continue
            except OSError as e:
                out[name] = f"cannot read: {e.strerror or e}"
                continue
            complaint = st.library_opinion(path)
            if complaint is not None:
                out[name] = f"the safetensors library refuses it: {complaint}"
        return out

    @cached_property
    def tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The snapshot's tensors as (dtype, shape): from the files for a full snapshot; from the
        spec (or the parent's tensors) for a diff, whose files hold only U8 payloads."""
        if self.kind == "incremental":
            # Decoding keeps the parent's header, so the target's dtypes and shapes are the
            # parent's; whether the diff's own spec agrees is SNAP-INC-2's question.
            if self.parent is not None:
                return self.parent.tensors
            if SPEC in self.dir.listing:
                return self.tensor_map()
            raise Inconclusive("a diff without model.weight.spec.json and without --parent has no tensor table")
        try:
            loaded = set(self.weight_map().values())
        except Inconclusive:
            loaded = set(self.headers)
        table = {}
        for file, h in self.headers.items():
            if file in loaded:  # tensors of unreferenced files are never loaded (SNAP-INDEX-3a)
                for name, t in h.tensors.items():
                    table[name] = (t.dtype, t.shape)
        if not table:
            with suppress(Inconclusive):
                return self.tensor_map()
        return table

    @cached_property
    def unreadable_tensors(self) -> set[str]:
        """weight_map tensors whose file did not parse: their absence is SNAP-SAFETENSORS-1's finding."""
        try:
            wm = self.weight_map()
        except Inconclusive:
            return set()
        return {t for t, f in wm.items() if f in self.header_errors}


def _int_list(x: object) -> bool:
    return isinstance(x, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in x)


def _names(items: Iterable[str]) -> str:
    items = sorted(items)
    shown = ", ".join(items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


# --------------------------------------------------------------------------- identity and files


@check("SNAP-ID-1")
def _identity(s: Subject) -> Iterator[Problem]:
    why = identity_problem(s.identity)
    if why:
        yield Problem(None, f"identity {s.identity!r} {why}; it must be one path segment")


def identity_problem(identity: object) -> str | None:
    """Why an identity is not one safe path segment, or None (SNAP-ID-1)."""
    if not isinstance(identity, str):
        return "is not a string"
    if not identity:
        return "is empty"
    if identity in (".", ".."):
        return "is a relative path component"
    for ch, label in (("/", "'/'"), ("\\", "'\\'"), ("\x00", "NUL")):
        if ch in identity:
            return f"contains {label}"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in identity):
        return "contains a control character"
    return None


@check("SNAP-SAFETENSORS-1")
def _safetensors(s: Subject) -> Iterator[Problem]:
    for name, error in sorted(s.header_errors.items()):
        yield Problem(name, error)


@check("SNAP-SIZE-1")
def _size(s: Subject) -> Iterator[Problem]:
    for name in s.dir.safetensors_files:
        if s.dir.is_regular(name):
            size = os.stat(s.dir.path(name)).st_size
            if size > MAX_FILE_BYTES:
                yield Problem(name, f"is {size / 1024**3:.2f} GiB; keep files at or under 5 GiB")


# --------------------------------------------------------------------------- config


@check("SNAP-CONFIG-1", WEIGHTS)
def _config_loads(s: Subject) -> Iterator[Problem]:
    value, error = s.config
    if error:
        yield Problem(CONFIG, error)
        return
    if not isinstance(value, dict):
        yield Problem(CONFIG, f"is a JSON {type(value).__name__}, not an object")
        return
    model_type = value.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        yield Problem(CONFIG, "has no model_type, so it cannot load as a Hugging Face config")
        return
    if s.ctx.hf_config:
        complaint = _transformers_complaint(value)
        if complaint:
            yield Problem(CONFIG, complaint)


def _transformers_complaint(config: dict[str, Any]) -> str | None:
    try:
        from transformers import AutoConfig
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return None  # without transformers, a model_type is all that can be asked
    model_type = config["model_type"]
    if model_type not in CONFIG_MAPPING_NAMES:
        return f"model_type {model_type!r} is not known to transformers"
    try:
        AutoConfig.for_model(**config)
    except Exception as e:  # transformers raises many types for bad values
        return f"transformers cannot load it as a {model_type} config: {type(e).__name__}: {e}"
    return None


def config_differences(snapshot: Mapping[str, Any], base: Mapping[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    """SNAP-CONFIG-2 in the documented wording; empty when the configs are equivalent."""
    ignored = IGNORED_CONFIG_KEYS | set(ignore)

    def canon(cfg: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in cfg.items() if k not in ignored}
        if "torch_dtype" in out and "dtype" not in out:
            out["dtype"] = out.pop("torch_dtype")
        out.pop("torch_dtype", None)
        return out

    a, b = canon(snapshot), canon(base)
    if "model_type" in a and "model_type" in b and a["model_type"] != b["model_type"]:
        return [f"Types mismatch: snapshot model_type {a['model_type']!r}, base model_type {b['model_type']!r}"]
    problems = []
    extra_snapshot = sorted(set(a) - set(b))
    extra_base = sorted(set(b) - set(a))
    if extra_snapshot:
        problems.append(f"Extra snapshot model config options: {extra_snapshot}")
    if extra_base:
        problems.append(f"Extra base model config options: {extra_base}")
    for key in sorted(set(a) & set(b)):
        if a[key] != b[key]:
            problems.append(f"Config value mismatch for {key}: snapshot {a[key]!r}, base {b[key]!r}")
    return problems


@check("SNAP-CONFIG-2", WEIGHTS)
def _config_matches_base(s: Subject) -> Iterator[Problem]:
    if s.base is None:
        raise NotApplicable("no base snapshot given")
    mine = s.config_dict()
    try:
        theirs = s.base.config_dict()
    except Inconclusive:
        raise Inconclusive("the base snapshot's config.json did not load") from None
    ignore = ((s.ctx.signal or {}).get("validation") or {}).get("extra_fields_ignore") or ()
    for message in config_differences(mine, theirs, [k for k in ignore if isinstance(k, str)]):
        yield Problem(CONFIG, message)


# --------------------------------------------------------------------------- index and spec


@check("SNAP-INDEX-1", WEIGHTS)
def _index(s: Subject) -> Iterator[Problem]:
    value, error = s.index
    if error:
        yield Problem(INDEX, error)
        return
    for problem in schemas.problems("safetensors-index", value):
        yield Problem(INDEX, problem.message)
    if s.kind == "incremental":
        return  # which diff files must exist is SNAP-INC-1's question
    if isinstance(value, dict) and isinstance(value.get("weight_map"), dict):
        by_file = defaultdict(list)
        for tensor, file in value["weight_map"].items():
            if isinstance(file, str) and schemas.is_plain_shard_name(file):
                by_file[file].append(tensor)
        for file, tensors in sorted(by_file.items()):
            try:
                s.dir.path(file)
            except UnsafePath as e:
                yield Problem(INDEX, f"weight_map names {file}: {e}")
                continue
            if not s.dir.is_regular(file):
                yield Problem(INDEX, f"weight_map puts {len(tensors)} tensor(s) in {file}, which does not exist")


@check("SNAP-INDEX-2", WEIGHTS)
def _one_layer_per_file(s: Subject) -> Iterator[Problem]:
    groups: dict[str, set[int | None]] = defaultdict(set)
    for file, h in s.headers.items():
        for tensor in h.tensors:
            groups[file].add(layer_of(tensor))
    with suppress(Inconclusive):
        for tensor, file in s.weight_map().items():
            if file in s.header_errors:  # what the file holds is unknown; trust the index
                groups[file].add(layer_of(tensor))
    for file, g in sorted(groups.items()):
        if len(g) > 1:
            layers = sorted(x for x in g if x is not None)
            parts = (
                ([f"layers {', '.join(map(str, layers))}"] if len(layers) > 1 else [group_name(layers[0])])
                if layers
                else []
            )
            if None in g:
                parts.append("non-layer tensors")
            yield Problem(
                file, f"mixes {' and '.join(parts)}; each shard must hold one layer (or only non-layer tensors)"
            )


@check("SNAP-INDEX-3", WEIGHTS)
def _index_agrees(s: Subject) -> Iterator[Problem]:
    wm = s.weight_map()
    seen: dict[str, list[str]] = defaultdict(list)
    for file, h in s.headers.items():
        for tensor in h.tensors:
            seen[tensor].append(file)
    by_file = defaultdict(list)
    for tensor, file in wm.items():
        if schemas.is_plain_shard_name(file):  # other names are SNAP-INDEX-1's
            by_file[file].append(tensor)
    for file, tensors in sorted(by_file.items()):
        h = s.headers.get(file)
        if h is None:
            continue  # a missing file is SNAP-INDEX-1's, an unreadable one SNAP-SAFETENSORS-1's
        absent = [t for t in tensors if t not in h.tensors]
        if absent:
            yield Problem(file, f"weight_map puts {_names(absent)} in this file, which does not hold it")
        unlisted = [t for t in h.tensors if t not in wm]
        if unlisted:
            yield Problem(file, f"holds {_names(unlisted)}, missing from weight_map")
    for tensor, files in sorted(seen.items()):
        if len(files) > 1:
            yield Problem(None, f"tensor {tensor} is stored in {len(files)} files: {_names(files)}")


@check("SNAP-INDEX-3a", WEIGHTS)
def _no_stray_files(s: Subject) -> Iterator[Problem]:
    referenced = set(s.weight_map().values())
    for file in s.dir.safetensors_files:
        if file not in referenced:
            yield Problem(file, "is not referenced by weight_map; it would be uploaded but never loaded")


@check("SNAP-SPEC-1", WEIGHTS)
def _spec(s: Subject) -> Iterator[Problem]:
    value, error = s.spec
    if error:
        yield Problem(SPEC, error)
        return
    schema_problems = list(schemas.problems("weight-spec", value))
    for problem in schema_problems:
        yield Problem(SPEC, problem.message)
    if not (isinstance(value, dict) and isinstance(value.get("tensor_map"), dict)):
        return
    with suppress(Inconclusive):
        uncovered = [t for t in s.weight_map() if t not in value["tensor_map"]]
        if uncovered:
            yield Problem(
                SPEC, f"tensor_map does not describe {_names(uncovered)} ({len(uncovered)} weight_map tensors)"
            )


@check("SNAP-SPEC-2", frozenset({"full"}))
def _spec_matches_files(s: Subject) -> Iterator[Problem]:
    value, _ = s.spec
    if not (isinstance(value, dict) and isinstance(value.get("tensor_map"), dict)):
        raise Inconclusive("model.weight.spec.json did not load (SNAP-SPEC-1)")
    in_files = {}
    for file, h in s.headers.items():
        for name, t in h.tensors.items():
            in_files[name] = (file, t)
    orphans = []
    for name, entry in value["tensor_map"].items():
        if not (isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and _int_list(entry.get("shape"))):
            continue  # malformed entries are SNAP-SPEC-1's
        if name not in in_files:
            if name not in s.unreadable_tensors:
                orphans.append(name)
            continue
        file, t = in_files[name]
        code = dtypes.normalise(entry["dtype"])
        if code is None:
            yield Problem(SPEC, f"{name}: dtype {entry['dtype']!r} is not a known dtype name")
        elif code != t.dtype:
            yield Problem(SPEC, f"{name}: spec says {entry['dtype']}, {file} holds {t.dtype}")
        if tuple(entry["shape"]) != t.shape:
            yield Problem(SPEC, f"{name}: spec says shape {entry['shape']}, {file} holds {list(t.shape)}")
    if orphans:
        yield Problem(SPEC, f"tensor_map describes {_names(orphans)}, which no safetensors file holds")


# --------------------------------------------------------------------------- coverage, tokenizer


def _is_scale_of_quantized(name: str, table: Mapping[str, tuple[str, tuple[int, ...]]]) -> bool:
    for suffix in ("_scale_inv", "_scale"):
        if name.endswith(suffix):
            owner = table.get(name[: -len(suffix)])
            if owner is not None and dtypes.BY_CODE[owner[0]].quantized:
                return True
    return False


@check("SNAP-COVER-1", WEIGHTS)
def _covers_base(s: Subject) -> Iterator[Problem]:
    if s.base is None:
        raise NotApplicable("no base snapshot given")
    mine = s.tensors
    try:
        theirs = s.base.tensors
    except Inconclusive:
        raise Inconclusive("the base snapshot's tensors could not be read") from None
    if not theirs:
        raise Inconclusive("the base snapshot has no readable tensors")
    unknown = s.unreadable_tensors
    missing = [t for t in theirs if t not in mine and t not in unknown]
    extra = [t for t in mine if t not in theirs and not _is_scale_of_quantized(t, mine)]
    if missing:
        yield Problem(None, f"{len(missing)} base tensor(s) missing: {_names(missing)}")
    if extra:
        yield Problem(None, f"{len(extra)} tensor(s) not in the base: {_names(extra)}")
    for name in sorted(set(mine) & set(theirs)):
        (dt, shape), (bdt, bshape) = mine[name], theirs[name]
        if shape != bshape:
            hint = (
                " (a tensor-parallel slice?)"
                if len(shape) == len(bshape) and math.prod(shape) < math.prod(bshape)
                else ""
            )
            yield Problem(None, f"{name}: shape {list(shape)}, the base has {list(bshape)}{hint}")
        elif dt != bdt and not dtypes.BY_CODE[dt].quantized:
            yield Problem(None, f"{name}: dtype {dt}, the base has {bdt}")


def _tokenizer_files(s: Subject) -> tuple[SnapshotDir, list[str]]:
    """Where the tokenizer comes from: the snapshot, or its parent when a diff carries none."""
    own = [n for n in TOKENIZER_FILES if s.dir.has(n)] + [n for n in s.dir.listing if n.endswith(".tiktoken")]
    if not own and s.kind == "incremental" and s.parent is not None:
        return _tokenizer_files(s.parent)
    return s.dir, own


@check("SNAP-TOK-1", WEIGHTS)
def _tokenizer(s: Subject) -> Iterator[Problem]:
    _, present = _tokenizer_files(s)
    has_pair = {"tokenizer.json", "tokenizer_config.json"} <= set(present)
    has_model = "tokenizer.model" in present or any(n.endswith(".tiktoken") for n in present)
    if not (has_pair or has_model):
        need = [n for n in ("tokenizer.json", "tokenizer_config.json") if n not in present]
        yield Problem(None, f"tokenizer files missing: {', '.join(need)} (or a tokenizer model file)")


@check("SNAP-TOK-1a", WEIGHTS)
def _tokenizer_as_base(s: Subject) -> Iterator[Problem]:
    if s.base is None:
        raise NotApplicable("no base snapshot given")
    where, present = _tokenizer_files(s)
    base_dir, base_files = _tokenizer_files(s.base)
    for name in base_files:
        if name in present and where.read_bytes(name) != base_dir.read_bytes(name):
            yield Problem(name, "differs from the base model's copy; carry tokenizer files over unchanged")


# --------------------------------------------------------------------------- quantization


@check("SNAP-QUANT-1", WEIGHTS)
def _quantized_has_scales(s: Subject) -> Iterator[Problem]:
    q = s.quantization_config()
    if q is None:
        raise NotApplicable("config.json declares no quantization_config")
    table = s.tensor_map()
    try:
        indexed = set(s.weight_map())
    except Inconclusive:
        indexed = set(table)  # an unreadable index is SNAP-INDEX-1's finding
    quantized = {n: v for n, v in table.items() if dtypes.BY_CODE[v[0]].quantized}
    if not quantized:
        yield Problem(SPEC, "config.json declares quantization_config but no tensor is 8-bit or narrower")
        return
    block = q.get("weight_block_size")
    block_ok = isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)
    for name, (_, shape) in sorted(quantized.items()):
        scale = next((name + sfx for sfx in ("_scale_inv", "_scale") if name + sfx in table), None)
        if scale is None:
            yield Problem(SPEC, f"{name} is quantized but has no {name}_scale_inv (or _scale) tensor")
            continue
        if scale not in indexed:
            yield Problem(INDEX, f"{scale} is in the spec but not in weight_map")
        if block_ok and len(shape) >= 2:
            bm, bn = block
            want = [*shape[:-2], -(-shape[-2] // bm), -(-shape[-1] // bn)]
            got = list(table[scale][1])
            if got != want:
                yield Problem(SPEC, f"{scale} has shape {got}; weight_block_size {block} on {list(shape)} needs {want}")


@check("SNAP-QUANT-2", WEIGHTS)
def _quantized_only_when_declared(s: Subject) -> Iterator[Problem]:
    if s.quantization_config() is not None:
        raise NotApplicable("config.json declares quantization_config")
    quantized = sorted(n for n, (dt, _) in s.tensors.items() if dtypes.BY_CODE[dt].quantized)
    if quantized:
        dts = sorted({s.tensors[n][0] for n in quantized})
        yield Problem(None, f"{_names(quantized)} are {'/'.join(dts)}, but config.json declares no quantization_config")


# --------------------------------------------------------------------------- incremental (ARC2)


def _need_parent(s: Subject) -> Subject:
    if s.parent is None:
        raise NotApplicable("no parent snapshot given (pass --parent)")
    return s.parent


@check("SNAP-INC-1", frozenset({"incremental"}))
def _keeps_parent_index(s: Subject) -> Iterator[Problem]:
    parent = _need_parent(s)
    try:
        pmap = parent.weight_map()
    except Inconclusive:
        raise Inconclusive("the parent's model.safetensors.index.json did not load") from None
    if INDEX in s.dir.listing:
        mine = s.weight_map()
        if mine != pmap:
            moved = [t for t in set(mine) | set(pmap) if mine.get(t) != pmap.get(t)]
            yield Problem(INDEX, f"weight_map differs from the parent's for {_names(moved)}")
    parent_files = set(pmap.values())
    mine_files = set(s.dir.safetensors_files)
    if mine_files != parent_files:
        missing, extra = sorted(parent_files - mine_files), sorted(mine_files - parent_files)
        detail = "; ".join(
            x for x in (missing and f"missing {_names(missing)}", extra and f"extra {_names(extra)}") if x
        )
        yield Problem(None, f"holds {len(mine_files)} diff file(s), the parent {len(parent_files)}: {detail}")
    for file in sorted(mine_files & parent_files):
        mine_h, parent_h = s.headers.get(file), parent.headers.get(file)
        if mine_h and parent_h and set(mine_h.tensors) != set(parent_h.tensors):
            diff = set(mine_h.tensors) ^ set(parent_h.tensors)
            yield Problem(file, f"tensor set differs from the parent's file: {_names(diff)}")


@check("SNAP-INC-2", frozenset({"incremental"}))
def _keeps_parent_dtypes(s: Subject) -> Iterator[Problem]:
    parent = _need_parent(s)
    if SPEC not in s.dir.listing:
        return  # the spec is inherited, so dtypes and shapes are the parent's by construction
    mine, theirs = s.tensor_map(), parent.tensors
    for name in sorted(set(mine) & set(theirs)):
        if mine[name] != theirs[name]:
            (dt, shape), (pdt, pshape) = mine[name], theirs[name]
            yield Problem(SPEC, f"{name}: {dt}{list(shape)}, the parent is {pdt}{list(pshape)}")


@check("SNAP-INC-3", frozenset({"incremental"}))
def _arc2_payloads(s: Subject) -> Iterator[Problem]:
    parent = _need_parent(s)
    fmt = str((s.incremental_metadata or {}).get("compression_format", "arc_v2")).lower()
    if fmt == "arc_v3":
        yield Problem(None, "arc_v3 payloads are pickles and are never decoded from untrusted input")
        return
    if fmt not in arc2.FORMATS:
        raise Inconclusive(f"compression_format {fmt!r} is unknown (SNAP-INC-4)")
    for file, h in sorted(s.headers.items()):
        ph = parent.headers.get(file)
        if ph is None or set(ph.tensors) != set(h.tensors):
            continue  # SNAP-INC-1 reports files that do not pair up
        plan = arc2.FilePlan(file, ph.path, h.path)
        try:
            if s.ctx.verify_data:
                arc2.apply_files([plan], fmt=fmt)
            else:
                arc2.check_structure(ph, h, file)
        except arc2.DeltaError as e:
            yield Problem(file, str(e).removeprefix(f"{file}: "))


@check("SNAP-INC-4", frozenset({"incremental"}))
def _incremental_signal(s: Subject) -> Iterator[Problem]:
    if s.ctx.signal is None:
        raise NotApplicable("no signal given (pass --signal)")
    meta = s.incremental_metadata
    if meta is None:
        yield Problem(
            None, "the signal has no incremental_snapshot_metadata; the diff would be loaded as a full snapshot"
        )
        return
    if str(meta.get("compression_format")).lower() != "arc_v2":
        yield Problem(None, f"compression_format is {meta.get('compression_format')!r}, not 'arc_v2'")
    if meta.get("checksum_format") not in CHECKSUM_FORMATS:
        yield Problem(None, f"checksum_format is {meta.get('checksum_format')!r}, not 'alder32' (sic)")


@check("SNAP-INC-5", frozenset({"incremental"}))
def _previous_is_served(s: Subject) -> Iterator[Problem]:
    meta = s.incremental_metadata
    if meta is None:
        raise NotApplicable("no incremental signal given (pass --signal)")
    previous = meta.get("previous_snapshot_identity")
    if s.ctx.served is not None:
        others = sorted({str(x) for x in s.ctx.served if x != previous})
        if others:
            yield Problem(None, f"previous_snapshot_identity is {previous!r}, but replicas serve {others}")
        return
    parent = s.ctx.parent_identity or (s.ctx.parent.name if s.ctx.parent else None)
    if parent is None:
        raise NotApplicable("neither the served identities nor a parent are known")
    if previous != parent:
        yield Problem(None, f"previous_snapshot_identity is {previous!r}, the parent snapshot is {parent!r}")


@check("SNAP-INC-6", frozenset({"lora"}))
def _no_incremental_lora(s: Subject) -> Iterator[Problem]:
    if s.ctx.signal is None:
        raise NotApplicable("no signal given")
    if "incremental_snapshot_metadata" in s.ctx.signal:
        yield Problem(ADAPTER_CONFIG, "a LoRA adapter is always loaded in full; drop incremental_snapshot_metadata")


@check("SNAP-INC-7", WEIGHTS)
def _full_after_reset(s: Subject) -> Iterator[Problem]:
    if not s.ctx.ledger_reset:
        raise NotApplicable("the ledger was not reset")
    if s.incremental_metadata is not None:
        yield Problem(None, "the ledger was reset, so the next snapshot must be full; incremental metadata is refused")


# --------------------------------------------------------------------------- LoRA


@check("SNAP-LORA-1")
def _lora_kind(s: Subject) -> Iterator[Problem]:
    if s.kind == "lora":
        stray = [
            n
            for n in s.dir.listing
            if n == INDEX or (n.endswith(".safetensors") and n not in s.dir.adapter_weight_files)
        ]
        if stray:
            yield Problem(ADAPTER_CONFIG, f"makes this a LoRA adapter, so {_names(stray)} would be ignored")
    elif s.dir.adapter_weight_files:
        yield Problem(
            None,
            f"holds {_names(s.dir.adapter_weight_files)} but no adapter_config.json, so it would load as a full snapshot",
        )


@check("SNAP-LORA-2", frozenset({"lora"}))
def _lora_weights(s: Subject) -> Iterator[Problem]:
    if not s.dir.adapter_weight_files:
        yield Problem(
            None,
            "no adapter weights: expected adapter_model.safetensors, adapter_model-*.safetensors or adapter_model.bin",
        )


def _adapter_target(key: str) -> tuple[str, str] | None:
    """('model.layers.0.self_attn.q_proj', 'A') for a PEFT key, or None for other keys."""
    name = key.removeprefix("base_model.model.")
    for part in ("A", "B"):
        for marker in (f".lora_{part}.weight", f".lora_{part}.default.weight"):
            if name.endswith(marker):
                return name[: -len(marker)], part
    return None


@check("SNAP-LORA-3", frozenset({"lora"}))
def _lora_fits_base(s: Subject) -> Iterator[Problem]:
    try:
        cfg = s.dir.read_json(ADAPTER_CONFIG)
    except (ValueError, UnsafePath) as e:
        yield Problem(ADAPTER_CONFIG, str(e))
        return
    problems = list(schemas.problems("adapter-config", cfg))
    for problem in problems:
        yield Problem(ADAPTER_CONFIG, problem.message)
    if not isinstance(cfg, dict):
        return
    name = cfg.get("base_model_name_or_path")
    if isinstance(name, str) and name and s.ctx.base_model and name not in s.ctx.base_model:
        yield Problem(
            ADAPTER_CONFIG, f"base_model_name_or_path is {name!r}; the deployment serves {_names(s.ctx.base_model)}"
        )
    if s.base is None:
        return  # module and shape checks need the base
    try:
        base = s.base.tensors
    except Inconclusive:
        raise Inconclusive("the base snapshot's tensors could not be read") from None
    targets = cfg.get("target_modules")
    if isinstance(targets, list):
        absent = [
            t
            for t in targets
            if isinstance(t, str) and not any(f".{t}.weight" in b or b.startswith(f"{t}.") for b in base)
        ]
        if absent:
            yield Problem(ADAPTER_CONFIG, f"target_modules {absent} match no module of the base model")
    r = cfg.get("r") if not cfg.get("rank_pattern") else None
    for file in s.dir.adapter_weight_files:
        h = s.headers.get(file)
        if h is None:
            continue  # unreadable safetensors are SNAP-SAFETENSORS-1's; .bin is listed, never unpickled
        for key, t in sorted(h.tensors.items()):
            target = _adapter_target(key)
            if target is None:
                continue
            module, part = target
            if module.endswith(".experts"):
                continue  # fused-expert ParamWrapper adapters have no per-module base tensor
            base_t = base.get(f"{module}.weight")
            if base_t is None:
                yield Problem(file, f"{key}: the base has no {module}.weight")
                continue
            out_f, in_f = base_t[1][0], base_t[1][-1]
            rank = r if isinstance(r, int) else (t.shape[0] if part == "A" else t.shape[-1])
            want = (rank, in_f) if part == "A" else (out_f, rank)
            if t.shape != want:
                yield Problem(
                    file, f"{key}: shape {list(t.shape)}, rank {rank} on {module} {list(base_t[1])} needs {list(want)}"
                )


# --------------------------------------------------------------------------- entry point


def signal_findings(signal: Mapping[str, Any]) -> list[Finding]:
    """Findings on a hot-load request body, from its JSON Schema (the identity is SNAP-ID-1's check)."""
    cat = catalogue()
    out = []
    for problem in schemas.problems("hot-load-request", signal):
        if problem.path[:1] == ("identity",):
            continue  # the identity is judged by the SNAP-ID-1 check itself
        out.append(Finding(problem.clause, cat[problem.clause].level, "signal", problem.message))
    return out


def validate(
    snapshot: str | os.PathLike[str],
    *,
    base: str | os.PathLike[str] | None = None,
    parent: str | os.PathLike[str] | None = None,
    signal: Mapping[str, Any] | None = None,
    context: Context | None = None,
    **context_fields: Any,
) -> Report:
    """Validate a snapshot directory against every SNAP clause; reads, never writes.

    `base` enables the comparisons against the base model (SNAP-CONFIG-2, SNAP-COVER-1,
    SNAP-TOK-1a, SNAP-LORA-3); `parent` marks the directory as an ARC2 diff of that
    snapshot; `signal` is the hot-load request body that would announce it.
    """
    if context is not None and (base or parent or signal is not None or context_fields):
        raise TypeError("pass either context= or the individual fields, not both")
    ctx = context or Context(
        base=Path(base) if base else None,
        parent=Path(parent) if parent else None,
        signal=signal,
        **context_fields,
    )
    subject = Subject(snapshot, ctx)
    cat = catalogue()
    report = Report(str(snapshot), subject.kind, subject.identity)
    looks_like_adapter = (
        subject.kind != "lora" and subject.dir.adapter_weight_files and CONFIG not in subject.dir.listing
    )
    for clause, chk in CHECKS.items():
        if looks_like_adapter and clause != "SNAP-LORA-1":
            report.outcomes[clause] = Outcome("inconclusive", "the directory looks like a LoRA adapter (SNAP-LORA-1)")
            continue
        if subject.kind not in chk.kinds:
            report.outcomes[clause] = Outcome("not-applicable", f"does not apply to {subject.kind} snapshots")
            continue
        try:
            problems = list(chk.fn(subject))
        except NotApplicable as e:
            report.outcomes[clause] = Outcome("not-applicable", str(e))
            continue
        except Inconclusive as e:
            report.outcomes[clause] = Outcome("inconclusive", str(e))
            continue
        level = cat[clause].level
        report.findings += [Finding(clause, level, p.file, p.message) for p in problems]
        report.outcomes[clause] = Outcome("fail" if problems else "pass")
    if ctx.signal is not None:
        extra = signal_findings(ctx.signal)
        report.findings += extra
        for f in extra:
            report.outcomes[f.clause] = Outcome("fail")
    return report


def load_signal(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A hot-load request body from a JSON file (for `--signal`)."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a hot-load signal is a JSON object")
    return doc
