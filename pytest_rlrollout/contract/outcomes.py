"""The outcome vocabulary every verdict uses: the validator's per-clause outcomes, the suite's
per-test outcomes and the report's per-clause roll-up."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNSUPPORTED = "unsupported"  # the deployment lacks an optional capability
    NOT_APPLICABLE = "not-applicable"  # the clause does not apply (a dense model, another snapshot kind)
    INCONCLUSIVE = "inconclusive"  # the observation could not be made; never silently a pass
    ERROR = "error"  # the suite itself broke

    @property
    def severity(self) -> int:
        """Lower is more telling: when several observations judge one clause, the lowest wins."""
        return SEVERITY.index(self)


SEVERITY: tuple[Outcome, ...] = (
    Outcome.ERROR,
    Outcome.FAIL,
    Outcome.INCONCLUSIVE,
    Outcome.UNSUPPORTED,
    Outcome.NOT_APPLICABLE,
    Outcome.PASS,
)
# Outcomes that say why a clause was not judged; each comes with a reason.
UNJUDGED: tuple[Outcome, ...] = (Outcome.NOT_APPLICABLE, Outcome.UNSUPPORTED, Outcome.INCONCLUSIVE)


def worst(*outcomes: Outcome) -> Outcome:
    return min(outcomes, key=lambda o: o.severity)


def roll_up(outcomes: list[Outcome]) -> Outcome:
    """One clause's outcome from its tests': the worst among the tests that judged it. A test with
    nothing to judge on this deployment (a variant that does not apply, an optional feature it
    lacks: LoRA on an engine without it) counts only when no test judged the clause; a test that
    could not make its observation (inconclusive) always counts."""
    judged = [o for o in outcomes if o not in (Outcome.NOT_APPLICABLE, Outcome.UNSUPPORTED)]
    return worst(*(judged or outcomes))


@dataclass(frozen=True)
class Verdict:
    """One clause's outcome and why (the reason is empty for a plain pass)."""

    outcome: Outcome
    reason: str = ""
