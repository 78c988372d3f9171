"""INF — inference response shapes. Read-only: these tests never change the deployment's state.

INF-SSE-1, INF-USAGE-1 and INF-ERR-1 hold any OpenAI-compatible server: they send plain OpenAI
requests. The others judge Fireworks extensions, each asked for alone.
"""

import json

import httpx
import pytest

from pytest_rlrollout.remote.stream import json_object
from pytest_rlrollout.suite.marks import clause, requires
from pytest_rlrollout.suite.outcomes import not_applicable, unsupported
from pytest_rlrollout.suite.testing import WHITELIST

TOKENS = 6


def ask(rl_deployment, name, **body):
    """A completion of this test's own prompt, `TOKENS` tokens at most."""
    return rl_deployment.complete({"prompt": rl_deployment.prompt(name).body, "max_tokens": TOKENS, **body})


@clause("INF-SSE-1")
def test_streams_are_well_formed_sse(rl_deployment, rl_observe):
    """Streams are SSE: each event ends with a blank line; a successful stream ends with data: [DONE] after a chunk with
    a whitelisted finish_reason; no 'usage': null follows a real usage."""
    s = ask(rl_deployment, "inf-sse", stream=True, stream_options={"include_usage": True}).expect_ok("the stream")
    assert not s.unterminated, "the stream's last event was not ended by a blank line"
    assert s.done, f"the stream did not end with data: [DONE]; its last event: {(s.events or [''])[-1][:200]!r}"
    assert s.chunks, "the stream carried no chunk before [DONE]"
    assert s.finish_reason in WHITELIST, f"finish_reason {s.finish_reason!r} before [DONE]"
    seen_usage = False
    for i, chunk in enumerate(s.chunks):
        if "usage" in chunk:
            assert not (seen_usage and chunk["usage"] is None), f"chunk {i} sends 'usage': null after the real usage"
            seen_usage |= chunk["usage"] is not None
    rl_observe(len(s.events), "SSE events, each ended by a blank line, the last one [DONE]")
    rl_observe(1, f"finish_reason {s.finish_reason!r}")


def judged_usage(how: str, s, prompt, counted: bool) -> int:
    """INF-USAGE-1 on one answer: its usage adds up and matches the tokens returned; its prompt's count."""
    usage = s.usage
    assert isinstance(usage, dict), f"the {how} completion carries no usage"
    p, c, total = (usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    assert all(isinstance(v, int) and v >= 0 for v in (p, c, total)), f"{how} usage: {usage}"
    assert total == p + c, f"{how} usage: total_tokens {total} != {p} + {c}"
    if counted:
        assert c == len(s.entries), f"{how}: usage.completion_tokens is {c}, {len(s.entries)} tokens were returned"
    elif s.finish_reason == "length":
        assert c == TOKENS, f"{how}: stopped at max_tokens={TOKENS}, usage.completion_tokens is {c}"
    else:
        assert c <= TOKENS, f"{how}: usage.completion_tokens {c} > max_tokens {TOKENS}"
    if prompt.ids is not None:
        assert p == len(prompt.ids), f"{how}: usage.prompt_tokens is {p} for a prompt of {len(prompt.ids)} tokens"
    return p


@clause("INF-USAGE-1")
@pytest.mark.parametrize("how", ["non-streamed", "streamed"])
def test_usage_matches_the_tokens(rl_deployment, rl_observe, how):
    """usage.prompt_tokens, completion_tokens and total_tokens are consistent with the tokens returned."""
    # Usage adds up and counts the tokens returned. A stream's usage is an option
    # (`stream_options.include_usage`): a server that streams none when asked does not offer it,
    # and that is `unsupported`, never the clause's fail; its non-streamed answers are judged.
    prompt = rl_deployment.prompt("inf-usage")
    counted = rl_deployment.capabilities.has("logprobs")  # then every returned token has an entry
    extra = {"logprobs": True} if counted else {}
    answer = ask(rl_deployment, "inf-usage", **extra).expect_ok("the non-streamed completion")
    p = judged_usage("non-streamed", answer, prompt, counted)
    if how == "streamed":
        s = ask(rl_deployment, "inf-usage", stream=True, stream_options={"include_usage": True}, **extra)
        s.expect_ok("the streamed completion")
        if s.usage is None:
            unsupported(
                "stream_options.include_usage: asked for, and the stream carried no usage (its "
                "non-streamed answers are judged by the non-streamed test)"
            )
        streamed = judged_usage("streamed", s, prompt, counted)
        assert streamed == p, f"the same prompt counts differently: {streamed} streamed, {p} not"
        rl_observe(1, f"a streamed answer whose usage adds up, its prompt counted as the non-streamed one ({p})")
    else:
        rl_observe(1, "a non-streamed answer whose usage adds up")
    rl_observe(1, "prompt of " + (f"{len(prompt.ids)} known tokens" if prompt.ids else "text"))


@clause("INF-LOGPROBS-1")
@requires("logprobs")
def test_logprobs_entries(rl_deployment, rl_observe):
    """logprobs: true gives choices[].logprobs.content[] entries with token (str), logprob (number <= 0) and token_id
    (int)."""
    s = ask(rl_deployment, "inf-logprobs", stream=True, logprobs=True).expect_ok()
    entries = s.entries
    assert entries, "logprobs: true, and no choice carries logprobs.content entries"
    for i, e in enumerate(entries):
        assert isinstance(e.get("token"), str), f"entry {i}: token {e.get('token')!r}"
        token_id = e.get("token_id")
        assert isinstance(token_id, int) and not isinstance(token_id, bool), f"entry {i}: token_id {token_id!r}"
        logprob = e.get("logprob")
        assert isinstance(logprob, int | float) and not isinstance(logprob, bool), f"entry {i}: logprob {logprob!r}"
        assert logprob <= 0, f"entry {i}: logprob {logprob} > 0"
    rl_observe(len(entries), "logprobs entries with token, token_id and logprob <= 0")


@clause("INF-LOGPROBS-1a")
@requires("logprobs")
def test_logprobs_carry_sampling_logprob(rl_deployment, rl_observe):
    """Each logprobs entry also carries sampling_logprob."""
    entries = ask(rl_deployment, "inf-logprobs-1a", stream=True, logprobs=True).expect_ok().entries
    assert entries, "logprobs: true, and no choice carries logprobs.content entries (see INF-LOGPROBS-1)"
    missing = [i for i, e in enumerate(entries) if "sampling_logprob" not in e]
    assert not missing, f"entries {missing} of {len(entries)} have no sampling_logprob"
    rl_observe(len(entries), "entries with sampling_logprob")


@clause("INF-RAW-1")
@requires("raw_output")
def test_raw_output(rl_deployment, rl_observe):
    """raw_output: true gives raw_output.prompt_token_ids, completion_token_ids and completion; with echo,
    completion_token_ids starts with the prompt ids."""
    prompt = rl_deployment.prompt("inf-raw")
    for echo in (False, True):
        s = ask(rl_deployment, "inf-raw", stream=True, raw_output=True, echo=echo).expect_ok()
        raw = s.choice_field("raw_output")
        assert isinstance(raw, dict), f"echo={echo}: no raw_output object on any choice"
        missing = {"prompt_token_ids", "completion_token_ids", "completion"} - set(raw)
        assert not missing, f"echo={echo}: raw_output lacks {sorted(missing)}"
        ids, completion = raw["prompt_token_ids"], raw["completion_token_ids"]
        assert isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids), f"prompt_token_ids {ids!r}"
        if prompt.ids is not None:
            assert ids == prompt.ids, f"raw_output.prompt_token_ids {ids} is not the prompt {prompt.ids}"
        if echo:
            assert completion[: len(ids)] == ids, "with echo, completion_token_ids must start with the prompt"
        rl_observe(1, f"raw_output with{'' if echo else 'out'} echo")


@clause("INF-TOKENIDS-1")
@requires("token_ids")
def test_return_token_ids(rl_deployment, rl_observe):
    """return_token_ids: true gives prompt_token_ids and token_ids."""
    prompt = rl_deployment.prompt("inf-tokenids")
    counted = rl_deployment.capabilities.has("logprobs")
    s = ask(rl_deployment, "inf-tokenids", return_token_ids=True, **({"logprobs": True} if counted else {}))
    s.expect_ok()
    prompt_ids, token_ids = s.choice_field("prompt_token_ids"), s.choice_field("token_ids")
    assert isinstance(prompt_ids, list) and prompt_ids, f"prompt_token_ids is {prompt_ids!r}"
    assert isinstance(token_ids, list), f"token_ids is {token_ids!r}"
    if prompt.ids is not None:
        assert prompt_ids == prompt.ids, f"prompt_token_ids {prompt_ids} is not the prompt {prompt.ids}"
    if counted:
        returned = [e.get("token_id") for e in s.entries]
        assert token_ids == returned, f"token_ids {token_ids}; the logprobs entries name {returned}"
    else:
        n = (s.usage or {}).get("completion_tokens")
        assert len(token_ids) == n, f"{len(token_ids)} token_ids, usage.completion_tokens is {n}"
    rl_observe(len(prompt_ids), "prompt token ids")
    rl_observe(len(token_ids), "completion token ids matching the tokens returned")


PERF_KEYS = {"prompt-tokens", "cached-prompt-tokens", "server-time-to-first-token"}


@clause("INF-PERF-1")
@requires("perf_metrics")
def test_perf_metrics(rl_deployment, rl_observe):
    """perf_metrics_in_response: true puts perf_metrics (prompt-tokens, cached-prompt-tokens,
    server-time-to-first-token) on the final streamed chunk or the response body."""
    for how, s in (
        ("streamed", ask(rl_deployment, "inf-perf", stream=True, perf_metrics_in_response=True)),
        ("non-streamed", ask(rl_deployment, "inf-perf", perf_metrics_in_response=True)),
    ):
        s.expect_ok(f"the {how} completion")
        # the final chunk: the one with the finish_reason, or a usage-only chunk after it
        final = s.chunks[s.chunks.index(s.final) :] if s.chunks else []
        perf = next((c["perf_metrics"] for c in final if isinstance(c.get("perf_metrics"), dict)), None)
        assert isinstance(perf, dict), f"{how}: no perf_metrics on the final chunk / body"
        assert set(perf) >= PERF_KEYS, f"{how}: perf_metrics lacks {sorted(PERF_KEYS - set(perf))}"
        rl_observe(1, f"{how} perf_metrics with {', '.join(sorted(PERF_KEYS))}")


def _body(rl_deployment, **fields) -> bytes:
    return json.dumps({"model": rl_deployment.target.body_model, "prompt": "Hello", **fields}).encode()


# case -> (request body, whether only a deployment addressed by name must refuse it)
MALFORMED = {
    "bad-json": (lambda d: b"{not json", False),
    "not-an-object": (lambda d: b"[1, 2]", False),
    "negative-max-tokens": (lambda d: _body(d, max_tokens=-1), False),
    "string-temperature": (lambda d: _body(d, max_tokens=1, temperature="hot"), False),
    # a deployment is addressed by name; a server of one model may serve it whatever the body names
    "no-model": (lambda d: json.dumps({"prompt": "Hello", "max_tokens": 1}).encode(), True),
    # past the context: a server of one model may instead generate until its own limit
    "huge-max-tokens": (lambda d: _body(d, max_tokens=10**9), True),
}


@clause("INF-ERR-1")
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_requests_get_4xx_json(rl_deployment, rl_observe, case):
    """Malformed requests get a 4xx with a JSON error body ({'error': {'message', ...}} or 422 {'detail': [...]}); never
    a 5xx, never a dropped connection."""
    make, by_name = MALFORMED[case]
    if by_name and not rl_deployment.target.by_name:
        not_applicable(f"only a deployment addressed by name (--rl-deployment) must refuse {case}")
    try:
        r = rl_deployment.post_inference(make(rl_deployment))
    except httpx.HTTPError as e:
        pytest.fail(f"{case}: the connection failed instead of a 4xx ({type(e).__name__}: {e})", pytrace=False)
    assert 400 <= r.status_code < 500, f"{case}: HTTP {r.status_code}: {r.text[:200]!r}"
    doc = json_object(r)
    assert doc is not None, f"{case}: the {r.status_code} body is not a JSON object: {r.text[:200]!r}"
    error = doc.get("error")
    assert (isinstance(error, dict) and isinstance(error.get("message"), str)) or (
        r.status_code == 422 and isinstance(doc.get("detail"), list)
    ), f"{case}: neither {{'error': {{'message'}}}} nor 422 {{'detail': [...]}}: {r.text[:200]!r}"
    rl_observe(1, f"HTTP {r.status_code} with a JSON error body for {case}")
