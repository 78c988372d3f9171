"""The `rl_soak_summary` fixture: a soak's figures carried to the report, where its soak section
(figures, swaps, pictures) is drawn from them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_rlrollout.suite.report.model import SoakSummary


@pytest.fixture
def rl_soak_summary(request: pytest.FixtureRequest) -> Callable[[SoakSummary], None]:
    """`rl_soak_summary(summary)` carries a soak's summary (`soak.summary.summary(result)`) on the
    test's report: the run's report shows it (one soak per run: the last one carried is shown)."""

    from pytest_rlrollout.suite.reporting import SOAK_PROPERTY  # (the report's collector: not at plugin load)

    def carry(summary: SoakSummary) -> None:
        # a user property: it crosses xdist's transport to the controller's report with the test's report
        request.node.user_properties.append((SOAK_PROPERTY, json.dumps(summary.to_json())))

    return carry
