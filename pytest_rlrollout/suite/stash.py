"""What the plugin's hooks and the fixtures hand each other on pytest's stashes (a module of its
own: the plugin modules import it before pytest registers them, which would stop pytest from
rewriting their asserts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # for the checker only: importing them here would defeat the module's purpose
    from pytest_rlrollout.remote.discovery import Discovery
    from pytest_rlrollout.suite.holding import RLTest

DISCOVERED: pytest.StashKey[Discovery] = pytest.StashKey()  # config: what the deployment is and offers
WORKER_DISCOVERY = "rl_discovery"  # the workerinput / workeroutput key that carries it across xdist
MISSING = pytest.StashKey[str]()  # item: why the test fails before it runs (a capability it must have)
# item: the test's hold on the deployment (its exchanges: its evidence)
RL_TEST: pytest.StashKey[RLTest] = pytest.StashKey()
