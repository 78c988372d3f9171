"""pytest-rlrollout: prove an RL-rollout hot-load deployment honours its contract."""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Loaded on first use so the pytest plugin stays cheap to import.
_EXPORTS = {
    "Clause": "pytest_rlrollout.catalogue",
    "catalogue": "pytest_rlrollout.catalogue",
    "Finding": "pytest_rlrollout.validator",
    "Report": "pytest_rlrollout.validator",
    "validate": "pytest_rlrollout.validator",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pytest_rlrollout' has no attribute {name!r}")
