"""How a command ends: the exit codes every `rlrollout` command shares, and the usage error."""

from __future__ import annotations

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
# The command itself failed: `validate`'s validator (never 1: a crash is not a verdict on the
# snapshot, and a CI gate must not read a bug as "the exporter is broken"), or `serve`'s stop,
# which hung. One line on stderr, never a traceback.
EXIT_INTERNAL = 3
# What a shell reports for a writer killed by SIGPIPE (128 + 13). Chosen over 0 because output
# cut short is not success (`rlrollout validate DIR | head` must not read as "valid" under
# `set -o pipefail`), and over 1/2 because those mean findings / usage errors here.
EXIT_BROKEN_PIPE = 141
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
PYTEST_INTERRUPTED = 2  # pytest.ExitCode.INTERRUPTED, without importing pytest


def pytest_status(code: int) -> int:
    """A pytest run's exit status as a command's (`conformance`, `soak`): pytest's own (0 passed,
    1 failed, 4 usage error, 5 nothing collected), but an interrupted run (Ctrl-C, SIGTERM) ends
    130 as every interrupted command does, not 2, which here reads as a usage error."""
    return EXIT_INTERRUPTED if code == PYTEST_INTERRUPTED else code


class UsageError(Exception):
    """A command-line mistake the user can fix: one line on stderr, exit 2."""
