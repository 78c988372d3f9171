"""Fault switches: for each clause the reference deployment implements, one realistic way to
break exactly that clause (named by its ID; `ID:variant` for another way). `rlrollout serve
--fault ID` and `reference_deployment(faults=...)` turn them on; the project's tests prove each
is observable on the wire (and the conformance suite must catch each one).

Most switches act in the engine core both dialects share (replicas, prompt cache, model, snapshot
loading), so they break their clause on whichever wire the deployment speaks; where a wire says
a thing its own way (a status read, a stream's end), the description says what the vLLM dialect
does. A switch whose clause has no binding on a dialect's wire may do nothing there: the CTL and
VER-SPAN-1 switches act only in the vLLM dialect (the Fireworks one has no pause, label or span
routes). `switches_for(engine)` lists the switches of the clauses an engine binds.

Behaviours are switches that break no clause, or none on their own: a legal variation the suite
must not fail, and a deployment too empty for any clause to pass on."""

from __future__ import annotations

from pytest_rlrollout.contract import catalogue

# SNAP clauses the deployment enforces at POST time: the fault stops rejecting that clause.
_SNAP_AT_LOAD = {
    c.id: f"stops refusing snapshots that violate {c.id} at hot-load time"
    for c in catalogue().area("SNAP")
    if c.level == "MUST" and c.id != "SNAP-ID-1"
}

FAULTS: dict[str, str] = {
    **_SNAP_AT_LOAD,
    "SNAP-ID-1": "accepts identities with '/', loading a nested directory of the bucket",
    "HL-AUTH-1": "hot-load endpoints accept any API key (vLLM: the RL routes take no key, as vLLM 0.32's do)",
    "HL-POST-1": "a valid signal is answered 200 with an empty, non-JSON body (vLLM: so is reload_weights)",
    "HL-POST-2": "unknown body fields are silently ignored",
    "HL-POST-2a": "unknown body fields get 400 with a different wording ('unknown field')",
    "HL-POST-3": "any reset_prompt_cache string is accepted",
    "HL-POST-3a": "boolean reset_prompt_cache gets 400 'Input should be a valid string'",
    "HL-POST-4": "an identity that is not one path segment gets 500",
    "HL-POST-5": "snapshots are not validated at all: whatever loads is served",
    "HL-POST-5a": "validation is deferred: POST says 200, the load then fails with stage 'error'",
    "HL-GET-1": "status has no 'replicas' list ({'status': [...]}); vLLM: /weight_info has no weight_version "
    "({'status': {...}})",
    "HL-GET-1a": "loading_state is null",
    "HL-GET-2": "only replica 0 loads new snapshots; the others keep the old one (vLLM: /weight_info reads a worker "
    "that keeps the label it started with)",
    "HL-GET-3": "a failed load never reports stage 'error' (it stays 'loading')",
    "HL-CONFIG-1": "config mismatches are refused with a different message ('config differs')",
    "HL-CONFIG-2": "validation.extra_fields_ignore is ignored",
    "HL-LEDGER-1": "DELETE .../ledger answers 405",
    "HL-HINT-1": "a hint makes the replicas load the hinted snapshot",
    "SWAP-ASYNC-1": "in-flight streams are cut at the swap (finish_reason 'abort', no [DONE])",
    "SWAP-ASYNC-2": "after the swap, in-flight chunks alternate between the new and the old identity",
    "SWAP-ASYNC-2:stale": "chunks generated after the swap keep naming the snapshot the stream started on",
    "SWAP-ASYNC-3": "ASYNC requests arriving during the swap get 425 at once (vLLM: while generation is paused "
    "after reload_weights)",
    "SWAP-ASYNC-4": "x-fireworks-hot-load-drain-timeout is ignored",
    "SWAP-SYNC-1": "SYNC swaps in-flight streams mid-way instead of draining them",
    "SWAP-SYNC-2": "requests during a SYNC swap get 503 instead of 425",
    "SWAP-NEW-1": "status reports the new identity while the next 3 requests are still served by the old weights",
    "SWAP-KV-1": "reset_prompt_cache also drops the KV of in-flight streams, which then end with an error (vLLM: "
    "POST /reset_prefix_cache does)",
    "CACHE-RPT-1": "the fireworks-cached-prompt-tokens header disagrees with usage (one block more); vLLM: streamed "
    "usage has no prompt_tokens_details",
    "CACHE-HIT-1": "nothing is ever stored in the prompt cache",
    "CACHE-MATRIX-ALL-SAME": "'all' keeps entries for the session that made them (vLLM: POST /reset_prefix_cache "
    "does, for prefixes cached before the last reload_weights)",
    "CACHE-MATRIX-ALL-NEW": "'all' keeps entries for every session but the one that made them (vLLM: POST "
    "/reset_prefix_cache does, for prefixes cached before the last reload_weights)",
    "CACHE-MATRIX-NS-SAME": "'new_session' drops every entry",
    "CACHE-MATRIX-NS-NEW": "'new_session' keeps entries for everyone",
    "CACHE-MATRIX-NONE-SAME": "'none' drops the entries of the session that made them",
    "CACHE-MATRIX-NONE-NEW": "'none' restricts entries to the session that made them",
    "CACHE-NOSESSION-1": "with 'new_session', requests without a session id count as one shared session",
    "CACHE-ISO-1": "the prompt-cache isolation key is ignored",
    "CACHE-EQ-1": "reused KV is slightly corrupted (x1.05), so cache hits change logprobs",
    "SESS-1": "a lone x-multi-turn-session-id is ignored: such requests go to the least-loaded replica",
    "SESS-2": "x-session-affinity wins over x-multi-turn-session-id",
    "SESS-3": "x-session-affinity alone is ignored",
    "VER-STREAM-1": "chunks sampled after a swap lose the '@identity' suffix",
    "VER-NONSTREAM-1": "non-streaming responses keep naming the snapshot served at start-up (vLLM: the spans of a "
    "non-streamed generate answer name the label of start-up)",
    "R3-SHAPE-1": "routing matrices are one byte short",
    "R3-RANGE-1": "the last expert index of each matrix is E (out of range)",
    "R3-CHAT-1": "chat completions carry no routing_matrix",
    "R3-COMP-1": "non-streaming completions carry no routing_matrix",
    "R3-STREAM-1": "streamed tokens carry routing_matrix on every other token only",
    "R3-ECHO-1": "echoed prompt tokens carry no routing_matrix",
    "R3-ECHOLAST-1": "echo_last returns every prompt token",
    "R3-DET-1": "the order of each routing row is random",
    "R3-CACHE-1": "prefix tokens served from the cache report the routing of the previous position",
    "R3-CHANGE-1": "echoed routing is memoised per prompt and survives swaps",
    "INF-SSE-1": "a trailing chunk with 'usage': null follows the real usage",
    "INF-LOGPROBS-1": "logprobs are reported with the wrong sign (positive)",
    "INF-LOGPROBS-1a": "entries carry no sampling_logprob",
    "INF-USAGE-1": "usage.completion_tokens is one more than the tokens returned",
    "INF-RAW-1": "with echo, raw_output.completion_token_ids leaves out the prompt",
    "INF-TOKENIDS-1": "token_ids leave out the last generated token",
    "INF-PERF-1": "perf_metrics carry no cached-prompt-tokens",
    "INF-ERR-1": "a body that is not JSON gets 500",
    "NUM-LOGPROB-1": "logits are rounded to bfloat16 before the softmax, prefill and decode alike",
    "NUM-ROUTE-1": "routing matrices list the MoE layers in reverse order",
    "FID-SAME-1": "an ARC2 diff is applied onto the base snapshot, not the parent it names (checksums unchecked); "
    "vLLM: reload_weights reads every MoE layer's experts in the checkpoint's layout, not the kernel's (what vLLM "
    "0.32's CPU backend does), so even a reload of the same weights changes the numbers",
    "FID-SAME-1:experts": "from the second incremental load in a row on, the first MoE layer's experts keep the "
    "parent's weights (vLLM: from the second reload_weights on, the first MoE layer's experts are read in the "
    "checkpoint's layout)",
    "FID-SWAP-1": "a load changes the served label but not the weights, on every replica",
    "FID-SWAP-1:one": "a load changes the served label but not the weights, on the last replica",
    "FID-CACHE-1": "'all' keeps the pre-swap prompt cache and reuses its KV, reporting 0 cached tokens (vLLM: POST "
    "/reset_prefix_cache keeps what was cached before the last reload_weights)",
    "FID-DECODE-1": "logprobs of generated tokens are reported in bfloat16 precision (prefill logprobs in float32)",
    "FID-BATCH-1": "logits depend on the batch: scaled by 1 + 0.01 per other request in the decode step",
    # vLLM's RL routes (no effect in the Fireworks dialect: it has no pause, label or span routes)
    "VER-SPAN-1": "weight_versions spans leave a gap: each ends one token early (a single span is cut in two "
    "around a missing token) (vLLM dialect only)",
    "VER-SPAN-1:overlap": "weight_versions spans overlap: each ends one token late (a single span is cut in two "
    "that share a token) (vLLM dialect only)",
    "CTL-PAUSE-1": "POST /pause answers 'paused' (and /is_paused says so) but generation goes on (vLLM dialect only)",
    "CTL-PAUSE-1:refuse": "requests arriving while generation is paused get 503 instead of being held (vLLM dialect only)",
    "CTL-PAUSE-2": "abort mode drops the connection of every in-flight stream (no finish_reason, no [DONE]) (vLLM dialect only)",
    "CTL-PAUSE-3": "keep mode loses the tokens generated before the pause: after resume each stream starts its "
    "output over (vLLM dialect only)",
    "CTL-PAUSE-4": "wait mode answers at once and freezes the in-flight requests (as keep does) instead of letting "
    "them finish first (vLLM dialect only)",
    "CTL-PAUSE-5": "an unknown pause mode is taken as 'abort' and pauses (vLLM dialect only)",
    "CTL-LABEL-1": "reload_weights answers at once and the weights swap only after 3 more requests, so a label set "
    "right after names the old weights for a while (vLLM dialect only)",
    "CTL-LABEL-1:aborts": "setting a label ends the in-flight requests with finish_reason 'abort' (vLLM dialect only)",
    "CTL-CACHE-1": "POST /reset_prefix_cache answers success and keeps every cached prefix's KV, reporting 0 cached "
    "tokens for it (vLLM dialect only)",
}


BEHAVIOURS: dict[str, str] = {
    "usage-only-chunk": "streams end with a usage-only chunk ('choices': []) after the finish_reason chunk (legal)",
    "empty-content": "every completion is answered 200 with nothing in it: no text, logprobs, routing, usage "
    "or cached-token report",
}


def clause_of(fault: str) -> str:
    """The clause a fault switch breaks."""
    return fault.partition(":")[0]


def switches_for(engine: str) -> list[str]:
    """The fault switches of the clauses `engine` binds (its mutation matrix), in FAULTS order."""
    cat = catalogue()
    return [f for f in FAULTS if cat[clause_of(f)].binds(engine)]  # type: ignore[arg-type]


_reads: set[str] | None = None  # where switch reads go (record_reads), else nowhere


class Switches(frozenset[str]):
    """The switches a deployment runs with. Every question whether one is on (`name in
    switches`, which `Settings.fault` asks) can be recorded: a switch that is never asked about
    while a test runs changes nothing that test's requests meet."""

    def __contains__(self, name: object) -> bool:
        if _reads is not None:
            _reads.add(str(name))
        return super().__contains__(name)


def record_reads(into: set[str] | None) -> None:
    """From now on, add the name of every switch asked about to `into` (None: stop). The
    mutation matrix runs a fault's row on the tests whose requests read that switch."""
    global _reads
    _reads = into


def check_faults(names) -> Switches:
    unknown = sorted(set(names) - set(FAULTS) - set(BEHAVIOURS))
    if unknown:
        known = ", ".join([*sorted(FAULTS), *BEHAVIOURS])
        raise ValueError(f"unknown fault switch(es) {unknown}; known: {known}")
    return Switches(names)
