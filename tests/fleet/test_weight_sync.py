"""The weight-sync check through smg's gateway in front of two reference vLLM-dialect engines (a real
`smg launch --enable-rl`, the project's `fleet` extra; its router process is stopped with its
process group by `reference.fleet.smg_gateway`): the same guarantees as through every other driver
(tests/runs/test_weight_sync.py), each engine reached through the gateway's proxy route to it."""

from ..runs.sync_support import checked_three_times, served, stale_replica_named


def test_green_on_the_start_weights_one_scoring_request_per_engine_nothing_changed(bucket):
    """Green on the start weights against the numpy scorer; once the engines are known, one scoring
    request per engine per call (the transport, each engine's log) and nothing else; the engines
    hold and say what they did before."""
    with served("smg", bucket) as s:
        checked_three_times(s)


def test_an_engine_that_kept_the_previous_weights_is_named_stale(bucket):
    """FID-SWAP-1 on the second engine, then a swap fanned out by the gateway: the check names that
    engine stale, by its numbers, though its label says the new snapshot."""
    with served("smg", bucket, faults={1: frozenset({"FID-SWAP-1"})}) as s:
        stale_replica_named(s, 1)
