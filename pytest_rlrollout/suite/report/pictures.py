"""The pictures of a report: the NUM ones, each drawn for the clause it is about (NUM-LOGPROB-1
gets the Δlogprob pictures, NUM-ROUTE-1 the routing one), and a soak's over time. Drawing is on
matplotlib (optional) through `numerics.pictures`; this picks what each clause shows and keeps a
test whose figures do not draw from costing the others theirs."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.numerics.figures import Figures
from pytest_rlrollout.numerics.pictures import pictures, png_of, unavailable
from pytest_rlrollout.suite.report.model import Report
from pytest_rlrollout.suite.report.soak import SoakSummary

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# A test's key (`NumericsTest.key`) -> picture name -> PNG
Drawn = dict[str, dict[str, bytes]]

# What of its test's figures a clause does not picture: NUM-ROUTE-1's test also keeps its tokens'
# Δlogprob (the same sampling), which is NUM-LOGPROB-1's to show; NUM-LOGPROB-1 compares no routing.
NOT_PICTURED: dict[str, dict[str, Any]] = {
    "NUM-ROUTE-1": {"deltas": [], "positions": []},
    "NUM-LOGPROB-1": {"route_agreement": None, "layer_agreement": []},
}


def about(clause: str, figures: Figures) -> Figures:
    """`figures` with only what `clause` judges left to picture."""
    return replace(figures, **NOT_PICTURED.get(clause, {}))


def draw(report: Report) -> tuple[Drawn, str | None]:
    """The pictures of every NUM test, and why some or all are missing (matplotlib not installed,
    figures that do not draw)."""
    tests = report.numerics_tests()
    if not tests:
        return {}, None
    why = unavailable()
    if why is not None:
        return {}, why
    out: Drawn = {}
    for t in tests:
        try:
            out[t.key] = pictures(about(t.clause.clause, t.figures.figures))
        except (TypeError, ValueError, KeyError) as e:
            # figures that do not draw (a report edited by hand) cost their pictures, not the report
            out[t.key], why = {}, f"{t.key}: the figures do not draw ({type(e).__name__}: {e})"
    return out, why


SOAK_TITLES = {
    "throughput": "tokens per second over the soak, swaps marked (dashed: signalled; solid: every replica serving)",
    "latency": "time to first token and inter-chunk gap (p50, p99) over the soak, swaps marked",
    "stalls": "per swap: signal to every replica serving, and the stall of the streams across it (p50, p99, max)",
}


def draw_soak(soak: SoakSummary) -> tuple[dict[str, bytes], str | None]:
    """The soak's pictures (`SOAK_TITLES`), or why there are none."""
    why = unavailable()
    if why is not None:
        return {}, why
    try:
        return {
            "throughput": png_of(lambda ax: _throughput(ax, soak)),
            "latency": png_of(lambda ax: _latency(ax, soak)),
            "stalls": png_of(lambda ax: _stalls(ax, soak)),
        }, None
    except (TypeError, ValueError, KeyError) as e:  # figures edited by hand cost their pictures, not the report
        return {}, f"the soak's figures do not draw ({type(e).__name__}: {e})"


def _swaps(ax: Axes, soak: SoakSummary) -> None:
    for s in soak.swaps:
        ax.axvline(s.signalled_at, color="0.6", linestyle="--", linewidth=0.8)
        if s.served_at is not None:
            ax.axvline(s.served_at, color="0.3", linewidth=0.8)


def _throughput(ax: Axes, soak: SoakSummary) -> None:
    points = soak.series.get("tokens_per_s", ())
    ax.plot([t for t, _ in points], [v for _, v in points], drawstyle="steps-post", color="C0")
    _swaps(ax, soak)
    ax.set(xlabel="seconds since the soak began", ylabel="tokens/s", title="throughput")


def _latency(ax: Axes, soak: SoakSummary) -> None:
    for i, name in enumerate(("ttft", "gap")):
        for q, style in (("p50", "-"), ("p99", ":")):
            points = soak.series.get(f"{name}_{q}", ())
            ax.plot([t for t, _ in points], [v * 1000 for _, v in points], style, color=f"C{i}", label=f"{name} {q}")
    _swaps(ax, soak)
    ax.set_yscale("log")
    ax.set(xlabel="seconds since the soak began", ylabel="ms", title="latency")
    ax.legend(fontsize="small")


def _stalls(ax: Axes, soak: SoakSummary) -> None:
    epochs = [s.epoch for s in soak.swaps]
    served = [(s.served_at - s.signalled_at) if s.served_at is not None else 0.0 for s in soak.swaps]
    ax.bar([e - 0.2 for e in epochs], served, width=0.4, color="0.6", label="signal to every replica serving")
    for attr, marker in (("stall_p50", "o"), ("stall_p99", "^"), ("stall_max", "v")):
        ax.plot(epochs, [getattr(s, attr) or 0.0 for s in soak.swaps], marker, color="C3", label=attr.replace("_", " "))
    ax.set(xlabel="swap", ylabel="seconds", title="swaps")
    ax.legend(fontsize="small")
