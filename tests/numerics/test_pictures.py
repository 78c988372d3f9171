"""The pictures of the numerics figures: PNGs drawn without pyplot, routing only when compared,
and nothing (with the reason) when matplotlib is missing."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pytest_rlrollout.numerics.figures import Figures, logprob_figures, routing_figures
from pytest_rlrollout.numerics.pictures import TITLES, pictures, unavailable

# matplotlib imported at collection, before any in-process pytester run (the mutation matrix's):
# a run puts sys.meta_path back as it found it, dropping the import hook six adds, so matplotlib
# (which needs six.moves, through dateutil) first imported inside one cannot be imported after it.
with contextlib.suppress(ImportError):
    import matplotlib.backends.backend_agg
    import matplotlib.figure  # noqa: F401

PNG = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[2]


def _figures(routing: bool) -> Figures:
    rng = np.random.default_rng(0)
    served = rng.normal(-2.0, 1.0, 300)
    figures = logprob_figures(served, served + rng.normal(0.0, 1e-3, 300), np.arange(300) % 30)
    if routing:
        experts = rng.integers(0, 8, (300, 3, 2))
        local = experts.copy()
        local[:20, 1] = 9  # layer 1 disagrees on 20 tokens
        figures = routing_figures(figures, experts, local)
    return figures


def test_pictures_are_pngs_with_routing_when_compared() -> None:
    drawn = pictures(_figures(routing=True))
    assert set(drawn) == {"delta-histogram", "delta-by-position", "routing-by-layer"} == set(TITLES)
    assert all(png.startswith(PNG) for png in drawn.values())


def test_no_routing_picture_without_routing() -> None:
    drawn = pictures(_figures(routing=False))
    assert set(drawn) == {"delta-histogram", "delta-by-position"}
    assert all(png.startswith(PNG) for png in drawn.values())


def test_figures_of_one_token_or_no_kept_deltas_still_draw() -> None:
    one = logprob_figures(np.array([-1.0]), np.array([-1.0]))
    assert set(pictures(one)) == {"delta-histogram", "delta-by-position"}
    bare = Figures.from_dict(
        {k: v for k, v in _figures(routing=True).as_dict().items() if k not in ("deltas", "positions")}
    )
    assert set(pictures(bare)) == {"routing-by-layer"}


def test_without_matplotlib_no_pictures_and_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    assert pictures(_figures(routing=True)) == {}
    why = unavailable()
    assert why is not None and "matplotlib" in why and "numerics" in why


def test_drawing_leaves_pyplot_alone() -> None:
    """No pyplot: its backend and figure registry belong to whoever else runs in the process."""
    code = (
        "import sys\n"
        "from tests.numerics.test_pictures import _figures\n"
        "from pytest_rlrollout.numerics.pictures import pictures\n"
        "assert len(pictures(_figures(routing=True))) == 3\n"
        "print('matplotlib.pyplot' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr
