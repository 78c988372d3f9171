"""The static checks CI holds the tree to: ruff's lint and format, the import contracts
(pyproject's [tool.importlinter]) and mypy (pyproject's [tool.mypy]), each run from the repo root
as a contributor runs it, failing with the tool's own output."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the tools installed beside the running interpreter (the test extra)
# mypy's cache lives outside the tree, kept between runs: a warm run checks only what changed
MYPY_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pytest-rlrollout" / "mypy"


def _clean(*command: str | Path) -> None:
    run = subprocess.run([str(c) for c in command], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, f"{' '.join(map(str, command))} exited {run.returncode}:\n{run.stdout}{run.stderr}"


def test_ruff_check_is_clean():
    _clean(sys.executable, "-m", "ruff", "check", ".")


def test_ruff_format_owns_every_file():
    _clean(sys.executable, "-m", "ruff", "format", "--check", ".")


def test_import_contracts_hold():
    _clean(BIN / "lint-imports")


def test_mypy_is_clean():
    _clean(sys.executable, "-m", "mypy", "--cache-dir", MYPY_CACHE)


def test_a_checker_sees_every_name_the_package_exports():
    """The package top loads its names on first use (`_EXPORTS`); a checker reads the
    TYPE_CHECKING imports instead: both name the same objects, from the same modules."""
    import ast

    import pytest_rlrollout

    tree = ast.parse(Path(pytest_rlrollout.__file__).read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")
    seen = {a.asname: node.module for node in guarded.body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert seen == pytest_rlrollout._EXPORTS
