"""Checks on identity, files and tokenizer: SNAP-ID-1, SNAP-SAFETENSORS-1, SNAP-SIZE-1, SNAP-TOK-1(a)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from pytest_rlrollout.contract.identity import identity_problem
from pytest_rlrollout.snapshot.layout import TOKENIZER_FILES, SnapshotDir
from pytest_rlrollout.snapshot.validate.core import WEIGHTS, NotApplicable, Problem, Subject, check

MAX_FILE_BYTES = 5 * 1024**3  # SNAP-SIZE-1


@check("SNAP-ID-1")
def _identity(s: Subject) -> Iterator[Problem]:
    why = identity_problem(s.identity)
    if why:
        yield Problem(None, f"identity {s.identity!r} {why}; it must be one path segment")


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
