"""A readers-writer lock shared by every process that tests one deployment.

State-changing tests (hot-loads, ledger resets) take it exclusively; read-only tests take it
shared, so with `-n 2` (or two runs on one machine) no read-only test overlaps a swap. The lock
is a `flock` on a file named after the deployment, so it dies with the process that held it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def lock_path(key: str, directory: str | os.PathLike[str] | None = None) -> Path:
    root = Path(directory or tempfile.gettempdir()) / "rlrollout-locks"
    root.mkdir(parents=True, exist_ok=True)
    return root / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".lock")


class DeploymentLock:
    """`with lock.exclusive():` / `with lock.shared():` across processes."""

    def __init__(self, key: str, directory: str | os.PathLike[str] | None = None):
        self.key, self.path = key, lock_path(key, directory)

    @contextlib.contextmanager
    def _held(self, mode: int) -> Iterator[None]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self._held(fcntl.LOCK_EX)

    def shared(self) -> contextlib.AbstractContextManager[None]:
        return self._held(fcntl.LOCK_SH)
