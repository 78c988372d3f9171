"""How a command ends: the exit codes every `rlrollout` command shares, and the usage error."""

from __future__ import annotations

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
# `validate` only: the validator itself failed. Never 1: a crash is not a verdict on the snapshot
# (a CI gate must not read a bug as "the exporter is broken"), and never a traceback.
EXIT_INTERNAL = 3
# What a shell reports for a writer killed by SIGPIPE (128 + 13). Chosen over 0 because output
# cut short is not success (`rlrollout validate DIR | head` must not read as "valid" under
# `set -o pipefail`), and over 1/2 because those mean findings / usage errors here.
EXIT_BROKEN_PIPE = 141
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


class UsageError(Exception):
    """A command-line mistake the user can fix: one line on stderr, exit 2."""
