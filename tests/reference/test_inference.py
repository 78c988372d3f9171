"""Completions and chat completions of the reference deployment (INF, R3, CACHE, SESS, VER)."""

import base64
import json

import numpy as np
import pytest

from pytest_rlrollout.snapshot import tiny_moe

L, K, E = 3, 2, 8  # the reference model: 3 MoE layers, top-2 of 8 experts
PROMPT = list(range(10, 90))  # 80 tokens: five cache blocks


def sse(lines):
    events = [line for line in lines if line]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


def routes(entries):
    return [np.frombuffer(base64.b64decode(e["routing_matrix"]), np.uint8).reshape(L, K) for e in entries]


def test_completion_shapes(client):
    r = client.complete(
        PROMPT,
        max_tokens=5,
        logprobs=True,
        include_routing_matrix=True,
        raw_output=True,
        return_token_ids=True,
        perf_metrics_in_response=True,
    )
    assert r.status_code == 200
    body = r.json()
    [choice] = body["choices"]
    entries = choice["logprobs"]["content"]
    assert len(entries) == 5 == body["usage"]["completion_tokens"]
    assert body["usage"]["prompt_tokens"] == 80 and body["usage"]["total_tokens"] == 85
    assert all(isinstance(e["token"], str) and e["logprob"] <= 0 and isinstance(e["token_id"], int) for e in entries)
    assert all(e["sampling_logprob"] == 0.0 for e in entries)  # greedy: the behaviour policy is deterministic
    for m in routes(entries):
        assert (m < E).all() and all(len(set(row)) == K for row in m)
    assert choice["raw_output"]["completion_token_ids"] == [e["token_id"] for e in entries] == choice["token_ids"]
    assert choice["raw_output"]["prompt_token_ids"] == PROMPT == choice["prompt_token_ids"]
    assert body["perf_metrics"]["prompt-tokens"] == 80
    assert body["model"] == f"{client.dep.name}@{tiny_moe.BASE_IDENTITY}"


def test_stream_carries_version_routing_and_ends_properly(client):
    with client.complete(
        PROMPT, stream=True, max_tokens=6, logprobs=True, include_routing_matrix=True, perf_metrics_in_response=True
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = sse(r.iter_lines())
    assert all(c["model"] == f"{client.dep.name}@{tiny_moe.BASE_IDENTITY}" for c in chunks)
    entries = [e for c in chunks for e in (c["choices"][0]["logprobs"] or {}).get("content", [])]
    assert len(entries) == 6 == chunks[-1]["usage"]["completion_tokens"]
    assert len(routes(entries)) == 6
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert "perf_metrics" in chunks[-1] and all("usage" not in c for c in chunks[:-1])


def test_echo_and_echo_last_return_prompt_routing(client):
    body = client.complete(
        PROMPT, max_tokens=3, echo=True, logprobs=True, include_routing_matrix=True, raw_output=True
    ).json()
    entries = body["choices"][0]["logprobs"]["content"]
    assert len(entries) == 80 + 3
    assert [e["token_id"] for e in entries[:80]] == PROMPT
    assert body["choices"][0]["raw_output"]["completion_token_ids"][:80] == PROMPT
    last = client.complete(
        PROMPT, max_tokens=3, echo_last=7, logprobs=True, include_routing_matrix=True, raw_output=True
    ).json()
    lentries = last["choices"][0]["logprobs"]["content"]
    assert len(lentries) == 7 + 3 and [e["token_id"] for e in lentries[:7]] == PROMPT[-7:]
    assert [r.tolist() for r in routes(lentries[:7])] == [r.tolist() for r in routes(entries[73:80])]


def test_probe_with_zero_max_tokens(client):
    body = client.complete("R3 compatibility check.", max_tokens=0, echo=True, logprobs=True).json()
    assert body["usage"]["completion_tokens"] == 0 and len(body["choices"][0]["logprobs"]["content"]) > 0


def test_routing_is_deterministic(client):
    a = client.complete(PROMPT, max_tokens=4, logprobs=True, include_routing_matrix=True).json()
    b = client.complete(PROMPT, max_tokens=4, logprobs=True, include_routing_matrix=True).json()
    assert a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"]


def cached(r):
    body = r.json()
    channels = {
        body["usage"]["prompt_tokens_details"]["cached_tokens"],
        int(r.headers["fireworks-cached-prompt-tokens"]),
        body["perf_metrics"]["cached-prompt-tokens"],
    }
    assert len(channels) == 1, channels
    return channels.pop()


def test_cache_hit_agrees_across_channels_and_does_not_change_results(client):
    h = {"x-multi-turn-session-id": "s1"}
    kw = dict(max_tokens=6, logprobs=True, include_routing_matrix=True, echo=True, perf_metrics_in_response=True)
    first = client.complete(PROMPT, headers=h, **kw)
    second = client.complete(PROMPT, headers=h, **kw)
    assert cached(first) == 0 and cached(second) == 64  # 79 usable tokens: four 16-token blocks
    a, b = first.json()["choices"][0]["logprobs"]["content"], second.json()["choices"][0]["logprobs"]["content"]
    assert [e["token_id"] for e in a] == [e["token_id"] for e in b]
    assert max(abs(x["logprob"] - y["logprob"]) for x, y in zip(a, b, strict=True)) < 1e-4
    assert [x["routing_matrix"] for x in a] == [y["routing_matrix"] for y in b]  # R3-CACHE-1


def test_isolation_keys_never_share_cache_entries(client):
    h = {"x-multi-turn-session-id": "s1"}
    kw = dict(max_tokens=1, perf_metrics_in_response=True)
    client.complete(PROMPT, headers=h | {"x-prompt-cache-isolation-key": "a"}, **kw)
    assert cached(client.complete(PROMPT, headers=h | {"x-prompt-cache-isolation-key": "b"}, **kw)) == 0
    assert cached(client.complete(PROMPT, headers=h, prompt_cache_isolation_key="a", **kw)) == 64


def test_prompt_cache_max_len(client):
    h = {"x-multi-turn-session-id": "s1"}
    client.complete(PROMPT, headers=h, max_tokens=1, perf_metrics_in_response=True)
    assert (
        cached(client.complete(PROMPT, headers=h, max_tokens=1, perf_metrics_in_response=True, prompt_cache_max_len=40))
        == 32
    )


def test_session_affinity(client):
    hosts = {
        client.complete([1, 2], max_tokens=1, headers={"x-multi-turn-session-id": "alpha"}).headers[
            "fireworks-backend-host"
        ]
        for _ in range(6)
    }
    assert len(hosts) == 1
    both = {
        client.complete(
            [1, 2], max_tokens=1, headers={"x-multi-turn-session-id": "alpha", "x-session-affinity": f"z{i}"}
        ).headers["fireworks-backend-host"]
        for i in range(6)
    }
    assert both == hosts
    spread = {
        client.complete([1, 2], max_tokens=1, headers={"x-session-affinity": f"k{i}"}).headers["fireworks-backend-host"]
        for i in range(12)
    }
    assert len(spread) == 2
    assert {
        client.complete([1, 2], max_tokens=1, headers={"x-session-affinity": "beta"}).headers["fireworks-backend-host"]
        for _ in range(4)
    }.__len__() == 1


def test_chat_completions(client):
    r = client.http.post(
        "/v1/chat/completions",
        json={
            "model": client.dep.model,
            "messages": [{"role": "user", "content": "hello world"}],
            "max_tokens": 4,
            "temperature": 0,
            "logprobs": True,
            "include_routing_matrix": True,
        },
    )
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert len(routes(body["choices"][0]["logprobs"]["content"])) == 4


def test_request_id_is_echoed(client):
    assert client.complete([1], max_tokens=1, headers={"x-request-id": "abc123"}).headers["x-request-id"] == "abc123"


@pytest.mark.parametrize(
    "body",
    [
        {"model": None, "prompt": [1, 2]},
        {"model": 5, "prompt": [1]},
        {"prompt": "x", "max_tokens": -1},
        {"prompt": "x", "max_tokens": 10**9},
        {"prompt": [1, 2, 10**6]},
        {"prompt": []},
        {"prompt": "x", "temperature": "hot"},
        {"prompt": "x", "n": 2},
        {"prompt": "x", "stop": 5},
        {"prompt": {"a": 1}},
        {"prompt": "x", "routing_matrix_format": "parquet_v1"},
    ],
)
def test_malformed_requests_get_4xx_json(client, body):
    payload = {"model": client.dep.name, **body}
    r = client.http.post("/inference/v1/completions", json=payload)
    assert 400 <= r.status_code < 500 and isinstance(r.json()["error"]["message"], str)


def test_parquet_negotiation_answer_is_the_sdk_fallback_wording(client):
    r = client.complete("x", routing_matrix_format="parquet_v1")
    assert (
        r.status_code == 400
        and r.json()["error"]["message"] == "Extra inputs are not permitted, field: 'routing_matrix_format'"
    )


@pytest.mark.parametrize(
    ("method", "path", "data"),
    [
        ("POST", "/inference/v1/completions", b"{not json"),
        ("GET", "/nope", None),
        ("POST", "/inference/v1/completions", b"[1, 2]"),
        ("GET", "/inference/v1/completions", None),
    ],
)
def test_garbage_and_unknown_paths(client, method, path, data):
    r = client.http.request(method, path, content=data)
    assert 400 <= r.status_code < 500 and "message" in r.json()["error"]


def test_auth_on_inference(client):
    r = client.http.post(
        "/inference/v1/completions",
        json={"model": client.dep.name, "prompt": [1]},
        headers={"Authorization": "Bearer no"},
    )
    assert r.status_code == 401


def test_stop_strings_and_seeded_sampling(client):
    a = client.complete(PROMPT, max_tokens=8, temperature=1.0, seed=7, logprobs=True).json()
    b = client.complete(PROMPT, max_tokens=8, temperature=1.0, seed=7, logprobs=True).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    entries = a["choices"][0]["logprobs"]["content"]
    assert all(e["sampling_logprob"] <= 0 for e in entries)
    text = a["choices"][0]["text"]
    if len(text) > 2:
        stopped = client.complete(PROMPT, max_tokens=8, temperature=1.0, seed=7, stop=[text[1:3]]).json()
        assert stopped["choices"][0]["finish_reason"] == "stop" and text[1:3] not in stopped["choices"][0]["text"]
