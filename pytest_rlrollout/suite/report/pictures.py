"""The NUM pictures of a report, each drawn for the clause it is about: NUM-LOGPROB-1 gets the
Δlogprob pictures, NUM-ROUTE-1 the routing one. Drawing is `numerics.pictures`' (matplotlib,
optional); this picks what each clause shows and keeps a test whose figures do not draw from
costing the others theirs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pytest_rlrollout.numerics.figures import Figures
from pytest_rlrollout.numerics.pictures import pictures, unavailable
from pytest_rlrollout.suite.report.model import Report

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
