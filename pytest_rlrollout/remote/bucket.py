"""The bucket a deployment loads snapshots from, behind fsspec: a local directory, `file://`,
`s3://` or `gs://` (the latter two need s3fs / gcsfs installed). Each snapshot is a
subdirectory named by its identity."""

from __future__ import annotations

import os
from pathlib import Path


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

    def path(self, identity: str) -> str:
        return f"{self.root}/{identity}"

    def exists(self, identity: str) -> bool:
        return self.fs.exists(self.path(identity))

    def upload(self, local: str | os.PathLike[str], identity: str) -> int:
        """Copy a snapshot directory to `<bucket>/<identity>/`; returns the bytes sent."""
        local = Path(local)
        if self.exists(identity):
            raise FileExistsError(f"{self.url}/{identity} already exists; identities must be new")
        sent = 0
        self.fs.makedirs(self.path(identity), exist_ok=True)
        for f in sorted(p for p in local.rglob("*") if p.is_file()):
            self.fs.put_file(str(f), f"{self.path(identity)}/{f.relative_to(local).as_posix()}")
            sent += f.stat().st_size
        return sent

    def remove(self, identity: str) -> None:
        if self.exists(identity):
            self.fs.rm(self.path(identity), recursive=True)

    def remove_file(self, identity: str, name: str) -> None:
        self.fs.rm(f"{self.path(identity)}/{name}")

    def read_text(self, identity: str, name: str) -> str:
        with self.fs.open(f"{self.path(identity)}/{name}", "r") as f:
            return f.read()
