from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    """Every test in this directory drives the real producers and clients: mark it `interop`
    (`-m "not interop"` leaves them out) and keep them on one xdist worker (`--dist loadgroup`),
    which alone pays for importing torch, transformers and peft (modules import them lazily)."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.interop)
            item.add_marker(pytest.mark.xdist_group("interop"))
