"""INF — inference response shapes. Read-only: these tests never change the deployment's state."""

import json

import pytest

clause = pytest.mark.rl_clause
WHITELIST = ("stop", "length", "tool_calls")
PROMPT = list(range(10, 42))


def stream(rl_deployment, **body):
    return rl_deployment.complete({"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True, **body})


@clause("INF-SSE-1")
def test_streams_are_well_formed_sse(rl_deployment):
    s = stream(rl_deployment, logprobs=True)
    assert s.status == 200
    assert s.done, "the stream did not end with data: [DONE] (or its last event had no blank line)"
    assert s.finish_reason in WHITELIST, f"finish_reason {s.finish_reason!r} before [DONE]"
    seen_usage = False
    for i, chunk in enumerate(s.chunks):
        if "usage" in chunk:
            assert not (seen_usage and chunk["usage"] is None), f"chunk {i} sends 'usage': null after the real usage"
            seen_usage |= chunk["usage"] is not None


@clause("INF-LOGPROBS-1")
def test_logprobs_entries(rl_deployment):
    entries = stream(rl_deployment, logprobs=True).entries
    assert len(entries) == 6
    for e in entries:
        assert isinstance(e.get("token"), str), e
        assert isinstance(e.get("token_id"), int) and not isinstance(e["token_id"], bool), e
        assert isinstance(e.get("logprob"), (int, float)) and e["logprob"] <= 0, e


@clause("INF-LOGPROBS-1a")
def test_logprobs_carry_sampling_logprob(rl_deployment):
    entries = stream(rl_deployment, logprobs=True).entries
    missing = [i for i, e in enumerate(entries) if "sampling_logprob" not in e]
    assert not missing, f"entries {missing} have no sampling_logprob"


@clause("INF-USAGE-1")
def test_usage_matches_the_tokens(rl_deployment):
    for s in (
        stream(rl_deployment, logprobs=True),
        rl_deployment.complete({"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": True}),
    ):
        usage = s.usage
        assert usage is not None, "no usage"
        assert usage["prompt_tokens"] == len(PROMPT)
        assert usage["completion_tokens"] == len(s.entries)
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@clause("INF-RAW-1")
def test_raw_output(rl_deployment):
    for echo in (False, True):
        s = stream(rl_deployment, raw_output=True, echo=echo)
        raw = next(
            (c["choices"][0].get("raw_output") for c in reversed(s.chunks) if c["choices"][0].get("raw_output")), None
        )
        assert raw is not None, "no raw_output"
        assert {"prompt_token_ids", "completion_token_ids", "completion"} <= set(raw), sorted(raw)
        assert raw["prompt_token_ids"] == PROMPT
        if echo:
            assert raw["completion_token_ids"][: len(PROMPT)] == PROMPT, (
                "with echo, completion_token_ids must start with the prompt"
            )


@clause("INF-TOKENIDS-1")
def test_return_token_ids(rl_deployment):
    s = rl_deployment.complete(
        {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "return_token_ids": True, "logprobs": True}
    )
    choice = s.final["choices"][0]
    assert choice.get("prompt_token_ids") == PROMPT
    assert choice.get("token_ids") == [e["token_id"] for e in s.entries]


@clause("INF-PERF-1")
def test_perf_metrics(rl_deployment):
    for s in (
        stream(rl_deployment, perf_metrics_in_response=True),
        rl_deployment.complete({"prompt": PROMPT, "max_tokens": 3, "perf_metrics_in_response": True}),
    ):
        perf = s.final.get("perf_metrics")
        assert isinstance(perf, dict), "no perf_metrics on the final chunk / body"
        assert {"prompt-tokens", "cached-prompt-tokens", "server-time-to-first-token"} <= set(perf), sorted(perf)


def _with_model(target, **fields) -> bytes:
    return json.dumps({"model": target.deployment, **fields}).encode()


MALFORMED = {
    "bad-json": lambda t: b"{not json",
    "not-an-object": lambda t: b"[1, 2]",
    "no-model": lambda t: json.dumps({"prompt": "x"}).encode(),
    "negative-max-tokens": lambda t: _with_model(t, prompt=[1], max_tokens=-1),
    "string-temperature": lambda t: _with_model(t, prompt="x", temperature="hot"),
    "huge-max-tokens": lambda t: _with_model(t, prompt=[1], max_tokens=10**9),
}


@clause("INF-ERR-1")
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_requests_get_4xx_json(rl_deployment, case):
    r = rl_deployment.post_inference(MALFORMED[case](rl_deployment.target))
    assert 400 <= r.status_code < 500, f"{r.status_code}: {r.text[:200]}"
    doc = r.json()
    assert isinstance((doc.get("error") or {}).get("message"), str) or (
        r.status_code == 422 and isinstance(doc.get("detail"), list)
    ), doc
