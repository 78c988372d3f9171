"""The suite's marks under short names, declared once for the conformance modules and for tests
of one's own (`from pytest_rlrollout.suite.marks import clause, requires`); the plugin registers
them (`pytest --markers`)."""

import pytest

__all__ = ["breaks", "clause", "loads", "loads_from", "requires", "swaps"]

clause = pytest.mark.rl_clause  # clause("SWAP-ASYNC-1", ...): the contract clauses a test judges
requires = pytest.mark.rl_requires  # requires("logprobs", "transition:SYNC"): what the deployment must offer
swaps = pytest.mark.rl_swaps  # the test changes what is served (implied by the rl_swap fixture)
breaks = pytest.mark.rl_breaks  # the test may leave the deployment unable to serve: it runs last
loads = pytest.mark.rl_loads  # loads(served(), refused(config="scaled")): what a state-changing test loads (runs.plan)


def loads_from(declare):
    """`rl_loads` given by a function of the deployment (`runs.plan.Context` -> its `Load`s): a
    mark given one function alone would take it for the test it decorates."""
    return pytest.mark.rl_loads.with_args(declare)
