"""The reference deployment speaking vLLM 0.32's dialect: every route answers as the measured
server does (legacy completions logprobs, prompt_logprobs, token ids, usage-only last chunks,
weight_versions spans, pydantic-style 400s), and the
project's vLLM driver works against it as against a real vLLM server. Pause, labels, reloads and
cache resets are in test_vllm_control.py; the fault switches in test_vllm_faults.py."""

import base64
import json

import numpy as np
import pytest

from pytest_rlrollout.reference.model import Model, Sequence_
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.drivers import driver_for
from pytest_rlrollout.remote.preflight import preflight
from pytest_rlrollout.remote.target import Target

from .vllm_support import BASE, LONG, SHORT, VllmClient, close, local_prompt_logprobs, step


@pytest.fixture
def vllm(start):
    c = VllmClient(start(engine="vllm"))
    yield c
    c.http.close()


def sse(r) -> list[dict]:
    lines = [x for x in r.text.split("\n") if x]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    return [json.loads(x[6:]) for x in lines[:-1]]


# --------------------------------------------------------------------------- the server


def test_version_health_and_models(vllm):
    assert vllm.http.get("/version").json() == {"version": "0.32.0"}
    health = vllm.http.get("/health")
    assert health.status_code == 200 and health.content == b""
    models = vllm.http.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    card = models["data"][0]
    assert card["owned_by"] == "vllm" and card["max_model_len"] == 2048 and card["root"].endswith(BASE)
    assert vllm.http.get("/nope").json() == {"detail": "Not Found"}
    assert vllm.http.get("/v1/completions").status_code == 405
    # nothing of the Fireworks dialect answers here
    assert vllm.http.get("/hot_load/v1/models/hot_load").status_code == 404
    assert vllm.http.get("/v1/accounts").status_code == 404


def test_one_replica_and_the_short_model_name_by_default(start):
    dep = start(engine="vllm")
    assert dep.model == "tiny" and len(dep.deployment.replicas) == 1 and dep.inference_url == dep.base_url
    assert len(start(engine="vllm", replicas=2).deployment.replicas) == 2


# --------------------------------------------------------------------------- /v1/completions


def test_completion_shape(vllm):
    r = vllm.complete([10, 11, 12], max_tokens=5)
    assert r.status_code == 200
    doc = r.json()
    assert list(doc) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert doc["id"].startswith("cmpl-") and doc["object"] == "text_completion" and doc["model"] == "tiny"
    assert doc["system_fingerprint"].startswith("vllm-0.32.0-")
    [choice] = doc["choices"]
    assert list(choice) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
        "routed_experts",
    ]
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None and choice["token_ids"] is None
    assert doc["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 8,
        "completion_tokens": 5,
        "completion_tokens_details": None,
        "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": None, "multimodal_tokens": None},
    }
    assert "\ufffd" not in choice["text"][-1:]  # vLLM never lets out an unfinished character at the end


def test_text_prompts_are_tokenized_as_vllm_does(vllm):
    doc = vllm.complete("hello world what is", max_tokens=3, logprobs=2).json()
    assert doc["usage"]["prompt_tokens"] == 9  # as the measured server counts them
    lp = doc["choices"][0]["logprobs"]
    assert list(lp) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
    assert len(lp["tokens"]) == 3 and all(x <= 0 for x in lp["token_logprobs"])
    assert all(1 <= len(top) <= 3 for top in lp["top_logprobs"])  # the sampled token and the 2 best


def test_legacy_logprobs_with_echo_start_with_a_null_entry(vllm):
    doc = vllm.complete([10, 11, 12], max_tokens=2, logprobs=1, echo=True).json()
    [choice] = doc["choices"]
    lp = choice["logprobs"]
    assert lp["tokens"][:3] == ["(", ")", "*"] and choice["text"].startswith("()*")
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"][:4] == [0, 1, 2, 3] and len(lp["tokens"]) == 5
    # echo with logprobs scores the prompt too: per position, by token-id string, the first null
    plp = choice["prompt_logprobs"]
    assert plp[0] is None and len(plp) == 3
    assert set(plp[1]) >= {"11"} and set(plp[1]["11"]) == {"logprob", "rank", "decoded_token"}
    assert plp[1]["11"]["logprob"] == lp["token_logprobs"][1] and plp[1]["11"]["decoded_token"] == ")"
    assert len(plp[1]) == 2 and any(v["rank"] == 1 for v in plp[1].values())  # the token and the best one


def test_prompt_logprobs_match_the_numpy_engine(vllm, bucket):
    doc = vllm.complete([10, 11, 12], max_tokens=2, prompt_logprobs=0).json()
    plp = doc["choices"][0]["prompt_logprobs"]
    assert [list(p) for p in plp[1:]] == [["11"], ["12"]]
    served = [plp[1]["11"]["logprob"], plp[2]["12"]["logprob"]]
    assert close(served, local_prompt_logprobs(bucket / BASE, [10, 11, 12]), 1e-5)


def test_return_token_ids(vllm):
    choice = vllm.complete([10, 11, 12], max_tokens=2, return_token_ids=True).json()["choices"][0]
    assert choice["prompt_token_ids"] == [10, 11, 12] and len(choice["token_ids"]) == 2


def test_completion_stream_ends_with_a_usage_only_chunk(vllm):
    r = vllm.complete(
        [10, 11, 12],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
        logprobs=1,
        return_token_ids=True,
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = sse(r)
    *tokens, usage = chunks
    assert [len(c["choices"][0]["token_ids"]) for c in tokens] == [1, 1, 1]  # the finish rides on the last token
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None, None, "length"]
    assert tokens[0]["choices"][0]["prompt_token_ids"] == [10, 11, 12]
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in tokens[1:])
    assert list(tokens[0]["choices"][0]) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "prompt_token_ids",
        "token_ids",
    ]
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 6,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert "system_fingerprint" in usage and "system_fingerprint" not in tokens[-1]
    plain = sse(vllm.complete([10, 11, 12], max_tokens=2, stream=True))
    assert all("usage" not in c for c in plain) and "system_fingerprint" in plain[-1]


def test_stop_strings_set_stop_reason(vllm):
    text = vllm.complete("hello world what is", max_tokens=3).json()["choices"][0]["text"]
    stop = text[1:3]
    choice = vllm.complete("hello world what is", max_tokens=3, stop=[stop]).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop and stop not in choice["text"]


def test_an_end_of_sequence_token_stops_with_no_stop_reason(vllm):
    # measured: greedy from [1, 50, 60] reaches the end of sequence (id 2) after 22 tokens
    choice = vllm.complete([1, 50, 60], max_tokens=40, return_token_ids=True).json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert choice["token_ids"][-1] == 2 and choice["stop_reason"] is None
    ignored = vllm.complete([1, 50, 60], max_tokens=40, ignore_eos=True).json()["choices"][0]
    assert ignored["finish_reason"] == "length"


def test_stop_token_ids_end_the_request_and_say_which(vllm):
    ids = vllm.complete([1, 50, 60], max_tokens=6, ignore_eos=True, return_token_ids=True).json()["choices"][0]
    stop = ids["token_ids"][2]
    choice = vllm.complete(
        [1, 50, 60], max_tokens=6, ignore_eos=True, return_token_ids=True, stop_token_ids=[stop]
    ).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["token_ids"] == ids["token_ids"][: ids["token_ids"].index(stop) + 1]  # kept in the output


def test_seeded_sampling_repeats(vllm):
    a = vllm.complete([10, 11, 12], max_tokens=8, temperature=1.0, seed=7, return_token_ids=True).json()
    b = vllm.complete([10, 11, 12], max_tokens=8, temperature=1.0, seed=7, return_token_ids=True).json()
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]


def test_no_routed_experts_as_on_the_measured_cpu_server(vllm):
    assert vllm.complete([1, 2, 3], max_tokens=2).json()["choices"][0]["routed_experts"] is None
    assert vllm.generate([1, 2, 3], max_tokens=2).json()["choices"][0]["routed_experts"] is None


@pytest.mark.parametrize("stream", [False, True])
def test_routed_experts_are_laid_on_the_entries_as_the_engine_routed(start, bucket, stream):
    """--enable-return-routed-experts: the driver's reading gives every prompt and output entry
    the row of the forward pass the numpy engine routes it through (the prompt's position i;
    output token j: position P-1+j), as the contract's routing_matrix. Echo on a stream (whose
    chunks have no field for prompt scores): the prompt's entries are its token ids, routed."""
    dep = start(engine="vllm", routed_experts=True)
    with DeploymentClient(Target(None, dep.base_url, dep.model, "", engine="vllm")) as client:
        driver = driver_for("vllm", client)
        found = driver.discover(transition=None, decided="auto")
        assert found.has("routing_matrix"), found.table()
        driver.adopt(found)
        s = driver.complete(
            {"prompt": SHORT, "max_tokens": 4, "temperature": 0, "logprobs": True, "echo": True, "stream": stream}
        )
    assert s.ok and s.choice_field("routed_experts") is not None
    prompt = len(SHORT)
    assert [e["token_id"] for e in s.entries[:prompt]] == SHORT
    # prompt logprobs come with non-streamed answers only, as from vLLM (its first position has none)
    assert [e.get("logprob") is not None for e in s.entries[1:prompt]] == [not stream] * (prompt - 1)
    ids = SHORT + [e["token_id"] for e in s.entries[prompt:]]
    routing = Model.load(bucket / BASE).step([Sequence_()], [ids[:-1]], None)[0].routing  # [positions, L, k]
    got = [np.frombuffer(base64.b64decode(e["routing_matrix"]), np.uint8).reshape(routing.shape[1:]) for e in s.entries]
    want = [*routing[:prompt], *routing[len(SHORT) - 1 :]]
    assert len(got) == prompt + 4 == len(want)
    assert all(np.array_equal(np.sort(a, -1), np.sort(b, -1)) for a, b in zip(got, want, strict=True))


# --------------------------------------------------------------------------- /v1/chat/completions


def test_chat_shape(vllm):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello world"}],
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
    }
    doc = vllm.post("/v1/chat/completions", body).json()
    assert doc["id"].startswith("chatcmpl-") and doc["object"] == "chat.completion"
    [choice] = doc["choices"]
    assert choice["message"]["role"] == "assistant" and set(choice["message"]) >= {"content", "refusal", "reasoning"}
    assert [set(e) for e in choice["logprobs"]["content"]] == [{"token", "logprob", "bytes", "top_logprobs"}] * 3
    assert doc["prompt_token_ids"] == [1, 87, 430, 201, 358, 275, 345, 78, 70, 2, 201, 1, 346, 412, 201]  # measured
    assert doc["usage"]["prompt_tokens_details"]["created_cache_tokens"] == 0
    chunks = sse(vllm.post("/v1/chat/completions", body | {"stream": True, "stream_options": {"include_usage": True}}))
    head, *tokens, usage = chunks
    assert head["choices"][0]["delta"] == {"role": "assistant", "content": ""} and head["prompt_token_ids"]
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * len(chunks)
    assert tokens[-1]["choices"][0]["finish_reason"] == "length" and "stop_reason" in tokens[-1]["choices"][0]
    assert "stop_reason" not in tokens[0]["choices"][0] and tokens[0]["choices"][0]["token_ids"]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": 0,
    }


# --------------------------------------------------------------------------- /inference/v1/generate


def test_generate_shape(vllm):
    r = vllm.generate(
        [10, 11, 12],
        max_tokens=4,
        logprobs=1,
        prompt_logprobs=1,
        return_token_ids=True,
        cache_salt="abc",
        request_id="my-req-1",
    )
    doc = r.json()
    assert list(doc) == [
        "request_id",
        "model",
        "created",
        "usage",
        "prompt_logprobs",
        "prompt_token_id_logprobs",
        "prompt_token_ids",
        "mm_placeholders",
        "metrics",
        "kv_transfer_params",
        "ec_transfer_params",
        "output_mode",
        "choices",
    ]
    assert doc["request_id"] == "generate-tokens-my-req-1" and doc["output_mode"] == "tokens"
    [choice] = doc["choices"]
    assert list(choice) == [
        "index",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "routed_experts",
        "sampling_mask",
        "weight_versions",
        "logprobs",
    ]
    assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": 4}]
    content = choice["logprobs"]["content"]
    assert [e["token_id"] for e in content] == choice["token_ids"]
    assert all(e["rank"] == 1 and e["top_logprobs"][0]["token_id"] == e["token_id"] for e in content)  # greedy
    assert doc["prompt_logprobs"][0] is None and doc["prompt_token_ids"] == [10, 11, 12]


def test_generate_text_mode(vllm):
    doc = vllm.generate([10, 11, 12], max_tokens=3, logprobs=0, output_mode="text").json()
    [choice] = doc["choices"]
    assert doc["output_mode"] == "text" and list(choice)[-2:] == ["text", "logprobs"]
    assert choice["text"] == "\ufffd\ufffd("  # as measured: two unfinished characters, then "("
    assert [set(e) for e in choice["logprobs"]["content"]] == [{"token", "logprob", "bytes", "top_logprobs"}] * 3


def test_generate_stream_carries_spans_on_its_final_chunk_only(vllm):
    body = {
        "token_ids": [10, 11, 12],
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "sampling_params": {"max_tokens": 4, "temperature": 0, "logprobs": 0},
    }
    chunks = sse(vllm.post("/inference/v1/generate", body))
    *tokens, usage = chunks
    assert [c["choices"][0]["weight_versions"] for c in tokens] == [
        None,
        None,
        None,
        [{"version": "default", "start": 0, "end": 4}],
    ]
    assert tokens[0]["prompt_token_ids"] == [10, 11, 12] and all("prompt_token_ids" not in c for c in tokens[1:])
    assert all(c["usage"] is None for c in tokens)
    assert usage == {
        "request_id": tokens[0]["request_id"],
        "usage": {
            "prompt_tokens": 3,
            "total_tokens": 7,
            "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
        "output_mode": "tokens",
        "choices": [],
    }


def test_spans_name_the_label_current_when_each_token_was_generated(vllm):
    assert vllm.set_label("v1").json() == {"success": True, "new_version": "v1"}
    doc = vllm.generate(SHORT, max_tokens=3).json()
    assert doc["choices"][0]["weight_versions"] == [{"version": "v1", "start": 0, "end": 3}]


# --------------------------------------------------------------------------- the prefix cache


def test_prefix_cache_in_128_token_blocks_and_cache_salt_isolation(vllm):
    assert vllm.cached(LONG) == 0
    assert vllm.cached(LONG) == 256  # whole blocks, at least one prompt token computed
    assert vllm.cached(LONG, cache_salt="s1") == 0  # a salt is an isolation key of the same cache
    assert vllm.cached(LONG, cache_salt="s1") == 256
    assert vllm.cached(LONG, cache_salt="s2") == 0
    assert vllm.cached(LONG) == 256
    usage = vllm.complete(LONG, max_tokens=1).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 256


def test_requests_with_prompt_logprobs_do_not_read_the_prefix_cache(vllm):
    vllm.cached(LONG)
    assert vllm.cached(LONG) == 256
    r = vllm.generate(LONG, max_tokens=1, prompt_logprobs=0)
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # vLLM's skip_reading_prefix_cache
    echoed = vllm.complete(LONG, max_tokens=1, logprobs=0, echo=True).json()
    assert echoed["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    skipped = vllm.generate(LONG, max_tokens=1, skip_reading_prefix_cache=True).json()
    assert skipped["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_a_cache_hit_changes_no_logprob(vllm):
    cold = vllm.decode(LONG, cache_salt="eq")
    warm = vllm.decode(LONG, cache_salt="eq")
    assert warm[2] == 256 and cold[0] == warm[0]
    assert close(cold[1], warm[1])


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "body, status, kind, param",
    [
        ({"model": "nope", "prompt": [1, 2], "max_tokens": 2}, 404, "NotFoundError", "model"),
        ({"model": "tiny", "prompt": [10, 11, 99999], "max_tokens": 2}, 400, "BadRequestError", None),
        ({"model": "tiny", "prompt": [5] * 2050, "max_tokens": 2}, 400, "BadRequestError", "input_tokens"),
        ({"model": "tiny", "prompt": [1, 2], "max_tokens": 2, "cache_salt": ""}, 400, "BadRequestError", "cache_salt"),
        ({"model": "tiny", "prompt": [1, 2], "max_tokens": "x"}, 400, "Bad Request", "body.max_tokens"),
        ({"model": "tiny", "prompt": [1, 2], "logprobs": 21}, 400, "BadRequestError", "logprobs"),
        ({"model": "tiny", "prompt": [1, 2], "temperature": -1}, 400, "BadRequestError", "temperature"),
        ({"model": "tiny", "prompt": [1, 2], "stream": True, "prompt_logprobs": 1}, 400, "Bad Request", None),
        ({"model": "tiny", "prompt": ""}, 400, "Bad Request", None),
        ({"model": "tiny", "prompt": [1, 2], "n": 2}, 400, "BadRequestError", "n"),
    ],
    ids=[
        "model",
        "vocabulary",
        "context",
        "salt",
        "type",
        "logprobs",
        "temperature",
        "prompt-logprobs-stream",
        "empty",
        "n",
    ],
)
def test_refusals_take_vllms_envelope(vllm, body, status, kind, param):
    r = vllm.post("/v1/completions", body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert error["type"] == kind and (param is None or error["param"] == param), error


def test_measured_refusal_wordings(vllm):
    assert vllm.post("/v1/completions", {"model": "nope", "prompt": [1]}).json()["error"]["message"] == (
        "The model `nope` does not exist. Valid aliases: tiny."
    )
    assert vllm.post("/v1/completions", {"prompt": [10, 99999]}).json()["error"]["message"] == (
        "Token id 99999 is out of vocabulary"
    )
    assert vllm.post("/update_weight_version", {"new_version": 5}).json() == {
        "error": {
            "message": "1 validation error:\n  {'type': 'string_type', 'loc': 'body.new_version', 'msg': 'Input should be "
            "a valid string', 'input': '5'}",
            "type": "Bad Request",
            "param": "body.new_version",
            "code": 400,
        }
    }
    assert vllm.post("/update_weight_version", {}).json()["error"]["message"] == (
        "1 validation error:\n  {'type': 'missing', 'loc': 'body.new_version', 'msg': 'Field required', "
        "'input': 'None'}"
    )
    salt = vllm.post("/v1/completions", {"prompt": [1, 2], "cache_salt": ""}).json()["error"]["message"]
    assert salt == "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)"


def test_bodies_that_are_not_json_get_400_and_the_connection_stays(vllm):
    for path in ("/v1/completions", "/inference/v1/generate", "/v1/chat/completions"):
        r = vllm.http.post(path, content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "Bad Request"
        r = vllm.http.post(path, content=b"[1, 2]", headers={"Content-Type": "application/json"})
        assert r.status_code == 400
    other = vllm.http.post("/v1/completions", content=b'{"prompt": [1]}', headers={"Content-Type": "text/plain"})
    assert other.status_code == 400 and "Unsupported Media Type" in other.json()["error"]["message"]
    assert vllm.http.get("/version").status_code == 200


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"null",
        b'"x"',
        b"{}",
        b'{"token_ids": []}',
        b'{"token_ids": [1, -1]}',
        b'{"token_ids": [1], "sampling_params": 5}',
        b'{"token_ids": [1], "sampling_params": {"max_tokens": 0}}',
        b'{"token_ids": [1], "sampling_params": {"top_p": 0}}',
        b'{"token_ids": [1], "sampling_params": {}, "output_mode": "x"}',
        b'{"token_ids": [1.5], "sampling_params": {}}',
    ],
)
def test_garbage_gets_a_4xx_never_a_5xx(vllm, garbage):
    r = vllm.http.post("/inference/v1/generate", content=garbage, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500 and "error" in r.json(), r.text
    for path in ("/collective_rpc", "/update_weight_version", "/v1/chat/completions"):
        r = vllm.http.post(path, content=garbage, headers={"Content-Type": "application/json"})
        assert 400 <= r.status_code < 500, (path, r.text)


# --------------------------------------------------------------------------- the project's vLLM driver


def test_the_vllm_driver_discovers_and_loads_as_on_a_real_server(start, bucket):
    dep = start(engine="vllm")
    target = Target(None, dep.base_url, dep.model, "rl-reference-key", engine="vllm")
    with DeploymentClient(target) as client:
        assert preflight(client, None) == ("vllm", "auto: GET /version answers vLLM 0.32.0")
        driver = driver_for("vllm", client, bucket=str(bucket.resolve()))
        found = driver.discover(transition=None, decided="auto")
        assert {name for name, yes, _ in found.table() if yes == "yes"} >= {
            "hot_load_api",
            "pause",
            "cache_reset",
            "transition",
            "text_prompts",
            "token_id_prompts",
            "logprobs",
            "echo",
            "token_ids",
            "policy_version",
        }
        step(bucket, "step-1")
        r = driver.load({"identity": "step-1"})
        assert r.status_code == 200 and r.json() == {"results": [None]}
        assert [x["current_snapshot_identity"] for x in driver.status().replicas] == ["step-1"]
        s = driver.complete({"prompt": SHORT, "max_tokens": 4, "stream": True, "logprobs": True})
        assert s.ok and s.done and s.spans == [{"version": "step-1", "start": 0, "end": 4}]
        assert s.versions[-1] == "step-1" and len(s.entries) == 4 and all("token_id" in e for e in s.entries)
        echoed = driver.complete({"prompt": SHORT, "max_tokens": 2, "logprobs": True, "echo": True})
        assert len(echoed.entries) == len(SHORT) + 2
        text = driver.complete({"prompt": "hello world", "max_tokens": 2, "logprobs": True, "echo": True})
        assert text.ok and len(text.entries) == 5 + 2 and all("token_id" in e for e in text.entries)
        assert driver.paused() is False


def test_a_reload_that_outlasts_the_read_timeout_is_waited_for_up_to_the_swap_timeout(start, bucket):
    """vLLM answers a reload once it is done: a 61 GB reload takes minutes. The driver waits for
    that answer up to the run's swap timeout (`load_wait`), not the read timeout every other
    request is held to; without it the same reload is cut at the read timeout."""
    from pytest_rlrollout.remote.transport import ExchangeFailed

    dep = start(engine="vllm", load_delay=1.0)
    target = Target(None, dep.base_url, dep.model, "rl-reference-key", engine="vllm")
    step(bucket, "step-1")
    step(bucket, "step-2")
    with DeploymentClient(target, timeout=0.3) as client:
        driver = driver_for("vllm", client, bucket=str(bucket.resolve()))
        with pytest.raises(ExchangeFailed, match="read timeout"):
            driver.load({"identity": "step-1"})
        driver.resume()
        driver.load_wait = 10.0
        assert driver.load({"identity": "step-2"}).status_code == 200
        assert [x["current_snapshot_identity"] for x in driver.status().replicas] == ["step-2"]
