"""The contract's outcome vocabulary in pytest terms.

A test that cannot judge its clause says why with `not_applicable`, `unsupported` or
`inconclusive` (a pytest skip whose reason starts with the outcome); failures and errors come
from pytest itself. `outcome_of` reads a test report back into the vocabulary.
"""

from __future__ import annotations

from typing import NoReturn

import pytest

from pytest_rlrollout.contract.outcomes import UNJUDGED, Outcome

# what a test calls; the rest is the plugin's and the report's
__all__ = ["inconclusive", "not_applicable", "unsupported"]

# rl_level = must turns a failure of SHOULD clauses into an xfail whose reason starts with this.
SHOULD_FAILURE = "rl-should-failure:"
# A test that failed by an exception other than an assertion about the deployment carries this
# user property: its outcome is `error` (the suite or a cassette broke), never `fail`.
SUITE_ERROR = "rl_suite_error"


def skip_as(outcome: Outcome, reason: str) -> NoReturn:
    pytest.skip(f"{outcome}: {reason}")


def not_applicable(reason: str) -> NoReturn:
    """End the test: its clause does not apply to this deployment (a dense model for R3), `reason` says why."""
    skip_as(Outcome.NOT_APPLICABLE, reason)


def unsupported(reason: str) -> NoReturn:
    """End the test: the deployment lacks an optional feature the clause needs, `reason` names it."""
    skip_as(Outcome.UNSUPPORTED, reason)


def inconclusive(reason: str) -> NoReturn:
    """End the test unjudged: what it needed to observe could not be observed (a precondition
    failed, the moment passed), `reason` says what; never a pass."""
    skip_as(Outcome.INCONCLUSIVE, reason)


def outcome_of(report: pytest.TestReport) -> tuple[Outcome, str]:
    """The outcome of one test phase, with its evidence (the failure's last lines, or the reason)."""
    if report.passed:
        return Outcome.PASS, ""
    if getattr(report, "wasxfail", "").startswith(SHOULD_FAILURE):  # judged, not counted (rl_level = must)
        return Outcome.FAIL, _tail(report.longreprtext)
    if report.skipped:
        # (path, line, reason); a report that crossed a JSON transport carries a list
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple | list) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        for typed in UNJUDGED:
            if reason.startswith(f"{typed}: "):
                return typed, reason[len(typed) + 2 :]
        return Outcome.INCONCLUSIVE, f"skipped without a typed outcome: {reason}"
    suite_broke = any(k == SUITE_ERROR for k, _ in report.user_properties)
    return (Outcome.FAIL if report.when == "call" and not suite_broke else Outcome.ERROR), _tail(report.longreprtext)


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
