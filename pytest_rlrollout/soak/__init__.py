"""Soak: the contract under rollout load across many swaps (rollout workers on Locust, one
trainer loop swapping snapshots), judged as it runs."""
