"""`python -m pytest_rlrollout.cli`: the `rlrollout` command run from a checkout (as the tests do)."""

from pytest_rlrollout.cli import program

program()
