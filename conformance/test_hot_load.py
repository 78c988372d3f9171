"""HL — the hot-load control API, and the SNAP rules a deployment enforces when signalled.

Tests marked `rl_swaps` change what the deployment serves: they run only with
`--rl-allow-hot-load` on a live deployment, one at a time across xdist workers, and build
their snapshots with `rl_snapshot_factory` (sentinel deltas wherever a delta will do).
"""

import json

import pytest

from pytest_rlrollout.remote.fingerprint import Fingerprint, FingerprintError, canary, fingerprint
from pytest_rlrollout.remote.replicas import WaitEnd
from pytest_rlrollout.remote.stream import json_object
from pytest_rlrollout.runs.plan import Load, refused, served, shared, unsignalled
from pytest_rlrollout.runs.snapshots import PROBE_KEY
from pytest_rlrollout.snapshot import broken
from pytest_rlrollout.suite.marks import breaks, clause, loads, loads_from, requires, swaps
from pytest_rlrollout.suite.outcomes import inconclusive
from pytest_rlrollout.suite.testing import COPY, expect_loaded, part, share_for, shares, watch


def status_body(rl_deployment) -> dict:
    r = rl_deployment.status().response
    assert r.status_code == 200, f"GET status: {r.status_code} {r.text[:200]}"
    body = json_object(r)
    assert body is not None, f"GET status: not a JSON object: {r.text[:200]!r}"
    return body


def numeric_key(factory) -> str:
    """The config value the config-mismatch snapshots change (SnapshotFactory.config_edit)."""
    try:
        return factory.numeric_key()
    except LookupError as e:
        inconclusive(str(e))


def never_served(rl_deployment, identity: str, before: list, rl_observe) -> None:
    rl_deployment.settle()
    replicas = rl_deployment.replicas()
    if not replicas:
        inconclusive("the status lists no replicas, so what they serve cannot be seen (see HL-GET-1)")
    now = [r.get("current_snapshot_identity") for r in replicas]
    assert identity not in now, f"{identity} is being served: {now}"
    assert now == before, f"the previous snapshot does not serve every replica any more: {before} -> {now}"
    adapters = [
        a.get("identity") for r in replicas for a in r.get("loaded_adapters") or [] if a.get("status") == "loaded"
    ]
    assert identity not in adapters, f"{identity} was loaded as an adapter"
    rl_observe(len(replicas), f"replicas still serving {sorted(set(now))}, not {identity}")


def canary_scores(rl_deployment) -> Fingerprint | None:
    """One canary scored by whatever replica answers (None where the deployment cannot score one)."""
    if not all(map(rl_deployment.capabilities.has, ("logprobs", "echo", "token_id_prompts"))):
        return None
    try:
        return fingerprint(
            rl_deployment.driver,
            rl_deployment.salted(f"weights-{rl_deployment.mark('canary')}"),
            sequences=canary((rl_deployment.base_config or {}).get("vocab_size"))[:1],
        )
    except FingerprintError as e:
        inconclusive(f"the deployment's weights cannot be told before the load: {e}")


def still_serves(rl_deployment, before: Fingerprint | None, rl_observe) -> None:
    """The weights served before a refused load keep serving: a request is answered, and scores a
    canary as before the load (a label that stayed while the weights went would pass by names)."""
    s = rl_deployment.complete({"prompt": rl_deployment.prompt("still-serves", 4).body, "max_tokens": 1})
    assert s.ok, f"after the refused load, a request is not served: HTTP {s.status} {s.body[:300]!r}"
    if before is None:
        rl_observe(1, "request answered after the refused load")
        return
    try:
        after = fingerprint(
            rl_deployment.driver,
            rl_deployment.salted(f"weights-{rl_deployment.mark('canary')}"),
            sequences=canary((rl_deployment.base_config or {}).get("vocab_size"))[:1],
        )
    except FingerprintError as e:
        raise AssertionError(f"after the refused load, the canary is not scored: {e}") from None
    tol = rl_deployment.options.numerics.fingerprint_tolerance
    assert after.distance(before) <= tol, (
        f"after the refused load the weights are not the ones served before: a canary moved by "
        f"{after.describe(before)} > {tol:g}"
    )
    rl_observe(1, f"canary scored as before the refused load ({after.describe(before)})")


def served_identities(rl_deployment) -> list:
    return [r.get("current_snapshot_identity") for r in rl_deployment.replicas()]


# --------------------------------------------------------------------------- status (read-only)


@clause("HL-GET-1")
def test_status_lists_replicas(rl_deployment, rl_observe):
    """Status is a JSON object with a replicas list; each replica has readiness (bool) and current_snapshot_identity
    (string or null)."""
    status = rl_deployment.status()
    if status.unread:
        inconclusive(status.unread)
    assert not status.problems, status.problems
    assert status.replicas, f"no replica in the status: {status.response.text[:300]!r}"
    rl_observe(len(status.replicas), "replicas with readiness and current_snapshot_identity")


@clause("HL-GET-1a")
def test_status_has_loading_state(rl_deployment, rl_observe):
    """Each replica has a loading_state object with stage and a non-null target_snapshot_identity (the official SDK
    cannot handle null)."""
    replicas = status_body(rl_deployment).get("replicas")
    if not isinstance(replicas, list) or not replicas:
        inconclusive("no replicas list to look into (see HL-GET-1)")
    for r in replicas:
        state = r.get("loading_state")
        assert isinstance(state, dict), f"loading_state is {state!r}"
        assert isinstance(state.get("stage"), str), state
        assert isinstance(state.get("target_snapshot_identity"), str), (
            f"target_snapshot_identity is not a string: {state}"
        )
    rl_observe(len(replicas), "replicas with loading_state.stage and target_snapshot_identity")


# --------------------------------------------------------------------------- signals


@clause("HL-AUTH-1")
@requires("auth")
@loads(refused())
def test_bad_credentials_are_refused_without_a_state_change(rl_deployment, rl_swap, rl_observe):
    """A missing or wrong API key gets 401 or 403; a missing or wrong fireworks-deployment or fireworks-model header
    gets a 4xx; never a 5xx and never a state change."""
    built = rl_swap.build("auth")
    before = served_identities(rl_deployment)
    bad = {
        "no API key": ({"Authorization": ""}, (401, 403)),
        "wrong API key": ({"Authorization": "Bearer not-the-key"}, (401, 403)),
    }
    if rl_deployment.target.by_name:  # a deployment addressed by name: wrong names too
        bad |= {
            "wrong deployment": ({"fireworks-deployment": "accounts/nobody/deployments/nothing"}, range(400, 500)),
            "wrong model": ({"fireworks-model": "accounts/nobody/models/nothing"}, range(400, 500)),
        }
    for what, (headers, wanted) in bad.items():
        r = rl_deployment.hot_load(built.signal, headers=headers)
        assert r.status_code in wanted, f"{what}: POST got {r.status_code} {r.text[:200]}"
    for what in ("no API key", "wrong API key"):
        r = rl_deployment.status(headers=bad[what][0]).response
        assert r.status_code in (401, 403), f"{what}: GET status got {r.status_code}"
    rl_observe(len(bad) + 2, "requests with bad credentials or names refused")
    never_served(rl_deployment, built.identity, before, rl_observe)


part("signal-answer", lambda _, name: name, lambda _, __, swapped: swapped.response)


@clause("HL-POST-1")
@loads(shared())
@shares(lambda _: COPY, "signal-answer")
def test_full_snapshot_signal_gets_200_json(rl_deployment, rl_shared, rl_observe):
    """A valid full snapshot signal {'identity': ...} gets HTTP 200 with a JSON object body."""
    r = rl_shared(COPY, "signal-answer")
    assert r.status_code == 200, f"{r.status_code} {r.text[:300]}"
    try:
        body = r.json()
    except ValueError:
        pytest.fail(f"the answer is not JSON: {r.text[:200]!r}")
    assert isinstance(body, dict), f"the answer is {type(body).__name__}, not an object"
    rl_observe(1, f"full snapshot signal answered 200 {r.text[:80]}")


@clause("HL-POST-2")
@loads(refused())
def test_unknown_field_gets_400(rl_deployment, rl_swap, rl_observe):
    """An unknown body field gets 400."""
    built = rl_swap.build("post-2")
    r = rl_deployment.hot_load({**built.signal, "unexpected_field": True})
    assert r.status_code == 400, f"{r.status_code} {r.text[:200]}"
    rl_observe(1, "signal with an unknown field refused 400")


@clause("HL-POST-2a")
@loads(refused())
def test_unknown_field_message_wording(rl_deployment, rl_swap, rl_observe):
    """The 400 for an unknown field says 'Extra inputs are not permitted' and names the field (the official SDK's
    fallback matches this wording)."""
    built = rl_swap.build("post-2a")
    r = rl_deployment.hot_load({**built.signal, "unexpected_field": True})
    if r.status_code != 400:
        inconclusive(f"the unknown field was not refused ({r.status_code}; see HL-POST-2)")
    assert "Extra inputs are not permitted" in r.text and "unexpected_field" in r.text, r.text[:300]
    rl_observe(1, "400 naming the field with the documented wording")


RESETS = ("all", "new_session", "none")


@clause("HL-POST-3")
@loads(refused(), shared(), shared(), shared())
@shares(lambda _: [share_for(policy) for policy in RESETS], "signal-answer")
def test_reset_prompt_cache_values(rl_deployment, rl_swap, rl_shared, rl_observe):
    """reset_prompt_cache accepts 'all' (the default), 'new_session' and 'none'; any other string gets 400."""
    built = rl_swap.build("post-3")
    r = rl_deployment.hot_load({**built.signal, "reset_prompt_cache": "sometimes"})
    assert r.status_code == 400, f"reset_prompt_cache='sometimes' got {r.status_code}"
    rl_deployment.settle()
    for policy in RESETS:
        r = rl_shared(share_for(policy), "signal-answer")
        assert r.status_code == 200, f"reset_prompt_cache={policy!r}: {r.status_code} {r.text[:200]}"
    rl_observe(4, "reset_prompt_cache values judged ('sometimes' refused; all, new_session, none accepted)")


def signal_accepted(rl_swap, label: str, reset_prompt_cache) -> None:
    result = rl_swap.signal(
        rl_swap.build(f"{label}-{str(reset_prompt_cache).lower()}"), reset_prompt_cache=reset_prompt_cache
    )
    r = result.response
    assert r.status_code == 200, f"reset_prompt_cache={reset_prompt_cache!r}: {r.status_code} {r.text[:200]}"


@clause("HL-POST-3a")
@loads(served(), served())
def test_reset_prompt_cache_booleans(rl_deployment, rl_swap, rl_observe):
    """reset_prompt_cache also accepts booleans, as the official SDK sends true."""
    for value in (True, False):
        signal_accepted(rl_swap, "post-3a", value)
    rl_observe(2, "boolean reset_prompt_cache values accepted")


@swaps
@clause("HL-POST-4")
@loads()
def test_identity_not_one_segment_gets_4xx(rl_deployment, rl_observe):
    """An identity violating SNAP-ID-1 gets a 4xx."""
    identities = ("a/b", "..", ".", "", "back\\slash", "nul\x00byte", "ctl\x01char")
    for identity in identities:
        r = rl_deployment.hot_load({"identity": identity})
        assert 400 <= r.status_code < 500, f"identity {identity!r}: {r.status_code} {r.text[:200]}"
    rl_observe(len(identities), "identities that are not one path segment refused 4xx")


@clause("SNAP-ID-1")
@loads(unsignalled(), Load("nested", end="refused"))
def test_nested_identity_is_never_served(rl_deployment, rl_swap, rl_snapshot_factory, rl_observe):
    """A snapshot identity is a single non-empty path segment: no '/', no '\\\\', no NUL or control character, and
    neither '.' nor '..'."""
    built = rl_swap.build("nested")
    outer = f"{built.identity}-dir"
    nested = f"{outer}/inner"
    rl_snapshot_factory.copy_nested(built.identity, outer, "inner")
    before = served_identities(rl_deployment)
    r = rl_deployment.hot_load({**built.signal, "identity": nested})
    assert r.status_code != 200, f"identity {nested!r} was accepted"
    never_served(rl_deployment, nested, before, rl_observe)


def _variants():
    from pytest_rlrollout.contract import catalogue

    return [
        pytest.param(c.id, marks=pytest.mark.rl_clause(c.id), id=c.id)
        for c in catalogue().area("SNAP")
        if c.level == "MUST" and c.id in broken.BREAKERS and c.id != "SNAP-ID-1"
    ]


def violating(ctx):
    """HL-POST-5's loads: the broken variant, refused (the planner adds what signalling it needs,
    as the test does)."""
    return [Load("given", end="refused", variant=ctx.params["violated"])]


@breaks
@clause("HL-POST-5")
@pytest.mark.parametrize("violated", _variants())
@loads_from(violating)
def test_violating_snapshot_is_never_served(rl_deployment, rl_violating_snapshot, violated, rl_observe):
    """A snapshot violating a SNAP MUST clause is never served: the previous snapshot keeps serving on every replica."""
    built = rl_violating_snapshot(violated)
    before = served_identities(rl_deployment)
    weights = canary_scores(rl_deployment)
    rl_deployment.hot_load(built.signal)
    never_served(rl_deployment, built.identity, before, rl_observe)
    still_serves(rl_deployment, weights, rl_observe)


@clause("HL-POST-5a")
@loads(refused(config="scaled"))
def test_violations_are_refused_at_post_time(rl_deployment, rl_swap, rl_snapshot_factory, rl_observe):
    """Such a snapshot is rejected at POST time with a 4xx whose message names the failed rule (failing later with
    loading_state.stage 'error' is allowed)."""
    key = numeric_key(rl_snapshot_factory)
    built = rl_snapshot_factory.step(
        rl_deployment.serving(), "post-5a", config_edit=rl_snapshot_factory.config_edit("scaled")
    )
    r = rl_deployment.hot_load(built.signal)
    assert 400 <= r.status_code < 500, f"a config mismatch was answered {r.status_code} at POST time"
    assert key in r.text or "config" in r.text.lower(), f"the message does not name the failed rule: {r.text[:300]}"
    rl_observe(1, f"config mismatch refused at POST time: {r.status_code} {r.text[:80]}")


# --------------------------------------------------------------------------- loading


part("replicas-after", lambda _, name: name, lambda dep, _, swapped: (swapped, dep.replicas()))


@clause("HL-GET-2")
@loads(shared())
@shares(lambda _: share_for(None), "replicas-after")
def test_every_replica_reaches_the_new_identity(rl_deployment, rl_shared, rl_observe):
    """After a valid signal every replica reaches readiness true with current_snapshot_identity equal to the identity
    (LoRA: the identity in loaded_adapters with status 'loaded' on every replica)."""
    result, replicas = rl_shared(share_for(None), "replicas-after")
    expect_loaded(result, own=True)
    for r in replicas:
        assert r.get("readiness") is True and r.get("current_snapshot_identity") == result.built.identity, r
    rl_observe(len(replicas), f"replicas ready and serving {result.built.identity}")


@clause("HL-GET-2")
@requires("lora")
@loads(served("lora"), served())
def test_every_replica_loads_the_adapter(rl_deployment, rl_swap, rl_snapshot_factory, rl_observe):
    """After a valid signal every replica reaches readiness true with current_snapshot_identity equal to the identity
    (LoRA: the identity in loaded_adapters with status 'loaded' on every replica)."""
    built = rl_snapshot_factory.lora()
    result = rl_swap.signal(built)
    expect_loaded(result, own=True)
    rl_observe(len(result.waited.replicas), f"replicas listing {built.identity} as a loaded adapter")
    rl_swap("after-lora")  # back to serving plain snapshots for the tests that follow


@swaps
@clause("HL-CONFIG-1")
@loads(refused(config="scaled"), refused(config="extra"))
def test_config_mismatch_is_refused_with_documented_wording(rl_deployment, rl_snapshot_factory, rl_observe):
    """A config mismatch (SNAP-CONFIG-2) leaves the snapshot unloaded, with the documented message wording."""
    key = numeric_key(rl_snapshot_factory)
    edits = {
        f"Config value mismatch for {key}": rl_snapshot_factory.config_edit("scaled"),
        "Extra snapshot model config options": rl_snapshot_factory.config_edit("extra"),
    }
    for wording, edit in edits.items():
        built = rl_snapshot_factory.step(rl_deployment.serving(), "config-1", config_edit=edit)
        before = served_identities(rl_deployment)
        r = rl_deployment.hot_load(built.signal)
        rl_deployment.settle()
        said = r.text + json.dumps(rl_deployment.replicas())
        never_served(rl_deployment, built.identity, before, rl_observe)
        assert wording in said, f"no {wording!r} in the answer or the status: {said[:400]}"
        rl_observe(1, f"refusal saying {wording!r}")


@clause("HL-CONFIG-2")
@loads(served(change="none", config="extra-scaled"))
def test_extra_fields_ignore_lets_the_snapshot_load(rl_deployment, rl_swap, rl_snapshot_factory, rl_observe):
    """validation.extra_fields_ignore lets a snapshot load whose only extra or different top-level config keys are the
    listed ones."""
    # one snapshot differing in both ways (an option the base lacks, a value it sets otherwise),
    # both fields named: the base's weights, so that what follows can diff against the base
    key, edit = numeric_key(rl_snapshot_factory), rl_snapshot_factory.config_edit("extra-scaled")
    built = rl_snapshot_factory.step(rl_deployment.serving(), "config-2", change={}, config_edit=edit)
    expect_loaded(rl_swap.signal(built, validation={"extra_fields_ignore": [PROBE_KEY, key]}))
    rl_observe(2, f"snapshot differing in {PROBE_KEY} and {key} loaded with extra_fields_ignore naming both")


@clause("HL-LEDGER-1")
@requires("ledger")
@loads(served("known"), Load("reset"), refused("sentinel"), served("copy"))
def test_ledger_reset(rl_deployment, rl_swap, rl_snapshot_factory, rl_observe):
    """DELETE .../ledger returns 2xx; afterwards SNAP-INC-7 holds and a full snapshot loads."""
    serving = rl_deployment.serving()
    if not rl_snapshot_factory.knows(serving):
        rl_swap("before-reset")
        serving = rl_deployment.serving()
    r = rl_deployment.reset_ledger()
    assert 200 <= r.status_code < 300, f"DELETE ledger: {r.status_code} {r.text[:200]}"
    rl_snapshot_factory.ledger_reset()
    incremental = rl_snapshot_factory.sentinel(serving, "after-reset")
    before = served_identities(rl_deployment)
    rl_deployment.hot_load(incremental.signal)
    never_served(rl_deployment, incremental.identity, before, rl_observe)
    expect_loaded(rl_swap.signal(rl_snapshot_factory.base_copy("after-reset-full")))
    rl_observe(1, "full snapshot loaded after the reset")


@clause("HL-HINT-1")
@requires("hint")
@loads(unsignalled())
def test_hints_never_change_the_served_snapshot(rl_deployment, rl_swap, rl_observe):
    """The hint endpoint accepts {'identity', 'file'}; hints alone never change current_snapshot_identity."""
    built = rl_swap.build("hint")
    before = served_identities(rl_deployment)
    r = rl_deployment.hint(built.identity, "config.json")
    assert r.status_code == 200, f"{r.status_code} {r.text[:200]}"
    for replica in rl_deployment.replicas():
        assert (replica.get("loading_state") or {}).get("target_snapshot_identity") != built.identity, replica
    rl_observe(1, "hint accepted")
    never_served(rl_deployment, built.identity, before, rl_observe)


# A load made to fail may leave a deployment broken (a real engine has died of one) or, one that
# never reports a failed load, with replicas "loading" that every later swap test would wait out:
# it runs with the breaking tests, after every other test (last of them: last in the module).


@breaks
@clause("HL-GET-3")
@loads(Load("step", end="failed"))
def test_failed_load_reports_error(rl_deployment, rl_swap, rl_snapshot_factory, rl_observe):
    """A failed load reports loading_state.stage 'error' with target_snapshot_identity naming the failed identity, while
    current_snapshot_identity stays the previous one."""
    built = rl_swap.build("get-3")
    before = served_identities(rl_deployment)
    timeline = rl_observe.swap("a load whose shard was removed after the signal")
    timeline.old, timeline.new = rl_deployment.serving(), built.identity
    with rl_deployment.observable_swaps():  # the shard must go before the deployment reads it
        timeline.mark(rl_deployment.mark("signal"), "signal")
        r = rl_deployment.hot_load(built.signal)
        assert r.status_code == 200, f"the valid signal was refused: {r.status_code}"
        # the deployment downloads after answering: a shard gone now makes the load fail
        shard = sorted(set(rl_snapshot_factory.index["weight_map"].values()))[0]
        rl_snapshot_factory.bucket.remove_file(built.identity, shard)
        timeline.mark(rl_deployment.mark("removed"), f"{shard} removed")
        waited = rl_deployment.wait_for(built.identity, progress=watch(rl_deployment, timeline))
    if waited.ok:
        inconclusive("the deployment had read the snapshot before the shard was removed")
    if waited.end is WaitEnd.UNREADABLE:
        inconclusive(waited.error)
    if any(not isinstance(r.get("loading_state"), dict) for r in waited.replicas):
        inconclusive("replicas report no loading_state to carry the error (see HL-GET-1a)")
    assert waited.end is WaitEnd.FAILED, (
        f"no replica reported stage 'error' for {built.identity} ({waited.error}): {waited.replicas}"
    )
    failed = [r for r in waited.replicas if (r.get("loading_state") or {}).get("stage") == "error"]
    assert all(r["loading_state"].get("target_snapshot_identity") == built.identity for r in failed), failed
    assert served_identities(rl_deployment) == before
    rl_observe(
        len(failed), f"replicas reporting stage 'error' for {built.identity} while serving {sorted(set(before))}"
    )
