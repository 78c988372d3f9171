"""The snapshot validator: every SNAP clause as a registered check, run offline (the exporter
gate) or at hot-load time (the reference deployment).

    report = validate("out/step-0042", base="snapshots/base")
    report.ok("MUST"), report.findings, report.verdicts["SNAP-INDEX-2"]

Snapshots are untrusted input: hostile files become findings in bounded time and memory (the
bounds: `core`'s docstring, `rlrollout validate --help`).
"""

# The check modules register their checks with core's registry when imported.
from pytest_rlrollout.snapshot.validate import config, files, incremental, index, lora, weights  # noqa: F401
from pytest_rlrollout.snapshot.validate.config import config_differences
from pytest_rlrollout.snapshot.validate.core import (
    CHECKS,
    Context,
    Finding,
    Report,
    load_signal,
    signal_findings,
    validate,
)

__all__ = ["CHECKS", "Context", "Finding", "Report", "config_differences", "load_signal", "signal_findings", "validate"]
