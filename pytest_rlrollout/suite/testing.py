"""The public surface for tests: what a conformance module, or a test of one's own, may import
from the suite beside its marks (`suite.marks`) and its outcomes (`suite.outcomes`:
`not_applicable`, `unsupported`, `inconclusive`). Anything else in `pytest_rlrollout.suite` is
the suite's own and may change; a test needs none of it. (tests/contract/test_conformance_imports.py
holds the conformance modules to this.)

The fixtures (the plugin registers them; `pytest --fixtures` describes each):
`rl_config` the run's settings; `rl_deployment` the deployment under test; `rl_observe` what the
test judged, and its timeline; `rl_session` a session's headers; `rl_swap` swap to a new
snapshot and wait; `rl_snapshot_factory` build and upload snapshots for the test;
`rl_snapshots` the run's snapshot factory (None without a bucket and a base);
`rl_base_cases` valid snapshots of the served model; `rl_shared` what a part saw around a
shared swap; `rl_dated_crossing` the stream across a shared swap and what dates its tokens;
`rl_violating_snapshot` a snapshot breaking one SNAP MUST clause, ready to signal; `rl_moe` the
served MoE model's shape (the R3 gate); `rl_soak_summary` a soak's figures carried to the report;
`rl_snapshot_under_test`, `rl_reference_cases`, `rl_validate_snapshot` the SNAP tests' snapshots.

The names below, by what a test does with them:

Streams and swaps it watches:
`with_stream` stream a request and act while it is in flight (an `InFlight`);
`across_swap` a stream kept across a swap (a `Crossing`), with `crossing_body` its request;
`probes_during_swap` requests sent while a swap is under way (a `Probing` of `Probe`s);
`in_transit` how long after an event a chunk may still be on its way;
`parting` (a `Parting`) where a stream's numbers leave the old weights';
`watch` a status-poll callback drawing the replicas on a timeline;
`WHITELIST` the finish reasons a completed stream may end with.

Swaps it relies on: `completed` and `expect_loaded` the swap (a `SwapResult`) served, else the
test is inconclusive; `served_by` what one replica of a status serves; `router_change` (a
`RouterChange`) a swap of the MoE routers, and `MoE` what `rl_moe` gives.

Swaps it shares (`rl_shared`, `suite.shared`): `shares` its mark naming the `Share`s
(`share_for` a reset_prompt_cache value's, `COPY` the base copied whole) and the parts it needs;
`part` registers a part a module judges; `CROSSING`, `PROBES`, `GREEDY_BEFORE` the parts the swap
itself observes; `LEDGER` the answer to `COPY`'s ledger reset.

What it reads and sends: `continued` and `cached_continued` a prompt's continuation (from the
prompt cache); `cached_and_a_visible_change` that, and a change to the served weights that moves
it; `not_cut_by_the_suite` inconclusive where one of the suite's own time bounds cut a stream;
`Prompt` a prompt as `rl_deployment.prompt` makes it, and `CACHED_PREFIX` the tokens of a prompt
whose prefix a prompt cache must hold.
"""

from pytest_rlrollout.suite.crossing import Crossing, Parting, across_swap, crossing_body, parting
from pytest_rlrollout.suite.dating import GREEDY_BEFORE
from pytest_rlrollout.suite.moe import MoE, RouterChange, router_change
from pytest_rlrollout.suite.observe import (
    WHITELIST,
    InFlight,
    cached_and_a_visible_change,
    cached_continued,
    continued,
    expect_loaded,
    in_transit,
    not_cut_by_the_suite,
    watch,
    with_stream,
)
from pytest_rlrollout.suite.probing import Probe, Probing, probes_during_swap
from pytest_rlrollout.suite.prompts import CACHED_PREFIX, Prompt
from pytest_rlrollout.suite.shared import COPY, CROSSING, LEDGER, PROBES, Share, part, share_for, shares
from pytest_rlrollout.suite.swaps import SwapResult, completed, served_by

__all__ = [
    "CACHED_PREFIX",
    "COPY",
    "CROSSING",
    "GREEDY_BEFORE",
    "LEDGER",
    "PROBES",
    "WHITELIST",
    "Crossing",
    "InFlight",
    "MoE",
    "Parting",
    "Probe",
    "Probing",
    "Prompt",
    "RouterChange",
    "Share",
    "SwapResult",
    "across_swap",
    "cached_and_a_visible_change",
    "cached_continued",
    "completed",
    "continued",
    "crossing_body",
    "expect_loaded",
    "in_transit",
    "not_cut_by_the_suite",
    "part",
    "parting",
    "probes_during_swap",
    "router_change",
    "served_by",
    "share_for",
    "shares",
    "watch",
    "with_stream",
]
