"""`python -m pytest_rlrollout.cli`: the `rlrollout` command run from a checkout (as the tests do)."""

import sys

from pytest_rlrollout.cli import main

sys.exit(main())
