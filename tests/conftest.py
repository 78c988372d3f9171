import hashlib
import os
from pathlib import Path

import pytest

from pytest_rlrollout.broken import ReferenceCases

pytest_plugins = ["pytester"]

SPEC_MD = Path(__file__).resolve().parents[2] / "shared" / "contract" / "SPEC.md"


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> ReferenceCases:
    """Valid reference snapshots of every kind; tests copy before they change anything."""
    return ReferenceCases(tmp_path_factory.mktemp("reference"))


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


def _controller(session) -> bool:
    return not hasattr(session.config, "workerinput")


def pytest_sessionstart(session):
    if _controller(session):
        import shutil

        from tests.test_mutation_matrix import ROWS

        shutil.rmtree(ROWS, ignore_errors=True)  # rows of an earlier run would mix in


def pytest_sessionfinish(session):
    if _controller(session):
        from tests.test_mutation_matrix import assemble

        doc = assemble()
        if doc is not None:
            print(f"\nmutation matrix: {doc['caught']}/{doc['total']} caught -> build/mutation-matrix.md")
