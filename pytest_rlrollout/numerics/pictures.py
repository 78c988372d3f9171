"""Pictures of the numerics figures, as PNG bytes for the report and `rlrollout numerics`.

Drawn on matplotlib `Figure`s with their own Agg canvas, never through pyplot: pyplot keeps a
process-wide backend and figure registry, and this runs inside other people's processes (a pytest
session, a notebook). matplotlib is optional (the `numerics` extra): without it `pictures` returns
nothing and `unavailable` says why.
"""

from __future__ import annotations

import importlib
import io
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from pytest_rlrollout.numerics.figures import RATIO_BAND, Figures

if TYPE_CHECKING:
    from matplotlib.axes import Axes

SIZE, DPI = (6.4, 3.4), 100  # inches and dots per inch: 640 x 340 pixels, readable in a report column
BINS = 60
DELTA_COLOUR, MEAN_COLOUR, BAND_COLOUR, ROUTE_COLOUR = "#1f6fd1", "#e0157f", "#c62828", "#2e7d32"
MAX_POINTS = 20_000  # points of the position scatter; more only blur it (every token is in the mean line)
# name -> what the picture shows (alt text and captions)
TITLES = {
    "delta-histogram": "Δlogprob (local − served) per sampled token",
    "delta-by-position": "Δlogprob along the completion (token position)",
    "routing-by-layer": "routing agreement per MoE layer",
}


def unavailable() -> str | None:
    """Why no pictures can be drawn (matplotlib is not installed), or None when they can."""
    try:
        for module in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
            importlib.import_module(module)
    except ImportError as e:
        return f"matplotlib is not installed ({e}); pip install 'pytest-rlrollout[numerics]' for the pictures"
    return None


def png_of(draw: Callable[[Axes], None]) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself to the figure: savefig renders with Agg, whatever pyplot's backend
    draw(fig.add_subplot())
    out = io.BytesIO()
    # no Software entry: the bytes do not depend on which matplotlib release wrote them by name
    fig.savefig(out, format="png", metadata={"Software": None})
    return out.getvalue()


LOG_COUNTS = 100  # the tallest bin from which counts go on a log axis


def delta_histogram(figures: Figures) -> bytes:
    """How Δlogprob is spread over the sampled tokens, with the ratio band's edges where they fit
    in the picture. Counts go on a log axis once bins reach `LOG_COUNTS` tokens (the tails are what
    matter, beside a tall bulk), labelled as counts (1, 10, 100); below that a plain axis of whole
    tokens reads better than a log axis of 10⁰ and 2×10⁰."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    deltas = np.asarray(figures.deltas, np.float64)

    def draw(ax: Axes) -> None:
        counts, _, _ = ax.hist(deltas, bins=BINS, color=DELTA_COLOUR)
        if np.max(counts) >= LOG_COUNTS:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        lo, hi = ax.get_xlim()
        for edge in (math.log(RATIO_BAND[0]), math.log(RATIO_BAND[1])):
            if lo <= edge <= hi:
                ax.axvline(edge, color=BAND_COLOUR, linestyle="--", linewidth=1)
        ax.set_xlabel("Δlogprob = local − served")
        ax.set_ylabel("tokens")
        ax.set_title(f"{TITLES['delta-histogram']}: {len(deltas)} tokens, max |Δ| {figures.max_abs:.3g}", fontsize=10)

    return png_of(draw)


def delta_by_position(figures: Figures) -> bytes:
    """Δlogprob against the token's index in its completion, with the mean |Δ| per position: a
    mismatch that grows along the completion (a KV cache drifting) shows as a rising line."""
    deltas = np.asarray(figures.deltas, np.float64)
    positions = np.asarray(figures.positions[: len(deltas)], np.int64)
    deltas = deltas[: len(positions)]

    def draw(ax: Axes) -> None:
        step = max(1, -(-len(deltas) // MAX_POINTS))
        ax.scatter(
            positions[::step],
            deltas[::step],
            s=4,
            alpha=0.35,
            color=DELTA_COLOUR,
            linewidths=0,
            label="Δlogprob per token",
        )
        counts = np.bincount(positions)
        where = np.flatnonzero(counts)
        mean_abs = np.bincount(positions, weights=np.abs(deltas))[where] / counts[where]
        ax.plot(where, mean_abs, color=MEAN_COLOUR, linewidth=1.5, label="mean |Δ| at the position")
        ax.axhline(0.0, color="#666666", linewidth=0.6)
        ax.set_xlabel("token position in the completion")
        ax.set_ylabel("Δlogprob = local − served")
        ax.set_title(TITLES["delta-by-position"], fontsize=10)
        ax.legend(loc="best", fontsize=8, frameon=False)

    return png_of(draw)


def routing_by_layer(figures: Figures) -> bytes:
    """The share of tokens routed to the same expert set as the local router, per MoE layer."""
    from matplotlib.ticker import MaxNLocator

    agreement = np.asarray(figures.layer_agreement, np.float64) * 100

    # the axis starts at a round ten below the worst layer (at most 90): near-perfect layers differ
    # in the last percent, which a 0-100 axis would flatten away
    bottom = min(90.0, math.floor(agreement.min() / 10) * 10) if agreement.size else 0.0
    overall = f", all layers {figures.route_agreement:.2%}" if figures.route_agreement is not None else ""

    def draw(ax: Axes) -> None:
        ax.bar(np.arange(len(agreement)), agreement - bottom, bottom=bottom, color=ROUTE_COLOUR, width=0.8)
        if figures.route_agreement is not None:
            ax.axhline(figures.route_agreement * 100, color=MEAN_COLOUR, linestyle="--", linewidth=1)
        ax.set_ylim(bottom, 100.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("MoE layer")
        ax.set_ylabel("tokens with the same experts (%)")
        ax.set_title(f"{TITLES['routing-by-layer']}: {figures.route_tokens} tokens{overall}", fontsize=10)

    return png_of(draw)


def pictures(figures: Figures) -> dict[str, bytes]:
    """The pictures the figures allow, name -> PNG (names are TITLES' keys): the Δlogprob ones when
    per-token deltas were kept, the routing one when routing was compared. Empty without matplotlib
    (`unavailable` says why)."""
    if unavailable() is not None:
        return {}
    out = {}
    if figures.deltas:
        out["delta-histogram"] = delta_histogram(figures)
        if figures.positions:
            out["delta-by-position"] = delta_by_position(figures)
    if figures.route_agreement is not None and figures.layer_agreement:
        out["routing-by-layer"] = routing_by_layer(figures)
    return out
