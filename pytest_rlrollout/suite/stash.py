"""What the plugin's hooks and the fixtures hand each other on pytest's stashes (a module of its
own: the plugin modules import it before pytest registers them, which would stop pytest from
rewriting their asserts)."""

from __future__ import annotations

import pytest

# (the names in quotes: remote.discovery.Discovery, suite.holding.RLTest; not imported, see above)
DISCOVERED = pytest.StashKey["Discovery"]()  # config: what the deployment is and offers
WORKER_DISCOVERY = "rl_discovery"  # the workerinput / workeroutput key that carries it across xdist
MISSING = pytest.StashKey[str]()  # item: why the test fails before it runs (a capability it must have)
RL_TEST = pytest.StashKey["RLTest"]()  # item: the test's hold on the deployment (its exchanges: its evidence)
