"""The model's numbers and records as text, worded once for every writer (Markdown, HTML, the
terminal): figures, sizes, uploads, the NUM figures' rows."""

from __future__ import annotations

import contextlib
from typing import Any

from pytest_rlrollout.contract import SEVERITY, Outcome
from pytest_rlrollout.suite.report.diagnosis import CauseFinding, DiagnosisSummary, ReplicaWeights
from pytest_rlrollout.suite.report.fields import Scalar
from pytest_rlrollout.suite.report.model import NumericsTest, NumFigures, Upload
from pytest_rlrollout.suite.report.soak import SoakReplica, SoakSwap

# Outcomes as the tables list them: the plain pass first, the most telling last.
OUTCOMES: tuple[Outcome, ...] = tuple(reversed(SEVERITY))

FOLD = 3  # a provenance list longer than this is folded (a live run uploads dozens of identities)

NUMERICS_INTRO = (
    "The deployment's logprobs and routing for tokens it sampled, against a local forward pass of the "
    "same weights (Δlogprob = local − served)."
)

# FID's few figures, as the report names them (other keys are shown as spelt)
FIGURE_LABELS = {
    "max_abs_delta": "max |Δ|",
    "min_abs_delta": "min |Δ|",
    "tolerance": "tolerance",
    "changed_weights_delta": "changed weights moved",
    "swap_moved": "the swap moved",
    "concurrent_streams": "concurrent streams",
}


def number(value: Any, spec: str = ".3g") -> str:
    """A figure as text; what is not a number of the kind `spec` formats (a report edited by
    hand) as it is."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            return format(value, spec)
    return str(value)


def one_line(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    text = " ".join(text.split())
    return text[: limit - 1] + "…" if len(text) > limit else text


def measures_note(measures: dict[str, Scalar]) -> str:
    """A test's few figures on one line (FID's max |Δ| and tolerance)."""
    return ", ".join(f"{FIGURE_LABELS.get(k, k.replace('_', ' '))} {number(v)}" for k, v in measures.items())


def size(n: Any) -> str:
    """Bytes in binary units (1.5 MiB)."""
    if not isinstance(n, int | float) or isinstance(n, bool):
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def plan_figure(key: str, n: int) -> str:
    """One figure of a plan (counts as they are, bytes in binary units)."""
    return str(n) if key in ("swaps", "built") else size(n)


UPLOAD_HEADS = (
    "snapshot",
    "kind",
    "uploaded",
    "copied in the bucket",
    "linked in the bucket",
    "written here",
    "of a full snapshot",
)


def upload_cells(u: Upload) -> tuple[str, ...]:
    """What building one snapshot cost, as `UPLOAD_HEADS` name the cells."""
    return (
        u.identity,
        u.kind,
        size(u.uploaded),
        size(u.copied),
        size(u.linked),
        size(u.written),
        number(u.of_full, ".2%"),
    )


def numerics_rows(num: NumFigures) -> list[tuple[str, str]]:
    """The NUM figures of one test as (figure, value) rows: the R3 paper's mismatch figures."""
    f = num.figures
    rows = [
        ("tokens compared", number(f.tokens, "d")),
        ("mean |Δlogprob|", number(f.mean_abs)),
        ("max |Δlogprob|", number(f.max_abs)),
        ("k3 KL(served‖local)", number(f.k3_kl)),
        ("ratio outside [0.5, 2]", number(f.ratio_outside, ".3%")),
    ]
    if f.route_agreement is not None:
        rows += [
            (
                "routing agreement",
                f"{number(f.route_agreement, '.3%')} of (layer, token) over {number(f.route_tokens, 'd')} tokens",
            ),
            ("tokens with any layer disagreeing", number(f.any_disagreement, ".3%")),
            ("agreement per MoE layer", " ".join(number(a, ".1%") for a in f.layer_agreement or [])),
        ]
        if num.alignment:
            rows.append(("routing alignment", str(num.alignment)))
    return rows


def numerics_grid(tests: list[NumericsTest]) -> list[tuple[str, list[str]]]:
    """The NUM figures of several tests side by side: (figure, its value in each test) rows."""
    columns = [dict(numerics_rows(t.figures)) for t in tests]
    labels = dict.fromkeys(label for c in columns for label in c)
    return [(label, [c.get(label, "") for c in columns]) for label in labels]


SOAK_INTRO = (
    "Simulated agentic rollouts on Locust at concurrency while a trainer swapped snapshots in; every turn "
    "and swap was judged by the clauses above (the SOAK tests). A stall is the longest gap between two "
    "chunks of a stream across the swap."
)
SOAK_SWAP_HEADS = (
    "swap",
    "snapshot",
    "kind",
    "reset",
    "signalled (s)",
    "served (s)",
    "streams across",
    "stall p50 (ms)",
    "stall p99 (ms)",
    "stall max (ms)",
    "fingerprint moved",
)


SOAK_REPLICA_HEADS = (
    "replica",
    "turns",
    "tokens",
    "errors",
    "first token p50 (ms)",
    "first token p99 (ms)",
    "gap p99 (ms)",
    "fingerprint moved",
    "least move",
)


def ms(x: float | None) -> str:
    return "" if x is None else number(x * 1000, ".4g")


def soak_replica_cells(r: SoakReplica) -> tuple[str, ...]:
    moved = f"{r.moved} of {r.fingerprinted} swaps" if r.fingerprinted else ""
    return (
        r.name,
        str(r.turns),
        str(r.tokens),
        str(r.errors),
        ms(r.ttft_p50),
        ms(r.ttft_p99),
        ms(r.gap_p99),
        moved,
        "" if r.least_moved is None else number(r.least_moved),
    )


def soak_swap_cells(s: SoakSwap) -> tuple[str, ...]:
    served = (s.error or "never") if s.served_at is None else number(s.served_at, ".4g")
    return (
        str(s.epoch),
        s.identity,
        s.kind,
        s.reset,
        number(s.signalled_at, ".4g"),
        served,
        str(s.streams),
        ms(s.stall_p50),
        ms(s.stall_p99),
        ms(s.stall_max),
        "" if s.moved is None else number(s.moved),
    )


DIAGNOSIS_INTRO = (
    "Where the gap between the trainer's logprobs and the deployment's comes from, each cause measured on its "
    "own with the others held still: the weights (every replica scores the canary fresh, uncached and alone), "
    "the prompt cache (the canary continued through the shared cache against the same under an unused isolation "
    "key), batching (alone against beside concurrent streams) and the decode path (logprobs reported while "
    "decoding against the echo of the same tokens). What remains is the numerics of the served precision, "
    "reported and never blamed. A replica serves other weights when its gap to the trainer is past the numerics "
    "band, or when it stands apart from the replica closest to the trainer by more than the self tolerance."
)
DIAGNOSIS_HEADS = ("cause", "max |Δ|", "threshold", "verdict", "measured")
DIAGNOSIS_REPLICA_HEADS = ("replica", "label", "max |Δ| to the trainer", "mean |Δ|", "at canary token", "verdict")


def diagnosis_thresholds(d: DiagnosisSummary) -> str:
    """The two thresholds and what each judges, in one sentence."""
    return (
        f"The deployment against itself (prompt cache, batching, decode path) within {number(d.self_tolerance)} "
        f"(the run's fingerprint tolerance); the weights against the trainer's numbers ({d.source}, "
        f"{d.tokens} tokens) within {number(d.numerics_band)} (the numerics of the precision served or declared). "
        f"{d.requests} requests, {number(d.seconds, '.1f')} s."
    )


def diagnosis_cells(f: CauseFinding) -> tuple[str, ...]:
    return (f.cause, "-" if f.gap is None else number(f.gap), number(f.threshold), f.verdict, f.detail)


def diagnosis_replica_cells(r: ReplicaWeights) -> tuple[str, ...]:
    verdict = "other weights" if r.blamed else "the trainer's weights"
    return (r.replica, r.label or "", number(r.max_abs), number(r.mean_abs), str(r.worst_token), verdict)


def diagnosis_verdict(d: DiagnosisSummary) -> str:
    blamed = d.blamed
    return f"The gap comes from: {', '.join(blamed)}." if blamed else "No cause past its threshold but numerics."
