"""The contract: the clause catalogue, the JSON Schemas of its wire formats and files, and the
outcome vocabulary of every verdict. Everything else in the project reads these."""

from pytest_rlrollout.contract.catalogue import LEVELS, Catalogue, Clause, Level, catalogue
from pytest_rlrollout.contract.outcomes import SEVERITY, UNJUDGED, Outcome, Verdict, roll_up, worst

__all__ = [
    "LEVELS",
    "SEVERITY",
    "UNJUDGED",
    "Catalogue",
    "Clause",
    "Level",
    "Outcome",
    "Verdict",
    "catalogue",
    "roll_up",
    "worst",
]
