"""Checks on identity, files and tokenizer: SNAP-ID-1, SNAP-SAFETENSORS-1, SNAP-SIZE-1, SNAP-TOK-1(a)."""

from __future__ import annotations

import stat
from collections.abc import Iterator

from pytest_rlrollout.contract.identity import identity_problem
from pytest_rlrollout.snapshot import untrusted
from pytest_rlrollout.snapshot.layout import TOKENIZER_FILES, SnapshotDir
from pytest_rlrollout.snapshot.validate.core import WEIGHTS, NotApplicable, Problem, Subject, check

MAX_FILE_BYTES = 5 * 1024**3  # SNAP-SIZE-1


@check("SNAP-ID-1")
def _identity(s: Subject) -> Iterator[Problem]:
    why = identity_problem(s.identity)  # whatever the signal holds: a number, null, a list, NaN...
    if why:
        yield Problem(None, f"identity {untrusted.brief(s.identity)} {why}; it must be one path segment")


@check("SNAP-SAFETENSORS-1")
def _safetensors(s: Subject) -> Iterator[Problem]:
    errors = sorted(s.header_errors.items())  # reading the headers notes what the bounds left unread
    for note in s.limits:
        yield Problem(None, note)
    for name, error in errors:
        yield Problem(name, error)


@check("SNAP-SIZE-1")
def _size(s: Subject) -> Iterator[Problem]:
    for name in s.dir.safetensors_files:
        st = s.dir.stat(name)
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size > MAX_FILE_BYTES:
            yield Problem(name, f"is {st.st_size / 1024**3:.2f} GiB; keep files at or under 5 GiB")


def _tokenizer_files(s: Subject) -> tuple[SnapshotDir, list[str]]:
    """Where the tokenizer comes from: the snapshot, or its parent when a diff carries none; and
    the tokenizer files listed there (readable or not)."""
    listed = set(s.dir.listing)
    own = [n for n in TOKENIZER_FILES if n in listed] + [n for n in s.dir.listing if n.endswith(".tiktoken")]
    if not own and s.kind == "incremental" and s.parent is not None:
        return _tokenizer_files(s.parent)
    return s.dir, own


@check("SNAP-TOK-1", WEIGHTS)
def _tokenizer(s: Subject) -> Iterator[Problem]:
    where, listed = _tokenizer_files(s)
    present = []
    for name in listed:
        why = where.unreadable(name)  # a FIFO, a loop, a link out: named, never opened
        if why is None:
            present.append(name)
        elif where is s.dir:
            yield Problem(name, why)
        else:
            yield Problem(name, f"(the parent's, which a diff inherits) {why}")
    has_pair = {"tokenizer.json", "tokenizer_config.json"} <= set(present)
    has_model = "tokenizer.model" in present or any(n.endswith(".tiktoken") for n in present)
    if not (has_pair or has_model):
        need = [n for n in ("tokenizer.json", "tokenizer_config.json") if n not in present]
        # a directory under a tokenizer file's name is not listed, but deserves a word
        need = [f"{n} ({why})" if n not in listed and (why := where.unreadable(n)) != "is missing" else n for n in need]
        yield Problem(None, f"tokenizer files missing: {', '.join(need)} (or a tokenizer model file)")


@check("SNAP-TOK-1a", WEIGHTS)
def _tokenizer_as_base(s: Subject) -> Iterator[Problem]:
    if s.base is None:
        raise NotApplicable("no base snapshot given")
    where, present = _tokenizer_files(s)
    base_dir, base_files = _tokenizer_files(s.base)
    for name in base_files:
        if name not in present or where.unreadable(name) or base_dir.unreadable(name):
            continue  # SNAP-TOK-1 names unreadable files; the base's own are the caller's to fix
        try:
            same = where.same_bytes(name, base_dir)
        except (OSError, ValueError):  # changed under the validator since it was looked at
            continue
        if not same:
            yield Problem(name, "differs from the base model's copy; carry tokenizer files over unchanged")
