"""What a snapshot must pass before any replica loads it, whichever wire asked for the load (a
Fireworks hot-load signal or vLLM's reload_weights): the project's validator, every SNAP MUST
clause, in its child process; and the one place where fault switches weaken that check."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.reference import validator
from pytest_rlrollout.reference.settings import Settings
from pytest_rlrollout.reference.validator import ValidatorFailed
from pytest_rlrollout.snapshot.validate import Context, Finding

log = logging.getLogger(__name__)


class HotLoadError(Exception):
    """A load refused (or a signal judged wrong): the HTTP status, a message, and extra fields
    of the error body (`clauses`: the clauses the refusal is about)."""

    def __init__(self, status: int, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


class LoadInProgress(HotLoadError):
    """A signal while another load is still in progress (409 on the Fireworks wire)."""


@dataclass(frozen=True)
class Admission:
    """A snapshot the deployment will load."""

    kind: str  # full, incremental or lora: what the validator found the directory to be
    # the HL-POST-5a fault: the refusals the load then fails on, after the load was accepted
    deferred: list[Finding]
    # a SNAP fault switch let a violation through: a load it breaks is "recovered" by keeping
    # the old weights under the new identity (a swallowed error)
    swallow: bool


def finding(clause: str, message: str) -> Finding:
    return Finding(clause, catalogue()[clause].level, "signal", message)


def admit(settings: Settings, path: Path, ctx: Context) -> Admission:
    """Validate the snapshot at `path` (the signal and what is served in `ctx`); HotLoadError 400
    naming the clauses it violates. Whatever the validator raises is a refusal, never a 500."""
    f = settings.fault
    # In a process of its own: a hostile snapshot's headers hold the GIL for as long as they
    # take to parse, which a thread would not spare the event loop and the replicas
    try:
        report = validator.shared().validate(path, ctx, settings.validate_timeout)
        failures = report.failures("MUST")
    except ValidatorFailed as e:
        raise HotLoadError(400, f"snapshot {ctx.identity} could not be validated: {e}") from None
    except Exception as e:
        log.exception("validating %s failed", path)
        raise HotLoadError(400, f"snapshot {ctx.identity} could not be validated ({type(e).__name__})") from None
    refused = [x for x in failures if not f(x.clause)]
    let_through = [x for x in failures if f(x.clause) and x.clause.startswith("SNAP-")]
    # each switch is asked about only where it changes the answer: the mutation matrix runs a
    # switch's row on the tests that read it (tests/suite/test_mutation_matrix.py)
    if any(x.clause == "SNAP-CONFIG-2" for x in refused) and f("HL-CONFIG-1"):
        refused = [
            finding(x.clause, "config differs from the base model") if x.clause == "SNAP-CONFIG-2" else x
            for x in refused
        ]
    deferred = refused if refused and f("HL-POST-5a") else []
    if refused and not (f("HL-POST-5") or f("HL-POST-5a")):
        raise HotLoadError(
            400, "; ".join(str(x) for x in refused[:8])[:4000], clauses=sorted({x.clause for x in refused})
        )
    return Admission(report.kind, deferred, bool(let_through))
