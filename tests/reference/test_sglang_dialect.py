"""The reference deployment speaking SGLang 0.5.23's dialect, shape for shape as SGLang's own
sources publish it (no SGLang server runs on this machine: its wheel is a CUDA build). Each test
names the source it follows: `http_server.py` (routes, status codes, bodies), `io_struct.py`
(request structs), `tokenizer_manager.py` (`meta_info`), `openai/protocol.py` and the OpenAI
serving modules (response models), `api/v1/api_types.py` (the JSON contract gate of /generate).
The refusals of the control routes are FastAPI's text of pydantic's errors for io_struct's msgspec
structs, as produced by SGLang's `msgspec_struct_pydantic_core_schema` under FastAPI 0.165 and
pydantic 2.12 (the versions installed here; SGLang pins neither).

Three servers per module: `sg` (SGLang's defaults; nothing relabels it), `ctl` (weights, labels
and pauses change on it: each test asserts on what it changed itself) and `routed` (started with
--enable-return-routed-experts). What a test lands inside a stream, it lands while decoding is
slowed (SLOW s per step) and only after the stream's first chunk arrived; then it restores full
speed."""

import base64
import itertools
import json
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.reference.model import Model, Sequence_
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.drivers import driver_for
from pytest_rlrollout.remote.preflight import preflight
from pytest_rlrollout.remote.target import Target

from .vllm_support import BASE, SHORT, SLOW, Streamer, close, local_prompt_logprobs, step

RID = re.compile(r"[0-9a-f]{32}")  # uuid.uuid4().hex: GenerateReqInput._normalize_single_inputs
# SGLang's sampling_params schema, in its order (api/v1/api_types.py: SamplingParams)
SAMPLING_FIELDS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)
# what a request aborted while it runs ends with (schedule_batch.FINISH_ABORT().to_json())
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, "
    "the operation will not be performed.)\n"
)
# UsageInfo's fields (openai/protocol.py), prompt_tokens_details as with --enable-cache-report
USAGE = [
    "prompt_tokens",
    "total_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "reasoning_tokens",
    "completion_tokens_details",
]
# what vLLM's answers carry and SGLang's response models do not
VLLM_ONLY = {
    "service_tier",
    "system_fingerprint",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
    "prompt_logprobs",
    "prompt_text",
    "stop_reason",
    "routed_experts",
    "refusal",
    "annotations",
    "audio",
    "function_call",
    "reasoning",
    "created_cache_tokens",
    "multimodal_tokens",
    "permission",
}


class Sg:
    """Raw httpx against one SGLang-dialect server."""

    def __init__(self, dep):
        self.dep = dep
        self.http = httpx.Client(base_url=dep.base_url, timeout=60)

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return self.http.post(path, json=body)

    def generate(self, ids: list[int], n: int = 4, **fields: Any) -> httpx.Response:
        """A greedy native /generate of `n` tokens (no end of sequence)."""
        sampling = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True} | fields.pop("sampling", {})
        return self.post("/generate", {"input_ids": ids, "sampling_params": sampling, **fields})

    def info(self) -> dict[str, Any]:
        return self.http.get("/model_info").json()

    def streaming(self, ids: list[int], n: int = 300) -> Streamer:
        """A slowed greedy native stream of `n` tokens, once its first chunk arrived."""
        self.dep.deployment.set_pace(token_delay=SLOW)
        body = {
            "input_ids": ids,
            "stream": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
        }
        return Streamer(self, "/generate", body).wait_started()  # type: ignore[arg-type]

    def fast(self) -> None:
        self.dep.deployment.set_pace(token_delay=0.0)


def sse(r: httpx.Response) -> list[dict[str, Any]]:
    """The chunks of an SSE answer: every event a `data: {...}` line, `data: [DONE]` the last."""
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text[:300]
    lines = [x for x in r.text.split("\n") if x]
    assert lines[-1] == "data: [DONE]" and all(x.startswith("data: {") for x in lines[:-1]), lines[-3:]
    return [json.loads(x[6:]) for x in lines[:-1]]


def meta_of(s: Streamer) -> dict[str, Any]:
    return s.chunks[-1]["meta_info"]


def keys(doc: Any) -> set[str]:
    """Every key of a JSON document, at any depth."""
    if isinstance(doc, dict):
        return set(doc) | {k for v in doc.values() for k in keys(v)}
    if isinstance(doc, list):
        return {k for v in doc for k in keys(v)}
    return set()


def tokenizer(bucket: Path) -> Tokenizer:
    return Tokenizer.from_file(str(bucket / BASE / "tokenizer.json"))


@pytest.fixture(scope="module")
def sg_bucket(tmp_path_factory, base_snapshot) -> Path:
    bucket = tmp_path_factory.mktemp("sglang") / "bucket"
    bucket.mkdir()
    shutil.copytree(base_snapshot, bucket / BASE)
    step(bucket, "step-1")
    return bucket


def _serve(bucket: Path, **settings: Any):
    with reference_deployment(bucket, engine="sglang", **settings) as dep:
        client = Sg(dep)
        yield client
        client.http.close()


@pytest.fixture(scope="module")
def sg(sg_bucket):
    yield from _serve(sg_bucket)


@pytest.fixture(scope="module")
def control(sg_bucket):
    yield from _serve(sg_bucket)


@pytest.fixture
def ctl(control):
    """The server whose weights, labels and pauses the tests change; left generating at full speed."""
    yield control
    control.fast()
    control.post("/continue_generation", {})


@pytest.fixture(scope="module")
def routed(sg_bucket):
    yield from _serve(sg_bucket, routed_experts=True)


# --------------------------------------------------------------------------- native /generate


def test_generate_answers_text_output_ids_and_meta_info(sg):
    """http_server.generate_request; meta_info as tokenizer_manager._handle_batch_output builds it
    (id, finish_reason, prompt_tokens, weight_version, num_retractions, reasoning_tokens,
    completion_tokens, cached_tokens), the finished output's spans and e2e_latency on top
    (weight_versions.add_weight_versions_to_meta_info)."""
    r = sg.generate([21, 22, 23, 24, 25])
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert list(doc) == ["text", "output_ids", "meta_info"]
    meta = doc["meta_info"]
    assert set(meta) == {
        "id",
        "finish_reason",
        "prompt_tokens",
        "weight_version",
        "num_retractions",
        "reasoning_tokens",
        "completion_tokens",
        "cached_tokens",
        "weight_versions",
        "e2e_latency",
    }
    assert RID.fullmatch(meta["id"])
    assert meta["finish_reason"] == {"type": "length", "length": 4}  # FINISH_LENGTH.to_json
    assert meta["prompt_tokens"] == 5 and meta["completion_tokens"] == 4 == len(doc["output_ids"])
    assert meta["cached_tokens"] == 0 and meta["num_retractions"] == 0 and meta["reasoning_tokens"] == 0
    assert meta["weight_version"] == "default"  # --weight-version's default
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 4}]
    assert isinstance(meta["e2e_latency"], float) and isinstance(doc["text"], str)
    assert all(isinstance(t, int) for t in doc["output_ids"])
    # a rid the client gives is the answer's id; a repeated prompt reads the radix cache
    again = sg.generate([21, 22, 23, 24, 25], rid="my-rid-1").json()
    assert again["meta_info"]["id"] == "my-rid-1" and again["output_ids"] == doc["output_ids"]
    long = list(range(100, 140))
    assert sg.generate(long, 1).json()["meta_info"]["cached_tokens"] == 0
    assert 0 < sg.generate(long, 1).json()["meta_info"]["cached_tokens"] < len(long)


def test_generate_stream_repeats_the_output_so_far_in_every_chunk(sg):
    """http_server.serve_generate_request's stream: `data: {...}` per output, `data: [DONE]` last;
    without --incremental-streaming-output every chunk carries the whole text and output_ids so far
    (tokenizer_manager._handle_batch_output), the label current when it was written on each, the
    spans on the finished chunk only (output_streamer: weight_versions for finished requests)."""
    body = {
        "input_ids": [61, 62, 63, 64],
        "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
    }
    whole = sg.post("/generate", body).json()
    chunks = sse(sg.post("/generate", body | {"stream": True}))
    assert len(chunks) == 5 and all(list(c) == ["text", "output_ids", "meta_info"] for c in chunks)
    assert [c["output_ids"] for c in chunks] == [whole["output_ids"][:i] for i in range(1, 6)]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts)) and texts[-1] == whole["text"]
    metas = [c["meta_info"] for c in chunks]
    assert [m["finish_reason"] for m in metas] == [None] * 4 + [{"type": "length", "length": 5}]
    assert [m["completion_tokens"] for m in metas] == [1, 2, 3, 4, 5]
    assert all(m["weight_version"] == "default" and m["prompt_tokens"] == 4 for m in metas)
    assert all(isinstance(m["cached_tokens"], int) for m in metas)
    assert len({m["id"] for m in metas}) == 1 and RID.fullmatch(metas[0]["id"])
    assert [("weight_versions" in m, "e2e_latency" in m) for m in metas] == [(False, False)] * 4 + [(True, True)]
    assert metas[-1]["weight_versions"] == [{"version": "default", "start": 0, "end": 5}]


def test_text_and_token_id_prompts(sg, sg_bucket):
    """GenerateReqInput's `text` (tokenized by the server) or `input_ids`; `return_prompt_token_ids`
    adds the prompt's ids after meta_info (tokenizer_manager: out_dict["prompt_token_ids"])."""
    text = "hello world what is"
    ids = tokenizer(sg_bucket).encode(text).ids
    doc = sg.post(
        "/generate",
        {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}, "return_prompt_token_ids": True},
    ).json()
    assert list(doc) == ["text", "output_ids", "meta_info", "prompt_token_ids"]
    assert doc["prompt_token_ids"] == ids and doc["meta_info"]["prompt_tokens"] == len(ids)
    same = sg.generate(ids, 2, sampling={"ignore_eos": False}).json()
    assert same["output_ids"] == doc["output_ids"] and same["text"] == doc["text"]
    assert sg.generate([71, 72, 73], 1, return_prompt_token_ids=True).json()["prompt_token_ids"] == [71, 72, 73]


def test_logprobs_are_triples_from_logprob_start_len(sg, sg_bucket):
    """tokenizer_manager.add_logprob_to_meta_info: input_token_logprobs from logprob_start_len and
    output_token_logprobs as [logprob, token_id, text] (detokenize_logprob_tokens: the token decoded
    alone, null without return_text_in_logprobs); the first input entry has no logprob whatever the
    start (logprob_result_processor._process_input_token_logprobs); -1, the default, scores no
    prompt token (scheduler: logprob_start_len = len(origin_input_ids))."""
    ids = [31, 32, 33, 34, 35, 36]
    doc = sg.generate(ids, 3, return_logprob=True, logprob_start_len=2, return_text_in_logprobs=True).json()
    meta = doc["meta_info"]
    inp, out = meta["input_token_logprobs"], meta["output_token_logprobs"]
    assert [e[1] for e in inp] == ids[2:] and [e[1] for e in out] == doc["output_ids"]
    assert inp[0][0] is None and all(isinstance(e[0], float) and e[0] <= 0 for e in inp[1:] + out)
    assert close([e[0] for e in inp[1:]], local_prompt_logprobs(sg_bucket / BASE, ids)[2:])  # the numpy engine's
    assert close([e[0] for e in out], local_prompt_logprobs(sg_bucket / BASE, ids + doc["output_ids"])[len(ids) - 1 :])
    tok = tokenizer(sg_bucket)
    assert [e[2] for e in inp + out] == [tok.decode([e[1]], skip_special_tokens=False) for e in inp + out]
    assert meta["output_token_logprobs_length"] == 3 and "input_top_logprobs" not in meta
    whole = sg.generate(ids, 3, return_logprob=True, logprob_start_len=0).json()["meta_info"]
    assert [e[1] for e in whole["input_token_logprobs"]] == ids and whole["input_token_logprobs"][0] == [None, 31, None]
    assert [e[0] for e in whole["input_token_logprobs"][3:]] == [e[0] for e in inp[1:]]
    assert all(e[2] is None for e in whole["output_token_logprobs"])
    plain = sg.generate(ids, 3, return_logprob=True).json()["meta_info"]
    assert plain["input_token_logprobs"] == [] and [e[1] for e in plain["output_token_logprobs"]] == doc["output_ids"]
    assert "input_token_logprobs" not in sg.generate(ids, 1).json()["meta_info"]  # asked for only


def test_top_logprobs_list_the_best_tokens_of_every_position(sg):
    """tokenizer_manager.add_logprob_to_meta_info with top_logprobs_num > 0: input_top_logprobs and
    output_top_logprobs, per position the best [logprob, token_id, text] first, null where the
    token list has no logprob (detokenize_top_logprobs_tokens)."""
    ids = [81, 82, 83, 84]
    meta = sg.generate(ids, 3, return_logprob=True, logprob_start_len=0, top_logprobs_num=2).json()["meta_info"]
    top_in, top_out = meta["input_top_logprobs"], meta["output_top_logprobs"]
    assert len(top_in) == len(ids) and top_in[0] is None and len(top_out) == 3
    for row in top_in[1:] + top_out:
        assert len(row) == 2 and row[0][0] >= row[1][0] and all(len(e) == 3 and e[2] is None for e in row)
    # greedy: every output token is its position's best
    assert [row[0][1] for row in top_out] == [e[1] for e in meta["output_token_logprobs"]]
    assert [row[0][0] for row in top_out] == [e[0] for e in meta["output_token_logprobs"]]


def test_refusals_and_unknown_fields(sg):
    """api_contract.generate_contract_error (the JSON contract gate before a request is served):
    a sampling_params key the schema does not have is 400 `{"error": <serde's unknown_field text>}`
    (api_types.decode_SamplingParams), streamed or not; an unknown top-level key is ignored
    (GenerateRequest: unknown keys ignored). What the reference does not implement is refused."""
    body = {"input_ids": [41, 42, 43], "sampling_params": {"max_new_tokens": 2, "temperature": 0, "max_tokens": 2}}
    wording = {"error": f"unknown field `max_tokens`, expected one of {', '.join(f'`{f}`' for f in SAMPLING_FIELDS)}"}
    for stream in (False, True):
        r = sg.post("/generate", body | {"stream": stream})
        assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
        assert r.json() == wording
    del body["sampling_params"]["max_tokens"]
    plain = sg.post("/generate", body).json()
    odd = sg.post("/generate", body | {"no_such_field": {"x": 1}, "max_tokens": 99})
    assert odd.status_code == 200 and odd.json()["output_ids"] == plain["output_ids"] and len(plain["output_ids"]) == 2
    refused = sg.post("/generate", body | {"sampling_params": {"max_new_tokens": 2, "regex": "a+"}})
    assert refused.status_code == 400 and isinstance(refused.json()["error"], str)  # known to SGLang, not implemented


# --------------------------------------------------------------------------- routed experts


def test_no_routed_experts_without_the_server_flag(sg):
    """RoutedExpertsCapturer.create: none without --enable-return-routed-experts, so
    return_routed_experts adds nothing to meta_info (tokenizer_manager: routed_experts only when
    the scheduler sent some)."""
    assert sg.http.get("/server_info").json()["enable_return_routed_experts"] is False
    asked = {"return_routed_experts": True}
    assert "routed_experts" not in sg.generate(SHORT, 2, **asked).json()["meta_info"]
    chunks = sse(
        sg.post("/generate", {"input_ids": SHORT, "stream": True, "sampling_params": {"max_new_tokens": 2}, **asked})
    )
    assert all("routed_experts" not in c["meta_info"] for c in chunks)


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
def test_routed_experts_with_the_server_flag(routed, sg_bucket, stream):
    """--enable-return-routed-experts: the finished output's meta_info.routed_experts is base64 of
    int32 [seqlen - 1, num_hidden_layers, top_k] with no header (RoutedExpertsCapturer sizes its
    buffer by the config's num_hidden_layers and num_experts_per_tok; batch_result_processor.
    _maybe_collect_routed_experts: rows [routed_experts_start_len, seqlen - 1)); a dense layer
    routes nothing and keeps its zeros. Every MoE layer's row is the numpy engine's routing."""
    config = json.loads((sg_bucket / BASE / "config.json").read_text())
    layers, k = config["num_hidden_layers"], config["num_experts_per_tok"]
    assert routed.http.get("/server_info").json()["enable_return_routed_experts"] is True
    body = {
        "input_ids": SHORT,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
        "return_routed_experts": True,
        "stream": stream,
    }
    r = routed.post("/generate", body)
    chunks = sse(r) if stream else [r.json()]
    assert all("routed_experts" not in c["meta_info"] for c in chunks[:-1])  # the finished output's only
    last = chunks[-1]
    raw = base64.b64decode(last["meta_info"]["routed_experts"], validate=True)
    assert len(raw) == (len(SHORT) + 4 - 1) * layers * k * 4
    rows = np.frombuffer(raw, dtype="<i4").reshape(-1, layers, k)
    ids = SHORT + last["output_ids"]
    expected = Model.load(sg_bucket / BASE).step([Sequence_()], [ids[:-1]], None)[0].routing  # [positions, MoE, k]
    dense = [i for i in range(layers) if i in config["mlp_only_layers"]]
    moe = [i for i in range(layers) if i not in dense]
    assert dense and len(moe) == expected.shape[1]  # the tiny model has a dense first layer
    assert not rows[:, dense].any()
    assert np.array_equal(np.sort(rows[:, moe], -1), np.sort(expected.astype(np.int32), -1))
    assert "routed_experts" not in routed.generate(SHORT, 2).json()["meta_info"]  # asked for only


# --------------------------------------------------------------------------- OpenAI routes


def test_completions_answer_in_sglangs_response_models(sg):
    """serving_completions._build_completion_response: protocol.CompletionResponse (id = the rid,
    usage = UsageInfo, metadata = build_endpoint_weight_version_metadata), CompletionResponseChoice
    (matched_stop; token_ids and prompt_token_ids only with return_token_ids); streamed,
    CompletionStreamResponse.model_dump_json() per output (usage null) and, with include_usage, a
    last chunk of no choices dumped with exclude_none; no metadata on a stream."""
    body = {"model": "tiny", "prompt": [51, 52, 53], "max_tokens": 3, "temperature": 0}
    doc = sg.post("/v1/completions", body).json()
    assert list(doc) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    assert RID.fullmatch(doc["id"]) and doc["object"] == "text_completion" and doc["model"] == "tiny"
    [choice] = doc["choices"]
    assert list(choice) == ["index", "text", "logprobs", "finish_reason", "matched_stop"]
    assert choice["finish_reason"] == "length" and choice["matched_stop"] is None and choice["logprobs"] is None
    assert list(doc["usage"]) == USAGE and doc["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 6,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 0},
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }
    assert doc["metadata"] == {
        "weight_version": "default",
        "weight_versions": [{"version": "default", "start": 0, "end": 3}],
    }
    assert not keys(doc) & VLLM_ONLY
    ids = sg.post("/v1/completions", body | {"return_token_ids": True}).json()["choices"][0]
    assert list(ids)[-2:] == ["token_ids", "prompt_token_ids"] and ids["prompt_token_ids"] == [51, 52, 53]
    assert len(ids["token_ids"]) == 3
    # a stop token id ends it and is named (FINISH_MATCHED_TOKEN: {"type": "stop", "matched": id})
    stopped = sg.post("/v1/completions", body | {"stop_token_ids": [ids["token_ids"][1]]}).json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["matched_stop"] == ids["token_ids"][1]
    chunks = sse(sg.post("/v1/completions", body | {"stream": True, "stream_options": {"include_usage": True}}))
    *tokens, usage = chunks
    assert len(tokens) == 3 and all(list(c) == ["id", "object", "created", "model", "choices", "usage"] for c in tokens)
    assert all(c["usage"] is None and c["object"] == "text_completion" for c in tokens)
    assert all(list(c["choices"][0]) == ["index", "text", "logprobs", "finish_reason", "matched_stop"] for c in tokens)
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None, None, "length"]
    assert "".join(c["choices"][0]["text"] for c in tokens) == choice["text"]
    assert len({c["id"] for c in chunks}) == 1 and RID.fullmatch(usage["id"])
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 6,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 0},
        "reasoning_tokens": 0,
    }
    assert not keys(chunks) & (VLLM_ONLY | {"metadata"})
    assert len(sse(sg.post("/v1/completions", body | {"stream": True}))) == 3  # no usage chunk unless asked


def test_chat_answers_in_sglangs_response_models(sg):
    """serving_chat: protocol.ChatCompletionResponse (metadata), ChatCompletionResponseChoice
    (matched_stop; prompt_token_ids and response_token_ids with return_token_ids), ChatMessage
    (role, content, reasoning_content); streamed, sse_utils.build_sse_content's chunks (a delta
    that always says reasoning_content, no usage key): the role first, the content, then the finish
    in a chunk of its own; with include_usage, ChatCompletionStreamResponse.model_dump_json()."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello sglang"}],
        "max_tokens": 3,
        "temperature": 0,
    }
    doc = sg.post("/v1/chat/completions", body | {"logprobs": True, "top_logprobs": 1}).json()
    assert list(doc) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    assert RID.fullmatch(doc["id"]) and doc["object"] == "chat.completion"
    [choice] = doc["choices"]
    assert list(choice) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
    assert list(choice["message"]) == ["role", "content", "reasoning_content"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["reasoning_content"] is None
    assert choice["finish_reason"] == "length" and choice["matched_stop"] is None
    content = choice["logprobs"]["content"]  # protocol.ChoiceLogprobs of ChatCompletionTokenLogprob
    assert len(content) == 3 and all(set(e) == {"token", "bytes", "logprob", "top_logprobs"} for e in content)
    assert list(doc["usage"]) == USAGE and doc["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert doc["metadata"] == {
        "weight_version": "default",
        "weight_versions": [{"version": "default", "start": 0, "end": 3}],
    }
    assert not keys(doc) & VLLM_ONLY
    ids = sg.post("/v1/chat/completions", body | {"return_token_ids": True}).json()
    assert "prompt_token_ids" not in ids and list(ids["choices"][0])[-2:] == ["prompt_token_ids", "response_token_ids"]
    [back] = ids["choices"]
    assert len(back["response_token_ids"]) == 3 and ids["usage"]["prompt_tokens"] == len(back["prompt_token_ids"])
    chunks = sse(sg.post("/v1/chat/completions", body | {"stream": True, "stream_options": {"include_usage": True}}))
    head, *pieces, finish, usage = chunks
    assert all(list(c) == ["id", "object", "created", "model", "choices"] for c in [head, *pieces, finish])
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == head["id"] for c in chunks)
    assert head["choices"] == [
        {
            "index": 0,
            "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
            "matched_stop": None,
        }
    ]
    assert pieces and all(list(c["choices"][0]["delta"]) == ["reasoning_content", "content"] for c in pieces)
    assert all(c["choices"][0]["finish_reason"] is None for c in pieces)
    assert "".join(c["choices"][0]["delta"]["content"] for c in pieces) == choice["message"]["content"]
    assert finish["choices"] == [
        {
            "index": 0,
            "delta": {"reasoning_content": None},
            "logprobs": None,
            "finish_reason": "length",
            "matched_stop": None,
        }
    ]
    assert usage["choices"] == [] and list(usage["usage"]) == USAGE and usage["usage"]["completion_tokens"] == 3
    assert not keys(chunks) & (VLLM_ONLY | {"metadata"})


def test_models_server_info_health_and_flush_cache(sg, sg_bucket):
    """http_server.available_models (protocol.ModelCard of --served-model-name), server_info (the
    start-up configuration and __version__), health, flush_cache (200 text when idle; GET or POST)."""
    models = sg.http.get("/v1/models").json()
    assert models == {
        "object": "list",
        "data": [
            {
                "id": "tiny",
                "object": "model",
                "created": models["data"][0]["created"],
                "owned_by": "sglang",
                "root": "tiny",
                "parent": None,
                "max_model_len": 2048,
            }
        ],
    }
    info = sg.http.get("/server_info").json()
    assert info["version"] == "0.5.23" and info["model_path"] == str(sg_bucket / BASE)
    assert info["weight_version"] == "default" and info["served_model_name"] == "tiny"
    health = sg.http.get("/health")
    assert health.status_code == 200 and health.content == b""
    for method in ("GET", "POST"):
        r = sg.http.request(method, "/flush_cache")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain") and r.text == FLUSHED
    assert sg.http.get("/nope").status_code == 404
    assert sg.http.get("/weight_info").status_code == 404  # nothing of the vLLM dialect answers here


# --------------------------------------------------------------------------- weights, labels, pauses


def test_update_weights_from_disk_serves_the_snapshot_under_its_label(ctl, sg_bucket):
    """http_server.update_weights_from_disk: {success, message, num_paused_requests}, 200 or 400
    (io_struct.UpdateWeightFromDiskReqInput: model_path, weight_version, flush_cache = true); on
    success model_path and served_model_name move (tokenizer_manager._update_model_path_info) and
    the label is the one given; a directory it cannot read changes nothing (WeightUpdater.
    update_weights_from_disk: "Failed to get weights iterator: ...")."""
    path, label = sg_bucket / "step-1", f"w-{uuid.uuid4().hex[:8]}"
    r = ctl.post("/update_weights_from_disk", {"model_path": str(path), "weight_version": label, "flush_cache": True})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "success": True,
        "message": f"Succeeded to update model weights. Weight version updated to {label}.",
        "num_paused_requests": 0,
    }
    info = ctl.info()
    assert info["weight_version"] == label and info["model_path"] == str(path) == info["served_model_name"]
    assert info["tokenizer_path"] == str(sg_bucket / BASE)  # the tokenizer stays where the server started
    assert ctl.http.get("/server_info").json()["model_path"] == str(sg_bucket / BASE)  # start-up configuration
    ids = [91, 92, 93, 94, 95, 96]
    meta = ctl.generate(ids, 2, return_logprob=True, logprob_start_len=0).json()["meta_info"]
    assert meta["weight_version"] == label and meta["weight_versions"] == [{"version": label, "start": 0, "end": 2}]
    served = [e[0] for e in meta["input_token_logprobs"][1:]]
    assert close(served, local_prompt_logprobs(path, ids))  # the numpy engine's, on the snapshot loaded
    assert not close(served, local_prompt_logprobs(sg_bucket / BASE, ids))
    missing = ctl.post(
        "/update_weights_from_disk", {"model_path": str(sg_bucket / "no-such-step"), "weight_version": "never"}
    )
    assert missing.status_code == 400 and set(missing.json()) == {"success", "message", "num_paused_requests"}
    assert missing.json()["success"] is False and missing.json()["num_paused_requests"] == 0
    assert missing.json()["message"].startswith("Failed to get weights iterator:")
    after = ctl.info()
    assert after["weight_version"] == label and after["model_path"] == str(path)


def test_update_weight_version_aborts_the_requests_in_flight_unless_told_not_to(ctl):
    """http_server.update_weight_version: {success, message, new_version}; UpdateWeightVersionReqInput's
    abort_all_requests defaults to true (tokenizer_manager.abort_request(abort_all=True): a running
    request ends with FINISH_ABORT()); with false the request goes on, its later tokens under the
    new label (scheduler.record_weight_version_change, compute_weight_version_spans)."""
    first, second, third = (f"v-{uuid.uuid4().hex[:8]}" for _ in range(3))
    r = ctl.post("/update_weight_version", {"new_version": first})
    assert r.status_code == 200
    assert r.json() == {"success": True, "message": f"Weight version updated to {first}", "new_version": first}
    assert ctl.info()["weight_version"] == first
    assert ctl.generate([11, 12], 1).json()["meta_info"]["weight_version"] == first
    s = ctl.streaming([13, 14, 15])
    assert ctl.post("/update_weight_version", {"new_version": second}).status_code == 200
    s.join()
    assert s.done and meta_of(s)["finish_reason"] == ABORTED and meta_of(s)["completion_tokens"] < 300
    s = ctl.streaming([16, 17, 18])
    assert ctl.post("/update_weight_version", {"new_version": third, "abort_all_requests": False}).status_code == 200
    ctl.fast()
    s.join()
    meta = meta_of(s)
    assert s.done and meta["finish_reason"] == {"type": "length", "length": 300}
    spans = meta["weight_versions"]
    assert [x["version"] for x in spans] == [second, third] and meta["weight_version"] == third
    assert spans[0]["start"] == 0 and 0 < spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == 300
    labels = [c["meta_info"]["weight_version"] for c in s.chunks]
    assert labels[0] == second and labels[-1] == third and labels == sorted(labels, key=[second, third].index)


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_pause_modes_and_continue(ctl, mode):
    """http_server.pause_generation / continue_generation ({"message", "status": "ok"});
    io_struct.PauseGenerationReqInput: abort ends the requests in flight (FINISH_ABORT()); retract
    and in_place freeze them until generation continues, retracted ones in the waiting queue that
    a paused scheduler's flush ignores (Scheduler.flush_cache: is_fully_idle(ignore_waiting=paused)),
    in_place ones in the running batch that keep it from flushing (400, "Flush cache failed.")."""
    s = ctl.streaming([19, 20, 21])
    r = ctl.post("/pause_generation", {"mode": mode})
    assert r.status_code == 200 and r.json() == {"message": "Generation paused successfully.", "status": "ok"}
    if mode != "abort":
        flushed = ctl.http.post("/flush_cache")
        assert (flushed.status_code, flushed.text) == (
            (400, "Flush cache failed.\n") if mode == "in_place" else (200, FLUSHED)
        )
    r = ctl.post("/continue_generation", {})
    assert r.status_code == 200 and r.json() == {"message": "Generation continued successfully.", "status": "ok"}
    ctl.fast()
    s.join()
    finish = meta_of(s)["finish_reason"]
    assert s.done and finish == (ABORTED if mode == "abort" else {"type": "length", "length": 300})
    assert ctl.http.post("/flush_cache").status_code == 200  # idle again


def _errors(model: str, doc: Any, *fields: tuple[str, str, str, Any]) -> list[dict[str, Any]]:
    """pydantic's errors for io_struct's msgspec struct `model` (msgspec_struct_pydantic_core_schema's
    union: an instance of the struct, or a dict built into it), each field's (name, type, msg, input)."""
    branch = ("body", f"function-after[build_struct(), {model}]")
    out = [
        {
            "type": "is_instance_of",
            "loc": ("body", f"is-instance[{model}]"),
            "msg": f"Input should be an instance of {model}",
            "input": doc,
            "ctx": {"class": model},
        }
    ]
    for name, kind, msg, value in fields:
        out.append({"type": kind, "loc": (*branch, name), "msg": msg, "input": value})
    return out


MODES_EXPECTED = "'abort', 'retract' or 'in_place'"
MISSING_BODY = [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
REFUSALS = {
    "unknown-mode": (
        "/pause_generation",
        {"mode": "sideways"},
        [
            *_errors("PauseGenerationReqInput", {"mode": "sideways"}),
            {
                "type": "literal_error",
                "loc": ("body", "function-after[build_struct(), PauseGenerationReqInput]", "mode"),
                "msg": f"Input should be {MODES_EXPECTED}",
                "input": "sideways",
                "ctx": {"expected": MODES_EXPECTED},
            },
        ],
    ),
    "pause-no-body": ("/pause_generation", None, MISSING_BODY),
    "continue-no-body": ("/continue_generation", None, MISSING_BODY),
    "no-new-version": (
        "/update_weight_version",
        {},
        _errors("UpdateWeightVersionReqInput", {}, ("new_version", "missing", "Field required", {})),
    ),
    "model-path-not-a-string": (
        "/update_weights_from_disk",
        {"model_path": 5},
        _errors(
            "UpdateWeightFromDiskReqInput",
            {"model_path": 5},
            ("model_path", "string_type", "Input should be a valid string", 5),
        ),
    ),
    "flush-cache-not-a-boolean": (
        "/update_weights_from_disk",
        {"model_path": "/x", "flush_cache": "maybe"},
        _errors(
            "UpdateWeightFromDiskReqInput",
            {"model_path": "/x", "flush_cache": "maybe"},
            ("flush_cache", "bool_parsing", "Input should be a valid boolean, unable to interpret input", "maybe"),
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_control_bodies_that_do_not_fit_get_sglangs_400(ctl, case):
    """http_server.validation_exception_handler turns FastAPI's RequestValidationError into 400
    ErrorResponse (object, message, type "Bad Request", param, code), never FastAPI's 422; the message
    is str(exc) (FastAPI: "<n> validation error(s):", an error a line, where the endpoint is) and then
    str(exc.errors()). A refused request changes nothing: generation still runs."""
    path, body, errors = REFUSALS[case]
    label = ctl.info()["weight_version"]
    r = ctl.http.post(path, json=body) if body is not None else ctl.http.post(path)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert list(doc) == ["object", "message", "type", "param", "code"]
    assert (doc["object"], doc["type"], doc["param"], doc["code"]) == ("error", "Bad Request", None, 400)
    listed = "".join(f"  {e}\n" for e in errors)
    head = f"{len(errors)} validation error{'s' if len(errors) > 1 else ''}:\n{listed}\n  File "
    assert doc["message"].startswith(head), doc["message"]
    assert doc["message"].endswith(f"    POST {path} {errors}"), doc["message"]
    with httpx.Client(base_url=ctl.dep.base_url, timeout=10) as quick:  # a paused server would hold this
        answer = quick.post("/generate", json={"input_ids": [22, 23], "sampling_params": {"max_new_tokens": 1}})
    assert answer.status_code == 200 and ctl.info()["weight_version"] == label


# --------------------------------------------------------------------------- the project's SGLang driver


def test_the_sglang_driver_discovers_loads_and_completes(ctl, sg_bucket):
    """The project's SGLang driver against this dialect, as against a real server: preflight names
    SGLang by its /model_info, discovery finds the RL routes and the native route's fields, a load
    (retract, update_weights_from_disk, continue) serves the snapshot under its identity."""
    dep = ctl.dep
    with DeploymentClient(Target(None, dep.base_url, dep.model, "", engine="sglang")) as client:
        assert preflight(client, None)[0] == "sglang"
        driver = driver_for("sglang", client, bucket=str(sg_bucket.resolve()))
        found = driver.discover(transition=None, decided="auto")
        assert found.version == "0.5.23"
        assert {name for name, yes, _ in found.table() if yes == "yes"} >= {
            "hot_load_api",
            "pause",
            "cache_reset",
            "transition",
            "token_id_prompts",
            "logprobs",
            "echo",
            "token_ids",
            "policy_version",
            "nonstream_version",
        }
        r = driver.load({"identity": "step-1"})
        assert r.status_code == 200 and r.json()["success"] is True
        assert [x["current_snapshot_identity"] for x in driver.status().replicas] == ["step-1"]
        s = driver.complete({"prompt": SHORT, "max_tokens": 4, "stream": True, "logprobs": True})
        assert s.ok and s.done and s.spans == [{"version": "step-1", "start": 0, "end": 4}]
        assert len(s.entries) == 4 and all("token_id" in e for e in s.entries)
        echoed = driver.complete({"prompt": SHORT, "max_tokens": 2, "logprobs": True, "echo": True})
        assert echoed.ok and len(echoed.entries) == len(SHORT) + 2
