"""A snapshot directory seen read-only: confined file access, layer groups, kind detection."""

from __future__ import annotations

import errno
import os
import re
import stat
from functools import cached_property
from pathlib import Path
from typing import Literal

from pytest_rlrollout.snapshot import untrusted

Kind = Literal["full", "incremental", "lora"]
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?(?:[eE]\d+)?)\s*([KMGT]?i?B?)?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A size as people write it: 5GB, 512MiB, 1e9, 1000000 (K, M, G, T are powers of 1024,
    as file sizes are shown). ValueError for anything else."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 5GB, 512MiB, 1000000)")
    unit = (m.group(2) or "").upper().replace("I", "").rstrip("B")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(unit or " "))


INDEX = "model.safetensors.index.json"
SPEC = "model.weight.spec.json"
CONFIG = "config.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = re.compile(r"^adapter_model(-[^/]*)?\.(safetensors|bin)$")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)

_LAYER = re.compile(r"(?:^|\.)layers\.(\d{1,18})\.")  # 18 digits: int() stays cheap whatever the name


def layer_of(tensor: str) -> int | None:
    """The N of a `model.layers.N.` / `layers.N.` prefix; None for the non-layer group."""
    m = _LAYER.search(tensor)
    return int(m.group(1)) if m else None


def group_name(layer: int | None) -> str:
    return "non-layer tensors" if layer is None else f"layer {layer}"


class UnsafePath(ValueError):
    """A file name the validator does not follow: not a plain name, longer than any file name
    can be, or a symlink that leaves the snapshot directory or loops."""


MAX_NAME_BYTES = 255  # NAME_MAX on Linux and macOS: no file of the snapshot has a longer name
COMPARE_CHUNK = 1 << 20


class SnapshotDir:
    """A snapshot directory read as untrusted: names are confined to it, symlinks are followed
    only when they stay inside it, and only regular files are opened."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        if not self.root.is_dir():
            raise NotADirectoryError(f"{root}: not a directory")
        self._real = Path(os.path.realpath(self.root))  # never raises, unlike Path.resolve() on a loop
        self._stats: dict[str, os.stat_result | str] = {}  # a stat, or why there is none

    @property
    def name(self) -> str:
        return self.root.name

    @cached_property
    def listing(self) -> list[str]:
        """Names directly inside the snapshot (subdirectories are not part of a snapshot)."""
        return sorted(e.name for e in os.scandir(self.root) if not e.is_dir(follow_symlinks=False))

    @cached_property
    def _listed(self) -> frozenset[str]:
        return frozenset(self.listing)

    def path(self, name: str) -> Path:
        """The path of a file inside the snapshot; raises UnsafePath for names or links leaving it."""
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
            raise UnsafePath(f"{untrusted.brief(name)} is not a plain file name")
        # surrogatepass: a name from JSON can hold any lone surrogate, which surrogateescape refuses
        if len(name) * 4 > MAX_NAME_BYTES and len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise UnsafePath(f"{untrusted.brief(name)} is longer than any file name ({MAX_NAME_BYTES} bytes)")
        p = self.root / name
        if name in self._listed and os.path.islink(p):
            self._confine(p, name)
        return p

    def _confine(self, link: Path, name: str) -> None:
        try:
            real = os.path.realpath(link, strict=True)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafePath(f"{name} is a symlink loop") from None
            real = os.path.realpath(link)  # dangling: where it would point still decides
        if not Path(real).is_relative_to(self._real):
            raise UnsafePath(f"{name} is a symlink leaving the snapshot (to {_link_target(link)})")

    def stat(self, name: str) -> os.stat_result | None:
        """The file's stat (symlinks followed), or None when it is not there or cannot be followed."""
        st = self._stat(name)
        return None if isinstance(st, str) else st

    def _stat(self, name: str) -> os.stat_result | str:
        if name not in self._stats:
            self._stats[name] = self._stat_or_why(name)
        return self._stats[name]

    def _stat_or_why(self, name: str) -> os.stat_result | str:
        try:
            p = self.path(name)
        except UnsafePath as e:
            return f"{e}; not read"
        if name not in self._listed:
            # the listing leaves directories out: a directory is not a missing file
            return "is a directory, not a regular file; not read" if os.path.isdir(p) else "is missing"
        try:
            return os.stat(p)
        except OSError as e:
            if e.errno == errno.ENOENT and os.path.islink(p):
                return f"is a dangling symlink (to {_link_target(p)}); not read"
            return f"cannot be read: {e.strerror or e}"

    def has(self, name: str) -> bool:
        return self.is_regular(name)

    def is_regular(self, name: str) -> bool:
        st = self.stat(name)
        return st is not None and stat.S_ISREG(st.st_mode)

    def unreadable(self, name: str) -> str | None:
        """Why a file is not read (missing, a directory, a symlink out or in a loop, a FIFO, a
        device...), or None for a regular file the validator reads."""
        st = self._stat(name)
        if isinstance(st, str):
            return st
        if not stat.S_ISREG(st.st_mode):
            return f"is {untrusted.kind_of(st.st_mode)}, not a regular file; not read"
        return None

    def read_bytes(self, name: str, limit: int = untrusted.MAX_JSON_BYTES) -> bytes:
        """A regular file's bytes; ValueError (UnsafePath, Unreadable) or OSError when it is not one."""
        return untrusted.read_limited(self.path(name), limit)

    def read_json(self, name: str, limit: int = untrusted.MAX_JSON_BYTES) -> object:
        """Parsed JSON; raises ValueError with a readable message for unreadable or invalid files."""
        why = self.unreadable(name)
        if why is not None:
            raise ValueError(why)
        try:
            raw = self.read_bytes(name, limit)
        except OSError as e:
            raise ValueError(f"cannot be read: {e.strerror or e}") from None
        except untrusted.Unreadable as e:
            raise ValueError(str(e)) from None
        try:
            return untrusted.loads(raw)
        except untrusted.BadJSON as e:
            raise ValueError(str(e)) from None

    def same_bytes(self, name: str, other: SnapshotDir, other_name: str | None = None) -> bool:
        """Whether two regular files hold the same bytes, read in chunks (a tokenizer can be big)."""
        with (
            untrusted.open_regular(self.path(name)) as a,
            untrusted.open_regular(other.path(other_name or name)) as b,
        ):
            if os.fstat(a.fileno()).st_size != os.fstat(b.fileno()).st_size:
                return False
            while True:
                chunk = a.read(COMPARE_CHUNK)
                if chunk != b.read(COMPARE_CHUNK):
                    return False
                if not chunk:
                    return True

    @cached_property
    def safetensors_files(self) -> list[str]:
        return [n for n in self.listing if n.endswith(".safetensors")]

    @cached_property
    def adapter_weight_files(self) -> list[str]:
        return [n for n in self.listing if ADAPTER_WEIGHTS.match(n)]

    def is_lora(self) -> bool:
        """SNAP-LORA-1: adapter_config.json makes a snapshot a LoRA adapter; there is no flag."""
        return ADAPTER_CONFIG in self.listing


def _link_target(link: Path) -> str:
    try:
        return untrusted.brief_text(os.readlink(link), 200)
    except OSError:
        return "?"
