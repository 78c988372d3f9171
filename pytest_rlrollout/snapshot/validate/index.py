"""Checks on the index and the spec: SNAP-INDEX-1/2/3(a), SNAP-SPEC-1/2."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import suppress

from pytest_rlrollout.snapshot import dtypes, untrusted
from pytest_rlrollout.snapshot import safetensors_io as st
from pytest_rlrollout.snapshot.layout import INDEX, SPEC, UnsafePath, group_name, layer_of
from pytest_rlrollout.snapshot.validate.core import (
    WEIGHTS,
    Inconclusive,
    Problem,
    Subject,
    check,
    names,
    schema_problems,
)


@check("SNAP-INDEX-1", WEIGHTS)
def _index(s: Subject) -> Iterator[Problem]:
    value, error = s.index
    if error:
        yield Problem(INDEX, error)
        return
    for problem in schema_problems("safetensors-index", value):
        yield Problem(INDEX, problem.message)
    if s.kind == "incremental":
        return  # which diff files must exist is SNAP-INC-1's question
    if isinstance(value, dict) and isinstance(value.get("weight_map"), dict):
        for file, tensors in sorted(s.shards.items()):
            try:
                s.dir.path(file)
            except UnsafePath as e:
                yield Problem(INDEX, f"weight_map names {untrusted.brief_text(file, 200)}: {e}")
                continue
            why = s.dir.unreadable(file)
            if why == "is missing":
                yield Problem(INDEX, f"weight_map puts {len(tensors)} tensor(s) in {file}, which does not exist")
            elif why is not None and file not in s.dir.listing:  # a listed file is SNAP-SAFETENSORS-1's
                yield Problem(INDEX, f"weight_map puts {len(tensors)} tensor(s) in {file}, which {why}")


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
    # a missing file is SNAP-INDEX-1's, an unreadable one SNAP-SAFETENSORS-1's: only files read are compared
    for file in sorted(s.shards.keys() & s.headers.keys()):
        tensors, h = s.shards[file], s.headers[file]
        absent = [t for t in tensors if t not in h.tensors]
        if absent:
            yield Problem(file, f"weight_map puts {names(absent)} in this file, which does not hold it")
        unlisted = [t for t in h.tensors if t not in wm]
        if unlisted:
            yield Problem(file, f"holds {names(unlisted)}, missing from weight_map")
    for tensor, files in sorted(seen.items()):
        if len(files) > 1:
            yield Problem(None, f"tensor {tensor} is stored in {len(files)} files: {names(files)}")


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
    for problem in schema_problems("weight-spec", value):
        yield Problem(SPEC, problem.message)
    if not (isinstance(value, dict) and isinstance(value.get("tensor_map"), dict)):
        return
    with suppress(Inconclusive):
        uncovered = [t for t in s.weight_map() if t not in value["tensor_map"]]
        if uncovered:
            yield Problem(
                SPEC, f"tensor_map does not describe {names(uncovered)} ({len(uncovered)} weight_map tensors)"
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
        if not (isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and st.uint_list(entry.get("shape"))):
            continue  # malformed entries are SNAP-SPEC-1's
        if name not in in_files:
            if name not in s.unreadable_tensors:
                orphans.append(name)
            continue
        file, t = in_files[name]
        code = dtypes.normalise(entry["dtype"])
        dtype = untrusted.shown(entry["dtype"], 100)
        if code is None:
            yield Problem(SPEC, f"{name}: dtype {dtype} is not a known dtype name")
        elif code != t.dtype:
            yield Problem(SPEC, f"{name}: spec says {entry['dtype']}, {file} holds {t.dtype}")
        if tuple(entry["shape"]) != t.shape:
            yield Problem(
                SPEC, f"{name}: spec says shape {untrusted.shown(entry['shape'])}, {file} holds {list(t.shape)}"
            )
    if orphans:
        yield Problem(SPEC, f"tensor_map describes {names(orphans)}, which no safetensors file holds")
