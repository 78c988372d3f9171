"""Checks on ARC2 incremental snapshots and their signals: SNAP-INC-1 to SNAP-INC-7."""

from __future__ import annotations

from collections.abc import Iterator

from pytest_rlrollout.snapshot import arc2, untrusted
from pytest_rlrollout.snapshot.layout import ADAPTER_CONFIG, INDEX, SPEC
from pytest_rlrollout.snapshot.validate.core import WEIGHTS, Inconclusive, NotApplicable, Problem, Subject, check, names

CHECKSUM_FORMATS = ("alder32", "adler32")  # the documented misspelling, and the Decision's alias


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
            yield Problem(INDEX, f"weight_map differs from the parent's for {names(moved)}")
    parent_files = set(pmap.values())
    mine_files = set(s.dir.safetensors_files)
    if mine_files != parent_files:
        missing, extra = sorted(parent_files - mine_files), sorted(mine_files - parent_files)
        detail = "; ".join(x for x in (missing and f"missing {names(missing)}", extra and f"extra {names(extra)}") if x)
        yield Problem(None, f"holds {len(mine_files)} diff file(s), the parent {len(parent_files)}: {detail}")
    for file in sorted(mine_files & parent_files):
        mine_h, parent_h = s.headers.get(file), parent.headers.get(file)
        if mine_h and parent_h and set(mine_h.tensors) != set(parent_h.tensors):
            diff = set(mine_h.tensors) ^ set(parent_h.tensors)
            yield Problem(file, f"tensor set differs from the parent's file: {names(diff)}")


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


def _format(s: Subject, key: str, default: str) -> str | None:
    """A format named in the signal's metadata, lower-cased; None when it is not a string."""
    value = (s.incremental_metadata or {}).get(key, default)
    return value.lower() if isinstance(value, str) else None


@check("SNAP-INC-3", frozenset({"incremental"}))
def _arc2_payloads(s: Subject) -> Iterator[Problem]:
    parent = _need_parent(s)
    fmt = _format(s, "compression_format", "arc_v2")
    if fmt == "arc_v3":
        yield Problem(None, "arc_v3 payloads are pickles and are never decoded from untrusted input")
        return
    if fmt not in arc2.FORMATS:
        raw = (s.incremental_metadata or {}).get("compression_format")
        raise Inconclusive(f"compression_format {untrusted.shown(raw, 100)} is unknown (SNAP-INC-4)")
    for file, h in sorted(s.headers.items()):
        if file in parent.header_errors:
            # nothing can be decoded over an unreadable parent file, so a deployment could not
            # load the diff: a finding here, whoever is to blame
            yield Problem(file, f"cannot be decoded: the parent's {file} is unreadable: {parent.header_errors[file]}")
            continue
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
        except OSError as e:  # its header was read a moment ago: the file changed or vanished since
            yield Problem(file, f"cannot be read: {e.strerror or e}")


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
    if _format(s, "compression_format", "") != "arc_v2":
        yield Problem(None, f"compression_format is {untrusted.shown(meta.get('compression_format'))}, not 'arc_v2'")
    checksum = meta.get("checksum_format")
    if not (isinstance(checksum, str) and checksum in CHECKSUM_FORMATS):
        yield Problem(None, f"checksum_format is {untrusted.shown(checksum)}, not 'alder32' (sic)")


@check("SNAP-INC-5", frozenset({"incremental"}))
def _previous_is_served(s: Subject) -> Iterator[Problem]:
    meta = s.incremental_metadata
    if meta is None:
        raise NotApplicable("no incremental signal given (pass --signal)")
    previous = meta.get("previous_snapshot_identity")
    if s.ctx.served is not None:
        others = sorted({str(x) for x in s.ctx.served if x != previous})
        if others:
            yield Problem(
                None, f"previous_snapshot_identity is {untrusted.shown(previous)}, but replicas serve {others}"
            )
        return
    parent = s.ctx.parent_identity or (s.ctx.parent.name if s.ctx.parent else None)
    if parent is None:
        raise NotApplicable("neither the served identities nor a parent are known")
    if previous != parent:
        yield Problem(
            None, f"previous_snapshot_identity is {untrusted.shown(previous)}, the parent snapshot is {parent!r}"
        )


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
