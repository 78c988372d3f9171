"""The `rl_dated_crossing` fixture: the stream across a shared swap, with what dates its tokens.

A stream whose chunks say their policy version as they come is dated by them. One whose engine
says versions only as spans once the stream ended (`Reading.spans_only`) dates its tokens by
their index, and an engine that sends chunks late delivers tokens it generated before the swap
after it: arrival dates nothing there. The tokens' own numbers do: the default share's swap
moves every logit (`shared.share_for`), so the first token scored unlike the same greedy request
under the old weights was generated after the swap. That request, sent alone before the swap,
is the part `GREEDY_BEFORE` of the share (registered here, when the plugin loads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_rlrollout.suite.crossing import crossing_body
from pytest_rlrollout.suite.shared import CROSSING, part

if TYPE_CHECKING:
    from pytest_rlrollout.suite.crossing import Crossing
    from pytest_rlrollout.suite.deployment import RLDeployment
    from pytest_rlrollout.suite.shared import Share, SharedSwaps

GREEDY_BEFORE = "crossing-greedy"  # the part: the crossing stream's request, alone before the swap


def greedy_before(rl_deployment: RLDeployment, name: str) -> list[dict[str, Any]]:
    """The crossing stream's request, alone before the swap: its logprobs entries under the old
    weights (not streamed: without the stream's options, which a server may refuse on a plain
    request)."""
    body = {k: v for k, v in crossing_body(rl_deployment, name).items() if k != "stream_options"}
    return rl_deployment.complete(body).expect_ok("the same greedy request before the swap").entries


part(GREEDY_BEFORE, greedy_before, lambda _, before, __: before)


def dated_crossing(
    rl_deployment: RLDeployment, rl_shared: SharedSwaps, share: Share
) -> tuple[Crossing, list[dict[str, Any]] | None]:
    """The stream across `share`'s swap, and the same greedy request's logprobs entries under the
    old weights where the engine dates tokens by spans only and logprobs can be read (else None)."""
    by_numbers = rl_deployment.driver.reading.spans_only and rl_deployment.capabilities.has("logprobs")
    seen = rl_shared.parts(share, [CROSSING, GREEDY_BEFORE] if by_numbers else [CROSSING])
    return seen[CROSSING], seen.get(GREEDY_BEFORE)


@pytest.fixture
def rl_dated_crossing(
    rl_deployment: RLDeployment, rl_shared: SharedSwaps
) -> Callable[[Share], tuple[Crossing, list[dict[str, Any]] | None]]:
    """`rl_dated_crossing(share)`: the stream kept across the share's swap (`Crossing`), and what
    dates its tokens where its chunks do not: the logprobs entries of the same greedy request
    sent alone before the swap (None where the chunks date themselves, or carry no logprobs).
    The test names the parts in its `rl_shares` mark: `CROSSING, GREEDY_BEFORE`."""
    return lambda share: dated_crossing(rl_deployment, rl_shared, share)
