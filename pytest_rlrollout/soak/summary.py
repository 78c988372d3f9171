"""A soak's result as the suite's report shows it (`suite.report.soak.SoakSummary`): rows of
figures, one row per swap, and the series the pictures draw."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from pytest_rlrollout.soak.figures import BIN, Latencies, Served
from pytest_rlrollout.suite.report.fields import Scalar
from pytest_rlrollout.suite.report.soak import SoakReplica, SoakSummary, SoakSwap

if TYPE_CHECKING:
    from pytest_rlrollout.soak.run import Result, Swap


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def summary(result: Result) -> SoakSummary:
    f, s = result.figures, result.settings
    served = [w.served_at - w.signalled_at for w in result.swaps if w.served_at is not None]
    rows: list[tuple[str, Scalar]] = [
        ("seconds", round(result.seconds, 1)),
        ("transition", result.transition),
        ("rollouts in flight (users)", s.users),
        ("Locust workers", s.workers or "one process"),
        ("swaps", len(result.swaps)),
        ("sessions", len(f.sessions)),
        ("turns", f.turns),
        ("tokens", f.tokens),
        ("tokens/s", round(f.tokens / result.seconds, 1) if result.seconds else None),
        ("time to first token p50 (ms)", _ms(f.ttft.quantile(0.5))),
        ("time to first token p99 (ms)", _ms(f.ttft.quantile(0.99))),
        ("inter-chunk gap p50 (ms)", _ms(f.gap.quantile(0.5))),
        ("inter-chunk gap p99 (ms)", _ms(f.gap.quantile(0.99))),
        ("signal to every replica serving, median (s)", round(statistics.median(served), 3) if served else None),
        ("signal to every replica serving, max (s)", round(max(served), 3) if served else None),
        *((f"errors: {kind}", n) for kind, n in sorted(f.errors.items())),
        ("turns counted by the workers", result.summed().turns if result.workers else None),
    ]
    swaps = tuple(_swap(w, f.stall.get(w.epoch)) for w in result.swaps)
    series = {
        "tokens_per_s": rates(f.per_second, result.seconds),
        **{
            f"{name}_{q}": tuple((b * BIN, lat.quantile(p) or 0.0) for b, lat in sorted(by.items()))
            for name, by in (("ttft", f.ttft_at), ("gap", f.gap_at))
            for q, p in (("p50", 0.5), ("p99", 0.99))
        },
    }
    return SoakSummary(tuple(rows), swaps, series, replicas=replicas(result))


def replicas(result: Result) -> tuple[SoakReplica, ...]:
    """Each replica the answers named, with what it served and how its fingerprint moved (a
    replica that served no turn but was fingerprinted is there too)."""
    names = sorted(result.figures.replicas.keys() | {r for w in result.swaps for r in w.moved})
    out = []
    for name in names:
        served = result.figures.replicas.get(name, Served())
        moves = [w.moved[name] for w in result.swaps if name in w.moved]
        out.append(
            SoakReplica(
                name,
                served.turns,
                served.tokens,
                sum(served.errors.values()),
                served.ttft.quantile(0.5),
                served.ttft.quantile(0.99),
                served.gap.quantile(0.99),
                len(moves),
                sum(d > result.tolerance for d in moves),
                min(moves, default=None),
            )
        )
    return tuple(out)


def _swap(w: Swap, stall: Latencies | None) -> SoakSwap:
    served = None if w.served_at is None else round(w.served_at, 3)
    moved = min(w.moved.values()) if w.moved else None
    if stall is None or not stall.count:
        return SoakSwap(
            w.epoch, w.identity, w.kind, w.reset, round(w.signalled_at, 3), served, moved=moved, error=w.error
        )
    return SoakSwap(
        w.epoch,
        w.identity,
        w.kind,
        w.reset,
        round(w.signalled_at, 3),
        served,
        stall.count,
        stall.quantile(0.5),
        stall.quantile(0.99),
        stall.max,
        moved,
        w.error,
    )


def rates(per_second: dict[int, int], seconds: float) -> tuple[tuple[float, float], ...]:
    """Tokens/s per BIN-second bin; the last bin over the part of it the soak lasted (a soak of
    62 s ends on a 2-second bin, which over 5 s would read as a collapse)."""
    binned: dict[int, int] = {}
    for second, n in per_second.items():
        binned[second // BIN] = binned.get(second // BIN, 0) + n
    return tuple((b * BIN, n / min(BIN, max(seconds - b * BIN, 1.0))) for b, n in sorted(binned.items()))
