"""What a live run leaves for its report, typed: what was served at the start and at each
worker's end, the restore of the start, and the uploads each worker removed or kept.

xdist workers and the controller are separate processes: each record is one JSON file in the
run's `rl-state` folder, written once (the first start wins), read back into the same types once
it satisfies `schemas/run-state.schema.json` (a file that does not raises `RunStateError` naming
it and the field at fault).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_rlrollout.suite.file_schemas import problems


@dataclass(frozen=True)
class Served:
    """The replicas in the hot-load status's shape, and when they were read (wall clock)."""

    replicas: list[dict[str, Any]]
    at: float = field(default_factory=time.time)

    @property
    def identities(self) -> list[str]:
        """What the replicas serve, each once, sorted."""
        return sorted({str(r.get("current_snapshot_identity")) for r in self.replicas})

    @property
    def label(self) -> str | None:
        """The identity every replica serves, or None when they differ or say none."""
        labels = {r.get("current_snapshot_identity") for r in self.replicas}
        label = labels.pop() if len(labels) == 1 else None
        return label if isinstance(label, str) else None


@dataclass(frozen=True)
class Restored(Served):
    """What the engine's driver did to serve the start again, and what it served after."""

    restored: str = ""


@dataclass(frozen=True)
class Cleanup:
    """The uploads of one worker's snapshot factory: removed, or kept because they are served."""

    removed: list[str]
    kept: list[str]


class RunStateError(ValueError):
    """A run-state file that is not the record its name says (which file, which field)."""


# the schema's record of each kind (its `$defs`)
RECORDS: dict[type, str] = {Served: "served", Restored: "restored", Cleanup: "cleanup"}


class RunState:
    """The run's `rl-state` folder."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _write(self, name: str, record: Any, *, once: bool = False) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(asdict(record))
        with contextlib.suppress(FileExistsError), open(self.folder / name, "x" if once else "w") as f:
            f.write(text)

    def _read(self, path: Path, kind: type) -> Any:
        try:
            doc = json.loads(path.read_text())
        except (UnicodeDecodeError, ValueError) as e:
            raise RunStateError(f"{path}: not JSON ({e})") from None
        wrong = problems("run-state", doc, RECORDS[kind])
        if wrong:
            raise RunStateError(f"{path}: not a {RECORDS[kind]} record: {'; '.join(wrong.values())}")
        return kind(**doc)

    # ------------------------------------------------------------------------- written

    def started(self, served: Served) -> None:
        """What was served before any test of the run (the first worker's read wins)."""
        self._write("start.json", served, once=True)

    def ended(self, served: Served) -> None:
        """What was served when this process's tests were done."""
        self._write(f"end-{os.getpid()}.json", served)

    def restored(self, restored: Restored) -> None:
        self._write("restored.json", restored)

    def cleaned(self, cleanup: Cleanup, name: str | None = None) -> None:
        """What a worker's factory removed and kept (`name`: what else removed them, once)."""
        self._write(f"removed-{name or os.getpid()}.json", cleanup)

    # ------------------------------------------------------------------------- read

    @property
    def start(self) -> Served | None:
        path = self.folder / "start.json"
        return self._read(path, Served) if path.is_file() else None

    @property
    def restore(self) -> Restored | None:
        path = self.folder / "restored.json"
        return self._read(path, Restored) if path.is_file() else None

    @property
    def end(self) -> Served | None:
        """The latest of every worker's end and the restore: what the run left served."""
        ends: list[Served] = [self._read(p, Served) for p in self.folder.glob("end-*.json")]
        if (restore := self.restore) is not None:
            ends.append(restore)
        return max(ends, key=lambda s: s.at, default=None)

    @property
    def cleanups(self) -> list[Cleanup]:
        return [self._read(p, Cleanup) for p in sorted(self.folder.glob("removed-*.json"))]
