"""A recorded session's meta (`_session.json` of a cassette directory): where a replay finds the
recording (`cassette_dir`), and the meta read and checked against
`schemas/recorded-session.schema.json` before anything of it is used: a cassette directory may
come from anyone, and its values become file names, snapshot identities and URLs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pytest_rlrollout.engines import DEFAULT, spec
from pytest_rlrollout.shipped import shipped
from pytest_rlrollout.suite.file_schemas import problems
from pytest_rlrollout.suite.settings import usage

SHIPPED_CASSETTES = shipped("cassettes")


def cassette_dir(value: str | os.PathLike[str]) -> Path:
    """A cassette directory, or the name of a set shipped with the package (`reference`)."""
    path = Path(value)
    if not path.is_dir() and (SHIPPED_CASSETTES / str(value)).is_dir():
        path = SHIPPED_CASSETTES / str(value)
    if not path.is_dir():
        shipped = ", ".join(sorted(p.name for p in SHIPPED_CASSETTES.iterdir() if p.is_dir()))
        usage(f"--rl-replay {value}: no such directory (shipped sets: {shipped})")
    return path


def session_meta(directory: Path) -> dict[str, Any]:
    """The recording's meta, checked: a cassette directory may come from anyone, and its values
    become file names, snapshot identities and URLs."""
    from pytest_rlrollout.remote.cassette import Cassette
    from pytest_rlrollout.remote.cassette_file import CassetteError

    session = directory / "_session.json"
    if not session.is_file():
        usage(f"--rl-replay {directory}: no _session.json (record a run with --rl-record first)")
    try:
        meta = Cassette.load(session).meta
    except CassetteError as e:
        usage(f"--rl-replay {directory}: {e}")
    wrong = meta_problems(meta)
    if wrong:
        usage(f"--rl-replay {directory}: _session.json is not a recorded session: {wrong[0]}")
    return meta


def meta_problems(meta: Any) -> list[str]:
    """What is wrong with a recording's meta (empty: nothing), one line per field at fault."""
    if not isinstance(meta, dict):
        return ["its meta is not an object"]
    found = problems("recorded-session", meta)
    out = [f"meta: {why}" for path, why in found.items() if not path]
    out += [
        f"meta.{path[0]} is not allowed: {str(meta[path[0]])[:80]!r} ({why})" for path, why in found.items() if path
    ]
    # which engines name their deployments is the engine registry's to say, not the schema's
    engine = meta.get("engine") or DEFAULT
    if not found and spec(engine).names == "path" and meta.get("deployment") is None:
        out.append("meta.deployment is missing: a Fireworks recording names its deployment")
    return out


def usable_run_id(value: Any) -> bool:
    """Whether `value` may be a run id: it names snapshots and files (the schema's `run_id`)."""
    return not problems("recorded-session", {"run_id": value, "deployment": None, "model": "m"})
