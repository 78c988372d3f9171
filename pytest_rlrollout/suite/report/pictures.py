"""The pictures of a report: the NUM ones, each drawn for the clause it is about (NUM-LOGPROB-1
gets the Δlogprob pictures, NUM-ROUTE-1 the routing one), a soak's over time, and a diagnosis's
gaps against their thresholds. Drawing is on
matplotlib (optional) through `numerics.pictures`; this picks what each clause shows and keeps a
test whose figures do not draw from costing the others theirs."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pytest_rlrollout.numerics.figures import Figures
from pytest_rlrollout.numerics.pictures import pictures, png_of, unavailable
from pytest_rlrollout.suite.report.diagnosis import DiagnosisSummary
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


DIAGNOSIS_TITLES = {
    "gaps": "each cause's largest |Δlogprob| against its threshold (black tick), then each replica's weights "
    "against the trainer's numbers (red: blamed); log scale",
}
DIAGNOSIS_COLOURS = {"CAUSE": "#c62828", "within": "#2e7d32", "remainder": "#78909c", "not measured": "#b0bec5"}
BELOW = 100  # a gap of 0 is drawn this many times below the smallest threshold or gap (a log axis has no 0)


def draw_diagnosis(diagnosis: DiagnosisSummary) -> tuple[dict[str, bytes], str | None]:
    """The diagnosis's picture (`DIAGNOSIS_TITLES`), or why there is none."""
    why = unavailable()
    if why is not None:
        return {}, why
    try:
        return {"gaps": png_of(lambda ax: _gaps(ax, diagnosis))}, None
    except (TypeError, ValueError, KeyError) as e:  # figures edited by hand cost their picture, not the report
        return {}, f"the diagnosis's figures do not draw ({type(e).__name__}: {e})"


def _gaps(ax: Axes, d: DiagnosisSummary) -> None:
    """One row per cause, then one per replica under "weights": a bar from the axis's floor to the
    gap, the threshold a black tick across it. A gap of 0 sits at the floor, an infinite one (the
    greedy tokens parted, a NaN served) runs to the right edge, marked "inf"."""
    rows = [(f.cause, f.gap, f.threshold, f.verdict) for f in d.findings]
    rows += [
        (f"weights: {r.replica}", r.max_abs, d.numerics_band, "CAUSE" if r.blamed else "within") for r in d.replicas
    ]
    finite = [x for _, g, t, _ in rows for x in (g, t) if x is not None and 0 < x < math.inf]
    floor = min(finite, default=1e-3) / BELOW
    ceiling = max(finite, default=1.0) * BELOW
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    def say(text: str, x: float, y: int, right: bool = False) -> None:
        at = (-4 if right else 4, 0)
        ax.annotate(text, (x, y), xytext=at, textcoords="offset points", ha="right" if right else "left", va="center")

    for y, (_, gap, threshold, verdict) in enumerate(rows):
        if gap is None:
            say("not measured", floor, y)
        elif gap == 0:
            say("0", floor, y)
        else:
            end = ceiling if gap == math.inf or math.isnan(gap) else max(gap, floor)
            ax.barh(y, end - floor, left=floor, height=0.6, color=DIAGNOSIS_COLOURS[verdict])
            if end == ceiling:
                say(str(gap), ceiling, y, right=True)
        ax.plot([threshold, threshold], [y - 0.4, y + 0.4], color="black", linewidth=1.5)
    ax.set_xscale("log")
    ax.set_xlim(floor, ceiling)
    ax.set_yticks(range(len(rows)), [name for name, _, _, _ in rows])
    ax.invert_yaxis()
    ax.set(xlabel="max |Δlogprob|", title="where the gap comes from")
    shown = dict.fromkeys(v for _, g, _, v in rows if g)  # the verdicts a bar is drawn for, in order
    handles = [Patch(color=DIAGNOSIS_COLOURS[v], label=v.lower()) for v in shown]
    tick = Line2D([], [], color="black", label="threshold")
    ax.legend(handles=[*handles, tick], fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
