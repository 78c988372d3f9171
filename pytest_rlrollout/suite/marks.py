"""The suite's marks under short names, declared once for the conformance modules and for tests
of one's own (`from pytest_rlrollout.suite.marks import clause, requires`); the plugin registers
them (`pytest --markers`)."""

import pytest

clause = pytest.mark.rl_clause  # clause("SWAP-ASYNC-1", ...): the contract clauses a test judges
requires = pytest.mark.rl_requires  # requires("logprobs", "transition:SYNC"): what the deployment must offer
swaps = pytest.mark.rl_swaps  # the test changes what is served (implied by the rl_swap fixture)
breaks = pytest.mark.rl_breaks  # the test may leave the deployment unable to serve: it runs last
