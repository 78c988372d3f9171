"""Every fault switch makes its clause's violation observable on the wire.

Each observation below is made over HTTP against a fresh reference deployment, once without
faults (the clause must hold) and once with the switch on (the clause must be violated), so the
switch, and nothing else, is what breaks the clause."""

import base64
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from pytest_rlrollout import broken, factory, refmodel
from pytest_rlrollout.deployment.faults import FAULTS

from .conftest import Client, chunks, poll, versions

BASE = refmodel.BASE_IDENTITY
PROMPT = list(range(10, 90))
L, K, E = 3, 2, 8


# --------------------------------------------------------------------------- helpers


def step(bucket, name="step-1", seed=1, only=None, scale=1e-2):
    return factory.derive(
        bucket / BASE, bucket / name, factory.perturbed(bucket / BASE, seed=seed, only=only, scale=scale)
    )


def settle(c, timeout=10.0):
    """Wait (with a deadline) until no load is in progress."""
    deadline = time.monotonic() + timeout
    while c.dep.deployment.loading is not None:
        assert time.monotonic() < deadline, "load never finished"
    deadline = time.monotonic() + timeout
    while any(r.swapping or r.draining or r._swap for r in c.dep.deployment.replicas):
        assert time.monotonic() < deadline, "swap never finished"


def entries_of(chs):
    return [e for ch in chs for e in ((ch.get("choices") or [{}])[0].get("logprobs") or {}).get("content", [])]


def matrix(e):
    return np.frombuffer(base64.b64decode(e["routing_matrix"]), np.uint8)


def stream_across_swap(c, bucket, body=None, n=60):
    """Stream a long completion and signal a swap after the first chunks; returns all lines."""
    step(bucket)
    with c.complete(PROMPT, stream=True, max_tokens=n, logprobs=True, raw_output=True) as r:
        lines = r.iter_lines()
        head = [next(lines) for _ in range(3)]
        assert c.hot_load(body or {"identity": "step-1"}).status_code == 200
        return head + [x for x in lines if x]


def cached_tokens(r):
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def matrix_cell(policy, who, reuse):
    """Whether `who` ('same', 'new' or 'none') reuses the cache after a swap under `policy`
    exactly when `reuse` says it should."""

    def observe(c, bucket):
        step(bucket)
        c.complete(PROMPT, max_tokens=1, headers={"x-multi-turn-session-id": "s1"})
        c.hot_load({"identity": "step-1", "reset_prompt_cache": policy})
        c.wait_for("step-1")
        headers = {"same": {"x-multi-turn-session-id": "s1"}, "new": {"x-multi-turn-session-id": "s2"}, "none": {}}[who]
        return (cached_tokens(c.complete(PROMPT, max_tokens=1, headers=headers)) > 0) == reuse

    return observe


# --------------------------------------------------------------------------- observations


def hl_auth(c, bucket):
    step(bucket)
    return c.hot_load({"identity": "step-1"}, headers={"Authorization": "Bearer wrong"}).status_code in (401, 403)


def hl_post_1(c, bucket):
    step(bucket)
    r = c.hot_load({"identity": "step-1"})
    try:
        return r.status_code == 200 and isinstance(r.json(), dict)
    except ValueError:
        return False


def hl_post_2(c, bucket):
    step(bucket)
    return c.hot_load({"identity": "step-1", "force": True}).status_code == 400


def hl_post_2a(c, bucket):
    step(bucket)
    return "Extra inputs are not permitted, field: 'force'" in c.hot_load({"identity": "step-1", "force": True}).text


def hl_post_3(c, bucket):
    step(bucket)
    return c.hot_load({"identity": "step-1", "reset_prompt_cache": "sometimes"}).status_code == 400


def hl_post_3a(c, bucket):
    step(bucket)
    return c.hot_load({"identity": "step-1", "reset_prompt_cache": True}).status_code == 200


def hl_post_4(c, bucket):
    return 400 <= c.hot_load({"identity": "a/b"}).status_code < 500


def eps_snapshot(bucket, name="eps"):
    cfg = json.loads((bucket / BASE / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    return factory.derive(bucket / BASE, bucket / name, {}, config=cfg)


def hl_post_5(c, bucket):
    eps_snapshot(bucket)
    c.hot_load({"identity": "eps"})
    settle(c)
    return all(r["current_snapshot_identity"] == BASE for r in c.status()["replicas"])


def hl_post_5a(c, bucket):
    eps_snapshot(bucket)
    return 400 <= c.hot_load({"identity": "eps"}).status_code < 500


def hl_get_1(c, bucket):
    status = c.hot_load(method="GET").json()
    return isinstance(status.get("replicas"), list)


def hl_get_1a(c, bucket):
    status = c.hot_load(method="GET").json()
    return all(
        isinstance(r.get("loading_state"), dict) and r["loading_state"].get("target_snapshot_identity")
        for r in status["replicas"]
    )


def hl_get_2(c, bucket):
    step(bucket)
    c.hot_load({"identity": "step-1"})
    settle(c)
    return all(r["readiness"] and r["current_snapshot_identity"] == "step-1" for r in c.status()["replicas"])


def hl_get_3(c, bucket):
    step(bucket)
    c.hot_load({"identity": "step-1"})
    (bucket / "step-1" / "model-00002-of-00005.safetensors").write_bytes(b"")
    settle(c)
    return all(
        r["loading_state"]["stage"] == "error" and r["loading_state"]["target_snapshot_identity"] == "step-1"
        for r in c.status()["replicas"]
    )


def hl_config_1(c, bucket):
    eps_snapshot(bucket)
    return "Config value mismatch for rms_norm_eps" in c.hot_load({"identity": "eps"}).text


def hl_config_2(c, bucket):
    eps_snapshot(bucket)
    return c.hot_load({"identity": "eps", "validation": {"extra_fields_ignore": ["rms_norm_eps"]}}).status_code == 200


def hl_ledger_1(c, bucket):
    return 200 <= c.http.delete("/v1/accounts/rlrollout/deployments/reference/ledger").status_code < 300


def hl_hint_1(c, bucket):
    step(bucket)
    r = c.http.post(
        "/hot_load/v1/models/hot_load/hint",
        json={"identity": "step-1", "file": "config.json"},
        headers=c.dep.hot_load_headers(),
    )
    settle(c)
    return r.status_code == 200 and all(x["current_snapshot_identity"] == BASE for x in c.status()["replicas"])


def snap_id_1(c, bucket):
    shutil.copytree(bucket / BASE, bucket / "nested" / "step")
    return 400 <= c.hot_load({"identity": "nested/step"}).status_code < 500


def snap_at_load(clause):
    def observe(c, bucket):
        scratch = Path(tempfile.mkdtemp(dir=bucket.parent))
        cases = broken.ReferenceCases(scratch / "ref")
        case = broken.broken_case(clause, cases, scratch / "broken")
        shutil.copytree(case.snapshot, bucket / "candidate", symlinks=True)
        body = {**(case.signal or {}), "identity": "candidate"}
        if case.ledger_reset:
            c.http.delete("/v1/accounts/rlrollout/deployments/reference/ledger")
        return 400 <= c.hot_load(body).status_code < 500

    return observe


def swap_async_1(c, bucket):
    lines = stream_across_swap(c, bucket)
    chs = chunks(lines)
    final = chs[-1]
    return (lines[-1] == "data: [DONE]" and final["choices"][0]["finish_reason"] in ("stop", "length")
            and len(entries_of(chs)) == final.get("usage", {}).get("completion_tokens"))  # fmt: skip


def swap_async_2(c, bucket):
    v = versions(chunks(stream_across_swap(c, bucket)))
    return sum(a != b for a, b in itertools.pairwise(v)) <= 1 and v[-1] == "step-1"


def during_swap(c, bucket, **headers):
    step(bucket)
    c.hot_load({"identity": "step-1"})
    poll(lambda: c.status()["replicas"][0]["loading_state"]["stage"] == "swapping")
    return c.complete([1, 2, 3], max_tokens=2, headers=headers)


def swap_async_3(c, bucket):
    return during_swap(c, bucket).status_code == 200


def swap_async_4(c, bucket):
    return during_swap(c, bucket, **{"x-fireworks-hot-load-drain-timeout": "0.05"}).status_code == 425


def swap_sync_1(c, bucket):
    return set(versions(chunks(stream_across_swap(c, bucket)))) == {BASE}


def swap_sync_2(c, bucket):
    step(bucket)
    with c.complete(PROMPT, stream=True, max_tokens=60) as r:
        lines = r.iter_lines()
        next(lines)
        c.hot_load({"identity": "step-1"})
        poll(lambda: c.status()["replicas"][0]["loading_state"]["stage"] == "swapping")
        early = c.complete([1, 2, 3], max_tokens=2)
        list(lines)
    return early.status_code == 425


def swap_new_1(c, bucket):
    step(bucket)
    c.hot_load({"identity": "step-1"})
    c.wait_for("step-1")
    return all(c.complete([1, 2, 3], max_tokens=1).json()["model"].endswith("@step-1") for _ in range(4))


def swap_kv_1(c, bucket):
    lines = stream_across_swap(c, bucket, {"identity": "step-1", "reset_prompt_cache": "none"})
    return lines[-1] == "data: [DONE]"


def cache_rpt_1(c, bucket):
    h = {"x-multi-turn-session-id": "s1"}
    c.complete(PROMPT, max_tokens=1, headers=h)
    r = c.complete(PROMPT, max_tokens=1, headers=h, perf_metrics_in_response=True)
    b = r.json()
    return (
        cached_tokens(r)
        == int(r.headers["fireworks-cached-prompt-tokens"])
        == b["perf_metrics"]["cached-prompt-tokens"]
    )


def cache_hit_1(c, bucket):
    h = {"x-multi-turn-session-id": "s1"}
    c.complete(PROMPT, max_tokens=1, headers=h)
    return cached_tokens(c.complete(PROMPT, max_tokens=1, headers=h)) > 0


def cache_nosession_1(c, bucket):
    step(bucket)
    c.complete(PROMPT, max_tokens=1)
    c.complete(PROMPT, max_tokens=1)
    c.hot_load({"identity": "step-1", "reset_prompt_cache": "new_session"})
    c.wait_for("step-1")
    return cached_tokens(c.complete(PROMPT, max_tokens=1)) == 0  # (this request caches afresh)


def cache_iso_1(c, bucket):
    h = {"x-multi-turn-session-id": "s1"}
    c.complete(PROMPT, max_tokens=1, headers=h | {"x-prompt-cache-isolation-key": "a"})
    return cached_tokens(c.complete(PROMPT, max_tokens=1, headers=h | {"x-prompt-cache-isolation-key": "b"})) == 0


def cache_eq_1(c, bucket):
    h = {"x-multi-turn-session-id": "s1"}
    a = c.complete(PROMPT, max_tokens=6, headers=h, logprobs=True).json()["choices"][0]["logprobs"]["content"]
    b = c.complete(PROMPT, max_tokens=6, headers=h, logprobs=True).json()["choices"][0]["logprobs"]["content"]
    return [x["token_id"] for x in a] == [y["token_id"] for y in b] and max(
        abs(x["logprob"] - y["logprob"]) for x, y in zip(a, b, strict=True)
    ) <= 1e-4


def hosts(c, headers_list):
    return {c.complete([1, 2], max_tokens=1, headers=h).headers["fireworks-backend-host"] for h in headers_list}


def sess_1(c, bucket):
    return len(hosts(c, [{"x-multi-turn-session-id": "alpha"}] * 6)) == 1


def sess_2(c, bucket):
    return all(
        len(hosts(c, [{"x-multi-turn-session-id": f"s{j}", "x-session-affinity": f"a{i}"} for i in range(6)])) == 1
        for j in range(3)
    )


def sess_3(c, bucket):
    return all(len(hosts(c, [{"x-session-affinity": f"beta{j}"}] * 6)) == 1 for j in range(3))


def ver_stream_1(c, bucket):
    return all("@" in ch["model"] for ch in chunks(stream_across_swap(c, bucket)))


def ver_nonstream_1(c, bucket):
    return c.complete([1, 2], max_tokens=1).json()["model"].endswith(f"@{BASE}")


def routed(c, **kw):
    return c.complete(PROMPT, max_tokens=4, logprobs=True, include_routing_matrix=True, **kw).json()["choices"][0][
        "logprobs"
    ]["content"]


def r3_shape_1(c, bucket):
    return all(len(matrix(e)) == L * K for e in routed(c))


def r3_range_1(c, bucket):
    return all((m < E).all() and all(len(set(row)) == K for row in m.reshape(L, K)) for m in map(matrix, routed(c)))


def r3_chat_1(c, bucket):
    body = {"model": c.dep.model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "temperature": 0,
            "logprobs": True, "include_routing_matrix": True}  # fmt: skip
    content = c.http.post("/inference/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"]
    return len(content) == 3 and all("routing_matrix" in e for e in content)


def r3_comp_1(c, bucket):
    return all("routing_matrix" in e for e in routed(c))


def r3_stream_1(c, bucket):
    with c.complete(PROMPT, stream=True, max_tokens=6, logprobs=True, include_routing_matrix=True) as r:
        es = entries_of(chunks(list(r.iter_lines())))
    return len(es) == 6 and all("routing_matrix" in e for e in es)


def r3_echo_1(c, bucket):
    es = routed(c, echo=True)
    return len(es) == len(PROMPT) + 4 and all("routing_matrix" in e for e in es)


def r3_echolast_1(c, bucket):
    return len(routed(c, echo_last=5)) == 5 + 4


def r3_det_1(c, bucket):
    return [e["routing_matrix"] for e in routed(c)] == [e["routing_matrix"] for e in routed(c)]


def r3_cache_1(c, bucket):
    h = {"x-multi-turn-session-id": "s1"}
    first = routed(c, echo=True, headers=h)
    second = routed(c, echo=True, headers=h)
    return [e["routing_matrix"] for e in first[: len(PROMPT)]] == [e["routing_matrix"] for e in second[: len(PROMPT)]]


def r3_change_1(c, bucket):
    before = [e["routing_matrix"] for e in routed(c, echo=True)[: len(PROMPT)]]
    step(bucket, only="mlp.gate.weight", scale=3.0)
    c.hot_load({"identity": "step-1"})
    c.wait_for("step-1")
    after = [e["routing_matrix"] for e in routed(c, echo=True)[: len(PROMPT)]]
    return before != after


def inf_sse_1(c, bucket):
    with c.complete(PROMPT, stream=True, max_tokens=3) as r:
        chs = chunks(list(r.iter_lines()))
    seen_usage = False
    for ch in chs:
        if "usage" in ch and ch["usage"] is None and seen_usage:
            return False
        seen_usage |= bool(ch.get("usage"))
    return True


def inf_logprobs_1(c, bucket):
    return all(e["logprob"] <= 0 for e in routed(c))


def inf_logprobs_1a(c, bucket):
    return all("sampling_logprob" in e for e in routed(c))


def inf_usage_1(c, bucket):
    body = c.complete(PROMPT, max_tokens=4, logprobs=True).json()
    return body["usage"]["completion_tokens"] == len(body["choices"][0]["logprobs"]["content"]) == 4


def inf_raw_1(c, bucket):
    raw = c.complete(PROMPT, max_tokens=3, echo=True, raw_output=True).json()["choices"][0]["raw_output"]
    return raw["completion_token_ids"][: len(PROMPT)] == PROMPT


def inf_tokenids_1(c, bucket):
    choice = c.complete(PROMPT, max_tokens=3, return_token_ids=True).json()["choices"][0]
    return choice.get("prompt_token_ids") == PROMPT and len(choice.get("token_ids", [])) == 3


def inf_perf_1(c, bucket):
    return "perf_metrics" in c.complete(PROMPT, max_tokens=2, perf_metrics_in_response=True).json()


def inf_err_1(c, bucket):
    return 400 <= c.http.post("/inference/v1/completions", content=b"{oops").status_code < 500


SWAPPY = {"replicas": 1, "token_delay": 0.02}
OBSERVATIONS = {
    "HL-AUTH-1": (hl_auth, {}),
    "HL-POST-1": (hl_post_1, {}),
    "HL-POST-2": (hl_post_2, {}),
    "HL-POST-2a": (hl_post_2a, {}),
    "HL-POST-3": (hl_post_3, {}),
    "HL-POST-3a": (hl_post_3a, {}),
    "HL-POST-4": (hl_post_4, {}),
    "HL-POST-5": (hl_post_5, {}),
    "HL-POST-5a": (hl_post_5a, {}),
    "HL-GET-1": (hl_get_1, {}),
    "HL-GET-1a": (hl_get_1a, {}),
    "HL-GET-2": (hl_get_2, {}),
    "HL-GET-3": (hl_get_3, {"load_delay": 0.3}),
    "HL-CONFIG-1": (hl_config_1, {}),
    "HL-CONFIG-2": (hl_config_2, {}),
    "HL-LEDGER-1": (hl_ledger_1, {}),
    "HL-HINT-1": (hl_hint_1, {}),
    "SNAP-ID-1": (snap_id_1, {}),
    "SWAP-ASYNC-1": (swap_async_1, SWAPPY),
    "SWAP-ASYNC-2": (swap_async_2, SWAPPY),
    "SWAP-ASYNC-3": (swap_async_3, {"replicas": 1, "swap_delay": 0.4}),
    "SWAP-ASYNC-4": (swap_async_4, {"replicas": 1, "swap_delay": 0.4}),
    "SWAP-SYNC-1": (swap_sync_1, SWAPPY | {"transition": "SYNC"}),
    "SWAP-SYNC-2": (swap_sync_2, SWAPPY | {"transition": "SYNC", "swap_delay": 0.2}),
    "SWAP-NEW-1": (swap_new_1, {"replicas": 1}),
    "SWAP-KV-1": (swap_kv_1, SWAPPY),
    "CACHE-RPT-1": (cache_rpt_1, {}),
    "CACHE-HIT-1": (cache_hit_1, {}),
    "CACHE-NOSESSION-1": (cache_nosession_1, {"replicas": 1}),
    "CACHE-ISO-1": (cache_iso_1, {}),
    "CACHE-EQ-1": (cache_eq_1, {}),
    "SESS-1": (sess_1, {}),
    "SESS-2": (sess_2, {}),
    "SESS-3": (sess_3, {}),
    "VER-STREAM-1": (ver_stream_1, SWAPPY),
    "VER-NONSTREAM-1": (ver_nonstream_1, {}),
    "R3-SHAPE-1": (r3_shape_1, {}),
    "R3-RANGE-1": (r3_range_1, {}),
    "R3-CHAT-1": (r3_chat_1, {}),
    "R3-COMP-1": (r3_comp_1, {}),
    "R3-STREAM-1": (r3_stream_1, {}),
    "R3-ECHO-1": (r3_echo_1, {}),
    "R3-ECHOLAST-1": (r3_echolast_1, {}),
    "R3-DET-1": (r3_det_1, {}),
    "R3-CACHE-1": (r3_cache_1, {}),
    "R3-CHANGE-1": (r3_change_1, {"replicas": 1}),
    "INF-SSE-1": (inf_sse_1, {}),
    "INF-LOGPROBS-1": (inf_logprobs_1, {}),
    "INF-LOGPROBS-1a": (inf_logprobs_1a, {}),
    "INF-USAGE-1": (inf_usage_1, {}),
    "INF-RAW-1": (inf_raw_1, {}),
    "INF-TOKENIDS-1": (inf_tokenids_1, {}),
    "INF-PERF-1": (inf_perf_1, {}),
    "INF-ERR-1": (inf_err_1, {}),
}
# each matrix cell: (policy, who) and whether reuse is expected
for cell, (policy, who, reuse) in {
    "CACHE-MATRIX-ALL-SAME": ("all", "same", False),
    "CACHE-MATRIX-ALL-NEW": ("all", "new", False),
    "CACHE-MATRIX-NS-SAME": ("new_session", "same", True),
    "CACHE-MATRIX-NS-NEW": ("new_session", "new", False),
    "CACHE-MATRIX-NONE-SAME": ("none", "same", True),
    "CACHE-MATRIX-NONE-NEW": ("none", "new", True),
}.items():
    OBSERVATIONS[cell] = (matrix_cell(policy, who, reuse), {"replicas": 1})
for clause in FAULTS:
    if clause.startswith("SNAP-") and clause != "SNAP-ID-1":
        OBSERVATIONS[clause] = (snap_at_load(clause), {})


def test_every_fault_switch_has_an_observation():
    assert set(OBSERVATIONS) == set(FAULTS)


def test_unknown_fault_names_are_refused(tmp_path):
    from pytest_rlrollout.deployment import Settings

    with pytest.raises(ValueError, match="unknown fault"):
        Settings(bucket=tmp_path, faults=frozenset({"HL-NOPE-1"}))


@pytest.mark.parametrize("clause", sorted(FAULTS))
def test_fault_switch_breaks_its_clause(start, bucket, tmp_path, clause):
    observe, settings = OBSERVATIONS[clause]
    healthy_bucket = tmp_path / "healthy"
    shutil.copytree(bucket, healthy_bucket)
    from pytest_rlrollout.deployment import reference_deployment

    with reference_deployment(healthy_bucket, **settings) as healthy:
        assert observe(Client(healthy), healthy_bucket) is True, f"{clause} does not hold without faults"
    assert observe(Client(start(faults=frozenset({clause}), **settings)), bucket) is False, (
        f"{clause} still holds with its fault on"
    )
