"""The directories the project keeps at its top level, found one way from a checkout, an
editable install and a wheel: `conformance/` (the conformance modules), `schemas/` (the clause
catalogue and the JSON Schemas, the contract's language-neutral artefact) and `cassettes/` (the
shipped recordings).

In a checkout, and in an editable install (which imports the package from the checkout), they
sit beside the package. A wheel carries them inside it, under `pytest_rlrollout/_shipped/`
(pyproject.toml's force-include): a wheel that installed top-level directories with names this
common into site-packages would collide with other projects'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

PACKAGE = Path(__file__).parent
Shipped = Literal["conformance", "schemas", "cassettes"]


def shipped(name: Shipped) -> Path:
    """The directory `name`: the wheel's copy when installed from one, else the checkout's."""
    for candidate in (PACKAGE / "_shipped" / name, PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"{name}/ is neither inside the installed package ({PACKAGE / '_shipped'}) nor beside it "
        f"({PACKAGE.parent}): reinstall pytest-rlrollout"
    )
