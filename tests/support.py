"""What the project's tests share: an HTTP client for a running reference deployment, SSE
helpers, and a hash of a directory tree (to prove nothing was written)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import httpx

from pytest_rlrollout.remote.polling import wait_until

# A run against `rlrollout serve` takes the live timing profile, whose status polls (two a second)
# see its one-second swaps in progress only now and then: tests that are not about the poll rate
# (tests/suite/test_slow_swaps.py is) poll as fast as the reference swaps.
FAST_POLLS = ("-o", "rl_poll_interval=0.05")

# The mutation matrix: one row per fault switch (tests/suite/test_mutation_matrix.py) and per
# broken snapshot variant (tests/snapshot/test_validator.py); assembled at the session's end.
ROWS = Path(__file__).resolve().parent.parent / "build" / "mutation-matrix"


class LazyModule:
    """A module imported when a test first touches it: every xdist worker collects every test
    module, and torch, transformers and peft take seconds to import; a missing package skips the
    test that needs it (pytest.importorskip)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("_"):  # pytest's collection probes module globals (__test__, _pytest...)
            raise AttributeError(attr)
        import pytest

        return getattr(pytest.importorskip(self._name), attr)


class Client:
    """httpx against a running reference deployment with the right headers."""

    def __init__(self, dep):
        self.dep = dep
        self.http = httpx.Client(base_url=dep.base_url, timeout=30, headers={"Authorization": f"Bearer {dep.api_key}"})

    def hot_load(self, body=None, method="POST", headers=None):
        h = self.dep.hot_load_headers() | (headers or {})
        if method == "GET":
            return self.http.get("/hot_load/v1/models/hot_load", headers=h)
        return self.http.post("/hot_load/v1/models/hot_load", json=body, headers=h)

    def status(self):
        r = self.hot_load(method="GET")
        assert r.status_code == 200
        return r.json()

    def replicas_where(self, predicate, *, timeout=10.0, what="the replicas' state"):
        """The replicas once `predicate(replicas)` holds (polled every 5 ms, with a deadline)."""
        return wait_until(
            lambda: (rs := self.status()["replicas"]) and predicate(rs) and rs,
            timeout=timeout,
            interval=0.005,
            what=what,
        )

    def wait_for(self, identity, timeout=20.0, lora=False):
        """The replicas once every one serves `identity`; fails at once if a load reports an error."""

        def served(replicas):
            failed = [
                r
                for r in replicas
                if r["loading_state"]["stage"] == "error" and r["loading_state"]["target_snapshot_identity"] == identity
            ]
            assert not failed, f"load of {identity} failed: {replicas}"
            if lora:
                return all(
                    any(a["identity"] == identity and a["status"] == "loaded" for a in r["loaded_adapters"])
                    for r in replicas
                )
            return all(r["readiness"] and r["current_snapshot_identity"] == identity for r in replicas)

        return self.replicas_where(served, timeout=timeout, what=f"{identity} served on every replica")

    def complete(self, prompt, stream=False, headers=None, **body):
        payload = {"model": self.dep.name, "prompt": prompt, "temperature": 0, **body, "stream": stream}
        if not stream:
            return self.http.post("/inference/v1/completions", json=payload, headers=headers or {})
        return self.http.stream("POST", "/inference/v1/completions", json=payload, headers=headers or {})


def sse_chunks(lines):
    """The JSON chunks of SSE `data:` lines ([DONE] left out)."""
    return [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]


def versions(chunks):
    """The policy version of every chunk (the whole model name where the suffix is missing)."""
    return [ch["model"].rsplit("@", 1)[-1] for ch in chunks]


def tree_hash(root: Path) -> str:
    """Names, modes, sizes, mtimes and contents of everything under root (symlinks not followed)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + dirnames):
            p = Path(dirpath) / name
            st = p.lstat()
            h.update(f"{p.relative_to(root)}|{st.st_mode}|{st.st_size}|{st.st_mtime_ns}".encode())
            if p.is_file() and not p.is_symlink() and st.st_size < (64 << 20):
                h.update(p.read_bytes())
    return h.hexdigest()


def thread_pool():
    """An executor for fireworks-delta-compression's `delta_compress_dirs`: its default is a
    fork-based process pool, and forking a process that already runs torch's OpenMP threads can
    deadlock the child; threads run the package's code unchanged."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(2)


def write_row(name: str, kind: str, got: dict[str, str], clause: str) -> None:
    ROWS.mkdir(parents=True, exist_ok=True)
    failing = sorted(k for k, v in got.items() if v == "fail")
    row = {
        "switch": name,
        "kind": kind,
        "clause": clause,
        "caught": got.get(clause) == "fail",
        "failing": failing,
        "inconclusive": sorted(k for k, v in got.items() if v == "inconclusive"),
    }
    (ROWS / f"{name}.json").write_text(json.dumps(row))


def assemble(rows: Path = ROWS) -> dict | None:
    """build/mutation-matrix.json and .md from the rows of this run (called at session end)."""
    files = sorted(rows.glob("*.json")) if rows.is_dir() else []
    if not files:
        return None
    table = [json.loads(p.read_text()) for p in files]
    doc = {"rows": table, "caught": sum(r["caught"] for r in table), "total": len(table)}
    out = rows.parent / "mutation-matrix.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        f"# Mutation matrix: {doc['caught']}/{doc['total']} caught",
        "",
        "| switch | kind | caught | failing clauses | inconclusive |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['switch']} | {r['kind']} | {'yes' if r['caught'] else 'NO'} | {', '.join(r['failing'])} | "
        f"{', '.join(r['inconclusive'])} |"
        for r in table
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return doc


def conformance_module(path: Path, name: str):
    """A conformance test module, imported from its file under `name` (registered while it runs:
    a dataclass in it looks its module up) and left out of sys.modules afterwards."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module
