"""pytest-rlrollout: prove an RL-rollout hot-load deployment honours its contract.

The products, one package each: `contract` (the clause catalogue, schemas, outcome vocabulary),
`snapshot` (the exporter gate: formats, builders, the validator), `reference` (the bundled
reference deployment), `remote` (the client for a deployment under test, cassettes) and
`suite` (the pytest plugin and the conformance tests).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:  # what a type checker sees (py.typed); at run time each loads on first use
    from pytest_rlrollout.contract import Clause as Clause
    from pytest_rlrollout.contract import Outcome as Outcome
    from pytest_rlrollout.contract import catalogue as catalogue
    from pytest_rlrollout.reference import reference_deployment as reference_deployment
    from pytest_rlrollout.remote.drivers import Driver as Driver
    from pytest_rlrollout.remote.replicas import Waited as Waited
    from pytest_rlrollout.remote.replicas import WaitEnd as WaitEnd
    from pytest_rlrollout.remote.stream import Stream as Stream
    from pytest_rlrollout.remote.target import Target as Target
    from pytest_rlrollout.runs.diagnose import Diagnose as Diagnose
    from pytest_rlrollout.runs.diagnose import Diagnosis as Diagnosis
    from pytest_rlrollout.runs.diagnose import Expected as Expected
    from pytest_rlrollout.runs.weight_sync import ReplicaSync as ReplicaSync
    from pytest_rlrollout.runs.weight_sync import SyncResult as SyncResult
    from pytest_rlrollout.runs.weight_sync import WeightSync as WeightSync
    from pytest_rlrollout.runs.weight_sync import WeightSyncError as WeightSyncError
    from pytest_rlrollout.runs.weight_sync import score_canary as score_canary
    from pytest_rlrollout.snapshot.validate import Finding as Finding
    from pytest_rlrollout.snapshot.validate import Report as Report
    from pytest_rlrollout.snapshot.validate import validate as validate
    from pytest_rlrollout.suite.deployment import RLDeployment as RLDeployment
    from pytest_rlrollout.suite.holding import RLTest as RLTest
    from pytest_rlrollout.suite.outcomes import (
        inconclusive as inconclusive,
    )
    from pytest_rlrollout.suite.outcomes import (
        not_applicable as not_applicable,
    )
    from pytest_rlrollout.suite.outcomes import (
        unsupported as unsupported,
    )
    from pytest_rlrollout.suite.run_config import RLConfig as RLConfig


# Loaded on first use so the pytest plugin stays cheap to import.
_EXPORTS = {
    "Clause": "pytest_rlrollout.contract",
    "catalogue": "pytest_rlrollout.contract",
    "Outcome": "pytest_rlrollout.contract",
    "Finding": "pytest_rlrollout.snapshot.validate",
    "Report": "pytest_rlrollout.snapshot.validate",
    "validate": "pytest_rlrollout.snapshot.validate",
    "reference_deployment": "pytest_rlrollout.reference",
    # for tests of one's own: the fixtures' types, the outcome helpers, the driver protocol
    "RLDeployment": "pytest_rlrollout.suite.deployment",
    "RLTest": "pytest_rlrollout.suite.holding",
    "RLConfig": "pytest_rlrollout.suite.run_config",
    "not_applicable": "pytest_rlrollout.suite.outcomes",
    "unsupported": "pytest_rlrollout.suite.outcomes",
    "inconclusive": "pytest_rlrollout.suite.outcomes",
    "Driver": "pytest_rlrollout.remote.drivers",
    "Stream": "pytest_rlrollout.remote.stream",
    "Target": "pytest_rlrollout.remote.target",
    "Waited": "pytest_rlrollout.remote.replicas",
    "WaitEnd": "pytest_rlrollout.remote.replicas",
    # for a trainer's loop: the per-step weight-sync check, and where a logprob gap comes from
    "WeightSync": "pytest_rlrollout.runs.weight_sync",
    "SyncResult": "pytest_rlrollout.runs.weight_sync",
    "ReplicaSync": "pytest_rlrollout.runs.weight_sync",
    "WeightSyncError": "pytest_rlrollout.runs.weight_sync",
    "score_canary": "pytest_rlrollout.runs.weight_sync",
    "Expected": "pytest_rlrollout.runs.diagnose",
    "Diagnose": "pytest_rlrollout.runs.diagnose",
    "Diagnosis": "pytest_rlrollout.runs.diagnose",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pytest_rlrollout' has no attribute {name!r}")
