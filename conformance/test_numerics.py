"""NUM — numerics alignment: the deployment's logprobs and routing for tokens it sampled, against
a local forward pass of the same weights (the R3 paper's figures, in the report with pictures).

The local weights are those of the snapshot the sampled chunks name: the base copy
(`--rl-base-snapshot`, its directory named after its identity) or a snapshot this run built from
it (the base plus the tensors it changed; an adapter on top). The scorer is the numpy engine
for small models and transformers otherwise (ini keys `rl_scorer`, `rl_scorer_device`).
"""

from __future__ import annotations

import pytest

from pytest_rlrollout.contract.moe import moe_shape
from pytest_rlrollout.suite.marks import clause, requires
from pytest_rlrollout.suite.outcomes import inconclusive, not_applicable

PROMPTS = 4  # the generated tokens are spread over this many prompts


@pytest.fixture(scope="module")
def local_scorers() -> dict:
    return {}  # (weights, adapter, kind, device) -> scorer: loading weights costs more than scoring


def local_weights(rl_deployment, factory, policy: str):
    """(snapshot dir, adapter dir or None) for the policy identity the chunks named."""
    base = rl_deployment.base_snapshot
    if base is None:
        inconclusive("comparing with a local forward pass needs the weights: pass --rl-base-snapshot")
    served = {r.get("current_snapshot_identity") for r in rl_deployment.replicas()} or {policy}
    if len(served) != 1:
        inconclusive(f"the replicas serve different snapshots ({sorted(map(str, served))})")
    snapshot = served.pop()
    adapter = None
    if policy != snapshot:
        adapter = factory.adapters.get(policy) if factory is not None else None
        if adapter is None:
            inconclusive(f"the chunks name {policy}, an adapter on {snapshot} this run has no local copy of")
    if snapshot == base.name:
        return base, adapter
    try:
        if factory is None:
            raise LookupError(f"{snapshot} is not the base copy {base.name}")
        return factory.local_copy(snapshot), adapter
    except LookupError as e:
        inconclusive(
            f"the deployment serves {snapshot}, whose weights this run has no copy of ({e}): pass "
            "--rl-base-snapshot naming a local copy of it (its directory named after its identity)"
        )


def figures_of(rl_deployment, rl_snapshots, scorers, *, routing: bool):
    """Sample, score locally, and return the figures (and the routing alignment used)."""
    from pytest_rlrollout.numerics.rollouts import RolloutError, compare, sample
    from pytest_rlrollout.numerics.scorer import local_scorer

    opts = rl_deployment.options.numerics
    shape = moe_shape(rl_deployment.base_config)
    if routing and shape is None:
        if rl_deployment.base_config is None:
            inconclusive("whether the model is MoE is told by its config.json: pass --rl-base-snapshot")
        not_applicable("the served model is dense (its config.json declares no experts)")
    per_prompt = -(-opts.tokens // PROMPTS)
    prompts = [rl_deployment.token_ids(f"num-{i}", 16) for i in range(PROMPTS)]
    versioned = rl_deployment.capabilities.has("policy_version")
    served = set() if versioned else set(rl_deployment.served_identities())  # the policy, where answers name none
    try:
        rollouts = sample(
            rl_deployment.driver,
            prompts,
            per_prompt,
            headers=rl_deployment.session("num"),
            shape=(shape.layers, shape.k) if routing and shape else None,
        )
    except RolloutError as e:
        inconclusive(f"the rollouts cannot be compared: {e} (see INF-LOGPROBS-1, R3-STREAM-1)")
    policies = {v for r in rollouts for v in r.versions if v is not None}
    if not policies and not versioned:
        # no policy version on completions: what every replica served before and after sampling
        if len(served) != 1 or set(rl_deployment.served_identities()) != served:
            inconclusive(
                f"the answers name no policy version, and the replicas served {sorted(served)} before "
                f"sampling and {sorted(rl_deployment.served_identities())} after"
            )
        policies = served
    if len(policies) != 1:
        inconclusive(f"the rollouts name {len(policies)} policy versions ({sorted(policies)[:4]}; see VER-STREAM-1)")
    weights, adapter = local_weights(rl_deployment, rl_snapshots, policies.pop())
    key = (str(weights), str(adapter), opts.scorer, opts.scorer_device)
    if key not in scorers:
        try:
            scorers[key] = local_scorer(weights, opts.scorer, opts.scorer_device, adapter=adapter)
        except (RuntimeError, ValueError) as e:
            inconclusive(f"no local scorer: {e}")
    return compare(rollouts, scorers[key])


@clause("NUM-LOGPROB-1")
@requires("logprobs", "token_id_prompts")
def test_logprobs_match_a_local_forward_pass(rl_deployment, rl_snapshots, local_scorers, rl_observe):
    """For tokens the deployment generated, a local forward pass of the same snapshot gives logprobs within a
    configurable tolerance; the report gives mean and max |delta| and a k3 KL estimate."""
    figures, _ = figures_of(rl_deployment, rl_snapshots, local_scorers, routing=False)
    tol = rl_deployment.options.numerics.logprob_tolerance
    rl_observe.figures = figures.as_dict()
    assert figures.max_abs <= tol, (
        f"over {figures.tokens} sampled tokens, the deployment's logprobs differ from a local forward pass of the "
        f"same weights by max |Δ| {figures.max_abs:.3g} > tolerance {tol:g} (mean |Δ| {figures.mean_abs:.3g}, "
        f"k3 KL {figures.k3_kl:.3g}, {figures.ratio_outside:.1%} of ratios outside [0.5, 2])"
    )
    rl_observe(
        figures.tokens,
        f"sampled tokens scored locally: mean |Δ| {figures.mean_abs:.2g}, max |Δ| "
        f"{figures.max_abs:.2g}, k3 KL {figures.k3_kl:.2g}",
    )


@clause("NUM-ROUTE-1")
@requires("logprobs", "token_id_prompts", "routing_matrix")
def test_routing_matches_the_local_router(rl_deployment, rl_snapshots, local_scorers, rl_observe):
    """Routing the deployment returned agrees with the local router's top-k; the report gives the per-(layer, token)
    agreement rate and the fraction of tokens with any disagreement."""
    figures, alignment = figures_of(rl_deployment, rl_snapshots, local_scorers, routing=True)
    least = rl_deployment.options.numerics.min_route_agreement
    if figures.route_agreement is None:
        inconclusive("no routing on both sides to compare")
    rl_observe.figures = {**figures.as_dict(), "alignment": alignment}
    worst = min(range(len(figures.layer_agreement)), key=figures.layer_agreement.__getitem__)
    assert figures.route_agreement >= least, (
        f"over {figures.route_tokens} sampled tokens, the routing the deployment returned agrees with the local "
        f"router's top-k on {figures.route_agreement:.2%} of (layer, token) pairs < {least:.2%} "
        f"({figures.any_disagreement:.1%} of tokens disagree in some layer; MoE layer {worst} agrees on "
        f"{figures.layer_agreement[worst]:.1%})"
    )
    rl_observe(
        figures.route_tokens,
        f"sampled tokens routed as the local router routes them "
        f"({figures.route_agreement:.2%} of (layer, token); {alignment})",
    )
