"""A snapshot directory seen read-only: confined file access, layer groups, kind detection."""

from __future__ import annotations

import json
import os
import re
import stat
from functools import cached_property
from pathlib import Path
from typing import Literal

Kind = Literal["full", "incremental", "lora"]

INDEX = "model.safetensors.index.json"
SPEC = "model.weight.spec.json"
CONFIG = "config.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = re.compile(r"^adapter_model(-[^/]*)?\.(safetensors|bin)$")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "chat_template.jinja")  # fmt: skip

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_of(tensor: str) -> int | None:
    """The N of a `model.layers.N.` / `layers.N.` prefix; None for the non-layer group."""
    m = _LAYER.search(tensor)
    return int(m.group(1)) if m else None


def group_name(layer: int | None) -> str:
    return "non-layer tensors" if layer is None else f"layer {layer}"


class UnsafePath(ValueError):
    """A file name that would leave the snapshot directory."""


class SnapshotDir:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        if not self.root.is_dir():
            raise NotADirectoryError(f"{root}: not a directory")
        self._real = self.root.resolve()

    @property
    def name(self) -> str:
        return self.root.name

    @cached_property
    def listing(self) -> list[str]:
        """Names directly inside the snapshot (subdirectories are not part of a snapshot)."""
        return sorted(e.name for e in os.scandir(self.root) if not e.is_dir(follow_symlinks=False))

    def path(self, name: str) -> Path:
        """The path of a file inside the snapshot; raises UnsafePath for names or links leaving it."""
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
            raise UnsafePath(f"{name!r} is not a plain file name")
        p = self.root / name
        if p.is_symlink() and not p.resolve().is_relative_to(self._real):
            raise UnsafePath(f"{name} is a symlink leaving the snapshot (to {os.readlink(p)})")
        return p

    def has(self, name: str) -> bool:
        try:
            p = self.path(name)
        except UnsafePath:
            return False
        return p.is_file()

    def is_regular(self, name: str) -> bool:
        try:
            return stat.S_ISREG(os.stat(self.path(name)).st_mode)
        except (UnsafePath, OSError):
            return False

    def read_bytes(self, name: str) -> bytes:
        p = self.path(name)
        if not self.is_regular(name):
            raise ValueError(f"{name} is not a regular file")
        return p.read_bytes()

    def read_json(self, name: str) -> object:
        """Parsed JSON; raises ValueError with a readable message for unreadable or invalid files."""
        try:
            raw = self.read_bytes(name)
        except OSError as e:
            raise ValueError(f"cannot read: {e.strerror or e}") from None
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"not valid JSON: {e}") from None
        except RecursionError:
            raise ValueError("not valid JSON: nested too deeply") from None

    @cached_property
    def safetensors_files(self) -> list[str]:
        return [n for n in self.listing if n.endswith(".safetensors")]

    @cached_property
    def adapter_weight_files(self) -> list[str]:
        return [n for n in self.listing if ADAPTER_WEIGHTS.match(n)]

    def is_lora(self) -> bool:
        """SNAP-LORA-1: adapter_config.json makes a snapshot a LoRA adapter; there is no flag."""
        return ADAPTER_CONFIG in self.listing
