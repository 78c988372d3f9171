"""The bucket a deployment loads snapshots from, behind fsspec: a local directory, `file://`,
`s3://` or `gs://` (the latter two need s3fs / gcsfs installed). Each snapshot is a
subdirectory named by its identity.

Identities may come from anyone (a recording's run id, a deployment's status), so the bucket
takes only identities that are one path segment, and confines every path it writes, reads or
removes to its root: on this machine after resolving links, elsewhere by its segments.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

MAX_SEGMENT = 255  # characters: what file systems and object stores take in one name
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def segment_problem(name: object) -> str | None:
    """What keeps `name` from being one path segment (None: nothing)."""
    if not isinstance(name, str):
        return f"is {type(name).__name__}, not a string"
    if not name or name in (".", ".."):
        return "is empty" if not name else f"is {name!r}"
    if len(name) > MAX_SEGMENT:
        return f"is {len(name):,} characters long (at most {MAX_SEGMENT})"
    if "/" in name or "\\" in name:
        return "holds a path separator"
    if _CONTROL.search(name):
        return "holds a control character"
    return None


def check_identity(identity: object) -> str:
    """`identity` when it is one path segment; ValueError saying what is wrong otherwise."""
    problem = segment_problem(identity)
    if problem is not None:
        raise ValueError(f"snapshot identity {str(identity)[:80]!r} {problem}: an identity is one path segment")
    return identity  # type: ignore[return-value]


def _relative(name: str) -> str:
    """`name`, a file's path inside a snapshot (`a/b.safetensors`), when every segment is one."""
    parts = name.split("/")
    for part in parts:
        problem = segment_problem(part)
        if problem is not None:
            raise ValueError(f"file name {name[:120]!r} has a part that {problem}")
    return name


class Bucket:
    def __init__(self, url: str | os.PathLike[str]):
        import fsspec

        text = os.fspath(url).rstrip("/")
        if "://" not in text:
            text = Path(text).resolve().as_uri()
        self.url = text
        try:
            self.fs, self.root = fsspec.core.url_to_fs(text)
        except (ImportError, ValueError) as e:
            raise ValueError(f"bucket {text}: {e}") from None
        self.root = self.root.rstrip("/")

    def __repr__(self) -> str:
        return f"Bucket({self.url!r})"

    @property
    def local_path(self) -> Path | None:
        """The directory, when the bucket is on this machine."""
        return Path(self.root) if self.url.startswith("file://") else None

    def _confined(self, path: str) -> str:
        """`path` when it lies inside the root: on this machine once links are resolved (a link
        planted in the bucket leads nowhere else), elsewhere once normalised."""
        local = self.local_path
        if local is not None:
            inside = Path(path).resolve().is_relative_to(local.resolve())
        else:
            inside = posixpath.normpath(path).startswith(posixpath.normpath(self.root) + "/")
        if not inside:
            raise ValueError(f"{path} leads out of the bucket {self.url}")
        return path

    def path(self, identity: str, name: str | None = None) -> str:
        """Where a snapshot (or one of its files) is; ValueError for anything that would lead
        elsewhere: an identity that is not one segment, a file name with '..', a link out."""
        base = f"{self.root}/{check_identity(identity)}"
        return self._confined(base if name is None else f"{base}/{_relative(name)}")

    def exists(self, identity: str) -> bool:
        return self.fs.exists(self.path(identity))

    def upload(self, local: str | os.PathLike[str], identity: str) -> int:
        """Copy a snapshot directory (subdirectories included) to `<bucket>/<identity>/`;
        returns the bytes sent."""
        local = Path(local)
        if self.exists(identity):
            raise FileExistsError(f"{self.url}/{identity} already exists; identities must be new")
        sent = 0
        made = {self.path(identity)}
        self.fs.makedirs(self.path(identity), exist_ok=True)
        for f in sorted(p for p in local.rglob("*") if p.is_file()):
            target = self.path(identity, f.relative_to(local).as_posix())
            parent = posixpath.dirname(target)
            if parent not in made:  # a local file system makes no parents of its own
                self.fs.makedirs(parent, exist_ok=True)
                made.add(parent)
            self.fs.put_file(str(f), target)
            sent += f.stat().st_size
        return sent

    def copy(self, source: str, identity: str) -> int:
        """Copy snapshot `source` to `identity` inside the bucket (on an object store the store
        copies it: nothing passes through this machine); returns the bytes copied."""
        if self.exists(identity):
            raise FileExistsError(f"{self.url}/{identity} already exists; identities must be new")
        src, dst = self.path(source), self.path(identity)
        files = [f for f in self.fs.find(src) if self.fs.isfile(f)]
        self.fs.makedirs(dst, exist_ok=True)
        copied = 0
        for f in files:
            name = posixpath.relpath(f, src)
            target = self.path(identity, name)
            self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
            self.fs.copy(f, target)
            copied += self.fs.size(f)
        return copied

    def remove(self, identity: str) -> None:
        if self.exists(identity):
            self.fs.rm(self.path(identity), recursive=True)

    def remove_file(self, identity: str, name: str) -> None:
        self.fs.rm(self.path(identity, name))

    def read_text(self, identity: str, name: str) -> str:
        with self.fs.open(self.path(identity, name), "r") as f:
            return f.read()
