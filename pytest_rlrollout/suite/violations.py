"""The `rl_violating_snapshot` fixture: a snapshot that breaks one SNAP MUST clause, uploaded and
ready to signal (HL-POST-5 signals it and judges that it is never served).

The broken variants (`snapshot.broken`) start from valid snapshots of the served model
(`rl_base_cases`). A variant that is an ARC2 diff against the base itself must diff a served
snapshot holding exactly the base: the deployment is swapped to a copy of the base first where
it serves anything else, and the diff is rebased on it. A variant that needs the chain started
over gets a ledger reset first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlrollout.snapshot import broken
from pytest_rlrollout.suite.outcomes import inconclusive

if TYPE_CHECKING:
    from pytest_rlrollout.runs.snapshots import Built, SnapshotFactory
    from pytest_rlrollout.snapshot.cases import ReferenceCases
    from pytest_rlrollout.suite.deployment import RLDeployment
    from pytest_rlrollout.suite.swaps import Swapper


def rebased(
    rl_deployment: RLDeployment, rl_swap: Swapper, cases: ReferenceCases, signal: dict[str, Any]
) -> dict[str, Any]:
    """`signal` with the diff's parent the served snapshot, once that holds exactly the base
    (swapped to a copy of the base where it did not); inconclusive where none could be served."""
    factory = rl_swap.factory
    served = rl_deployment.serving()
    if served is None or factory.record.overlays.get(served) != {}:
        rl_swap.signal(factory.base_copy("base-again"))
    serving = rl_deployment.serving()
    if serving is None or factory.record.overlays.get(serving) != {}:
        inconclusive("could not serve a snapshot equal to the base to diff against")
    meta = signal["incremental_snapshot_metadata"]
    if meta.get("previous_snapshot_identity") != cases.base.name:
        return signal
    return {**signal, "incremental_snapshot_metadata": {**meta, "previous_snapshot_identity": serving}}


def violating(
    rl_deployment: RLDeployment,
    rl_swap: Swapper,
    factory: SnapshotFactory,
    cases: ReferenceCases,
    violated: str,
    workdir: Path,
) -> Built:
    """The broken variant of clause `violated`, built under `workdir` and uploaded, with the
    deployment made ready for its signal (a served base to diff against, a ledger reset)."""
    case = broken.broken_case(violated, cases, workdir)
    signal = dict(case.signal or {})
    if broken.diffs_the_base(case, cases):
        signal = rebased(rl_deployment, rl_swap, cases, signal)
    if case.ledger_reset:
        if not 200 <= rl_deployment.reset_ledger().status_code < 300:
            inconclusive("this variant needs a ledger reset, and the reset failed (see HL-LEDGER-1)")
        factory.ledger_reset()
    return factory.copy_in(case.snapshot, violated.lower(), signal)


@pytest.fixture
def rl_violating_snapshot(
    rl_deployment: RLDeployment,
    rl_snapshot_factory: SnapshotFactory,
    rl_swap: Swapper,
    rl_base_cases: ReferenceCases | None,
    tmp_path: Path,
) -> Callable[[str], Built]:
    """`rl_violating_snapshot(clause_id)`: a snapshot breaking that SNAP MUST clause (one of
    `snapshot.broken.BREAKERS`), uploaded and ready to signal (`built.signal`); inconclusive
    where the deployment could not be made ready for it."""
    # None only without a snapshot factory, where rl_snapshot_factory made the test inconclusive first
    assert rl_base_cases is not None
    return lambda violated: violating(rl_deployment, rl_swap, rl_snapshot_factory, rl_base_cases, violated, tmp_path)
