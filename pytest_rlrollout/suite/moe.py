"""The `rl_moe` fixture: whether the served model is MoE and routing can be asked for, and its
shape, which the R3 clauses judge routing matrices by.

The gate reads the served config (`--rl-base-snapshot`) and the capability probes: a dense model
makes the test not-applicable; an MoE model whose engine returns routing behind a server flag
it was not given, unsupported; one that returns no routing at all fails the test (in its call,
as a finding about the deployment). Without the config, only the tests that need the shape are
inconclusive (`MoE.needed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from pytest_rlrollout.contract.capabilities import CAPABILITIES
from pytest_rlrollout.contract.moe import moe_shape
from pytest_rlrollout.suite.holding import fail_in_call
from pytest_rlrollout.suite.outcomes import inconclusive, not_applicable, unsupported

if TYPE_CHECKING:
    from pytest_rlrollout.runs.snapshots import Op
    from pytest_rlrollout.suite.deployment import RLDeployment
    from pytest_rlrollout.suite.swaps import Swapper


@dataclass(frozen=True)
class MoE:
    """The served MoE model, as far as the run knows it."""

    shape: tuple[int, int, int] | None  # (L layers, k experts per token, E experts) when the served config is known

    def needed(self) -> tuple[int, int, int]:
        """(L, k, E); inconclusive where the served config is unknown."""
        if self.shape is None:
            inconclusive(
                "judging routing matrices needs the MoE shape (L, k, E) from the served config.json: "
                "pass --rl-base-snapshot"
            )
        return self.shape


@dataclass(frozen=True)
class RouterChange:
    """A change to the routers of the first and the last MoE layer (`SnapshotFactory.router_change`),
    and which rows of a routing matrix show it."""

    layers: list[int]  # the changed routers' layer numbers
    rows: list[int]  # their rows in a routing matrix of L rows
    change: dict[str, Op]  # what the swap carries


def router_change(rl_deployment: RLDeployment, rl_swap: Swapper, layers: int) -> RouterChange:
    """The routers of the first and the last MoE layer negated (top-k becomes bottom-k), or an
    earlier negation undone, for matrices of `layers` rows; inconclusive where the base snapshot
    has no router to change, or the routers' layers cannot be told apart in the matrices."""
    by_layer = rl_swap.factory.routers_by_layer
    if not by_layer:
        inconclusive("no router tensors (…mlp.gate.weight) found in the base snapshot to change")
    ends = sorted({min(by_layer), max(by_layer)})
    moe_layers = sorted(by_layer)
    # a matrix has one row per MoE layer: where every layer is one, a layer's row is its rank
    rows = [moe_layers.index(n) for n in ends] if len(moe_layers) == layers else ends
    if max(rows) >= layers:
        inconclusive(f"the routers are in layers {moe_layers[:5]}…, but routing matrices have {layers} rows")
    return RouterChange(ends, rows, rl_swap.factory.router_change(rl_deployment.serving()))


@pytest.fixture
def rl_moe(rl_deployment: RLDeployment, request: pytest.FixtureRequest) -> MoE:
    """The served model is MoE and routing can be asked for (else the test is not-applicable,
    unsupported, or fails naming the missing routing); its shape where the config is known."""
    config = rl_deployment.base_config
    routes = rl_deployment.capabilities.has("routing_matrix")
    if config is None:
        if not routes:
            inconclusive(
                "no routing_matrix in any answer, and without the served config.json a dense model (R3 "
                "not applicable) cannot be told from an MoE one (R3 fails): pass --rl-base-snapshot"
            )
        return MoE(None)
    s = moe_shape(config)
    if s is None:
        not_applicable("the served model is dense (its config.json declares no experts)")
    if not routes:
        seen = rl_deployment.capabilities.seen.get("routing_matrix", "")
        flag = CAPABILITIES["routing_matrix"].flag(rl_deployment.engine)
        if flag is not None:  # the engine routes behind a server flag: a server without it lacks a feature
            unsupported(
                f"the served model is MoE and the deployment returns no routing ({seen}); "
                f"{rl_deployment.engine} returns it with {flag}"
            )
        fail_in_call(
            request.node,
            f"the served model is MoE ({s.experts} experts, {s.k} per token) and the "
            f"deployment returns no routing_matrix ({seen})",
        )
    return MoE((s.layers, s.k, s.experts))
