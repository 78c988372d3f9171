"""vLLM's RL routes on the reference deployment: reload_weights (a synchronous full-snapshot load,
confined to the bucket, refused when the snapshot breaks a SNAP rule), the weight-version label,
pause in every mode (no token while paused; requests held, not refused; abort ends streams with
their partial output; wait drains; keep freezes and resumes, recomputing its KV on request),
and a prefix-cache reset. What a test lands inside a stream, it lands while decoding is slowed
(SLOW s per step) and only after the stream's first chunk arrived; then it restores full speed."""

import shutil
import threading

import pytest

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.snapshot import broken

from .vllm_support import (
    BASE,
    LONG,
    SHORT,
    SLOW,
    VllmClient,
    close,
    fast,
    generating,
    local_prompt_logprobs,
    step,
    until,
)


@pytest.fixture
def vllm(start):
    c = VllmClient(start(engine="vllm"))
    yield c
    c.http.close()


@pytest.fixture
def slow(start):
    """A vLLM-dialect deployment decoding SLOW s per step until a test calls `fast`."""
    c = VllmClient(start(engine="vllm", token_delay=SLOW))
    yield c
    c.http.close()


def spans_of(stream):
    return stream.final_choice()["weight_versions"]


# --------------------------------------------------------------------------- reload_weights and labels


def test_reload_weights_serves_the_snapshot_and_keeps_the_label(vllm, bucket):
    step(bucket, "step-1")
    assert close(vllm.prompt_logprobs(SHORT), local_prompt_logprobs(bucket / BASE, SHORT))
    r = vllm.reload(bucket / "step-1")
    assert r.status_code == 200 and r.json() == {"results": [None]}
    assert vllm.label() == "default"  # reload_weights does not touch the label
    assert close(vllm.prompt_logprobs(SHORT), local_prompt_logprobs(bucket / "step-1", SHORT))
    assert vllm.set_label("step-1").json() == {"success": True, "new_version": "step-1"}
    assert vllm.label() == "step-1"
    assert vllm.generate(SHORT, max_tokens=2).json()["choices"][0]["weight_versions"][0]["version"] == "step-1"
    # without weights_path, vLLM reloads what it started from
    assert vllm.post("/collective_rpc", {"method": "reload_weights"}).status_code == 200
    assert close(vllm.prompt_logprobs(SHORT), local_prompt_logprobs(bucket / BASE, SHORT))


# every SNAP MUST clause a full checkpoint can break (reload_weights takes nothing else)
FULL_MUST = [
    c.id
    for c in catalogue().area("SNAP")
    if c.level == "MUST" and c.id != "SNAP-ID-1" and broken.BREAKERS[c.id].start == "full"
]


@pytest.mark.parametrize("clause", FULL_MUST)
def test_a_snapshot_that_breaks_a_snap_rule_is_refused_and_the_previous_keeps_serving(
    vllm, bucket, reference, tmp_path, clause
):
    case = broken.broken_case(clause, reference, tmp_path / "broken")
    shutil.copytree(case.snapshot, bucket / "broken")
    before = vllm.prompt_logprobs(SHORT)
    r = vllm.reload(bucket / "broken")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "BadRequestError" and error["message"].startswith("Call to collective_rpc method failed")
    assert clause in error["message"]
    assert vllm.prompt_logprobs(SHORT) == before


@pytest.mark.parametrize("where", ["outside", "nested", "escape", "relative", "missing", "not-a-string"])
def test_reload_weights_stays_inside_the_bucket(vllm, bucket, tmp_path, where):
    elsewhere = tmp_path / "elsewhere"
    step(bucket, "step-1").rename(elsewhere)
    (bucket / "dir").mkdir()
    step(bucket, "step-2").rename(bucket / "dir" / "step-2")
    (bucket / "escape").symlink_to(elsewhere)
    path = {
        "outside": str(elsewhere),
        "nested": str(bucket / "dir" / "step-2"),
        "escape": str(bucket / "escape"),
        "relative": "step-2",
        "missing": str(bucket / "nope"),
        "not-a-string": 5,
    }[where]
    r = vllm.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400, r.text
    assert close(vllm.prompt_logprobs(SHORT), local_prompt_logprobs(bucket / BASE, SHORT))


def test_collective_rpc_refusals(vllm):
    assert vllm.post("/collective_rpc", {}).json()["error"]["message"] == "Missing 'method' in request body"
    assert vllm.post("/collective_rpc", [1]).json()["error"]["message"] == "Request body must be a JSON object"
    other = vllm.post("/collective_rpc", {"method": "reset_weights"})
    assert other.status_code == 400 and "reload_weights" in other.json()["error"]["message"]


def test_a_label_changes_nothing_in_flight(slow):
    s = generating(slow, max_tokens=200)
    slow.set_label("v2")
    fast(slow)
    s.join()
    assert s.done and s.final_choice()["finish_reason"] == "length"
    spans = spans_of(s)
    assert [x["version"] for x in spans] == ["default", "v2"] and spans[-1]["end"] == 200
    assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"]


# --------------------------------------------------------------------------- pause and resume


def test_pause_keep_freezes_streams_and_holds_new_requests_until_resume(slow):
    s = generating(slow, max_tokens=200)
    r = slow.post("/pause", mode="keep", clear_cache=False)
    assert r.status_code == 200 and r.json() == {"status": "paused"}
    assert slow.http.get("/is_paused").json() == {"is_paused": True}
    at_pause = len(s.read_all(slow))
    # two labels set while paused: a token generated between them would carry the first
    slow.set_label("between")
    slow.set_label("after")
    fast(slow)
    answers = []
    body = {"prompt": [1, 2, 3], "max_tokens": 2}
    t = threading.Thread(target=lambda: answers.append(slow.http.post("/v1/completions", json=body)), daemon=True)
    t.start()
    until(lambda: slow.pending() == 1, "the request sent while paused held by the engine")
    assert not answers  # held, not refused
    assert slow.post("/resume").json() == {"status": "resumed"}
    t.join(60)
    assert answers and answers[0].status_code == 200
    s.join()
    assert s.done and s.final_choice()["finish_reason"] == "length" and len(s.token_ids()) == 200
    assert spans_of(s) == [
        {"version": "default", "start": 0, "end": at_pause},
        {"version": "after", "start": at_pause, "end": 200},
    ]
    assert slow.http.get("/is_paused").json() == {"is_paused": False}


def test_a_stream_sent_while_paused_gets_its_headers_at_once_and_its_tokens_after_resume(vllm):
    vllm.post("/pause", mode="keep")
    with vllm.http.stream(
        "POST",
        "/inference/v1/generate",
        json={"token_ids": SHORT, "stream": True, "sampling_params": {"max_tokens": 3, "temperature": 0}},
    ) as r:
        assert r.status_code == 200  # as measured: 200 at once, then nothing until /resume
        until(lambda: vllm.pending() == 1, "the stream held by the engine")
        vllm.post("/resume")
        lines = [x for x in r.iter_lines() if x]
    assert lines[-1] == "data: [DONE]" and len(lines) == 4


def test_pause_and_resume_are_idempotent_and_an_unknown_mode_changes_nothing(vllm):
    bad = vllm.post("/pause", mode="bogus")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "query.mode"
    assert vllm.http.get("/is_paused").json() == {"is_paused": False}
    for _ in range(2):
        assert vllm.post("/pause", mode="keep").json() == {"status": "paused"}
    assert vllm.http.get("/is_paused").json() == {"is_paused": True}
    for _ in range(2):
        assert vllm.post("/resume").json() == {"status": "resumed"}
    assert vllm.http.get("/is_paused").json() == {"is_paused": False}
    assert vllm.post("/pause", mode="keep", clear_cache="maybe").status_code == 400
    assert vllm.complete([1, 2, 3], max_tokens=2).status_code == 200


def test_pause_abort_ends_streams_with_their_partial_output(slow):
    s = generating(slow, max_tokens=200)
    assert slow.post("/pause", mode="abort").json() == {"status": "paused"}
    s.join()  # ended at the pause: no resume needed
    assert s.done and s.error is None
    final = s.final_choice()
    assert final["finish_reason"] == "abort" and 0 < len(s.token_ids()) < 200
    assert spans_of(s) == [{"version": "default", "start": 0, "end": len(s.token_ids())}]
    assert s.chunks[-1]["choices"] == [] and s.chunks[-1]["usage"]["completion_tokens"] == len(s.token_ids())
    fast(slow)
    slow.post("/resume")
    assert slow.complete([1, 2, 3], max_tokens=2).status_code == 200


def test_pause_abort_ends_a_non_streamed_request_too(slow):
    answers = []
    body = {"token_ids": SHORT, "sampling_params": {"max_tokens": 200, "temperature": 0, "ignore_eos": True}}
    t = threading.Thread(target=lambda: answers.append(slow.http.post("/inference/v1/generate", json=body)))
    t.start()
    until(lambda: sum(len(r._active) for r in slow.dep.deployment.replicas) == 1, "the request decoding")
    slow.post("/pause", mode="abort")
    t.join(60)
    doc = answers[0].json()
    assert doc["choices"][0]["finish_reason"] == "abort" and 0 < len(doc["choices"][0]["token_ids"]) < 200
    fast(slow)
    slow.post("/resume")


def test_pause_wait_answers_once_the_streams_finished(slow):
    s = generating(slow, max_tokens=200)
    fast(slow)
    assert slow.post("/pause", mode="wait").json() == {"status": "paused"}
    slow.set_label("after-the-pause")  # the drained stream must never see it
    slow.post("/resume")
    s.join()
    assert s.final_choice()["finish_reason"] == "length" and len(s.token_ids()) == 200
    assert [x["version"] for x in spans_of(s)] == ["default"]


def test_keep_with_clear_cache_recomputes_the_frozen_kv_on_the_new_weights(slow, bucket):
    step(bucket, "step-1")
    s = generating(slow, max_tokens=40, logprobs=0)
    assert slow.post("/pause", mode="keep", clear_cache=True).status_code == 200
    before = s.read_all(slow)
    assert slow.reload(bucket / "step-1").status_code == 200
    fast(slow)
    slow.post("/resume")
    s.join()
    ids = s.token_ids()
    assert len(ids) == 40 and ids[: len(before)] == before
    # the rest is exactly a fresh greedy decode of the prompt and the tokens so far on step-1
    tokens, logprobs, _ = slow.decode(SHORT + before, n=40 - len(before), cache_salt="fresh")
    streamed = [
        e["logprob"] for c in s.chunks for ch in c["choices"] for e in (ch["logprobs"] or {}).get("content", [])
    ]
    assert ids[len(before) :] == tokens and close(streamed[len(before) :], logprobs, 1e-4)


def test_keep_without_clear_cache_resumes_on_the_kv_computed_before(slow, bucket):
    step(bucket, "step-1")
    s = generating(slow, max_tokens=40, logprobs=0)
    assert slow.post("/pause", mode="keep", clear_cache=False).status_code == 200
    before = s.read_all(slow)
    assert slow.reload(bucket / "step-1").status_code == 200
    fast(slow)
    slow.post("/resume")
    s.join()
    _, logprobs, _ = slow.decode(SHORT + before, n=1, cache_salt="fresh")
    streamed = [
        e["logprob"] for c in s.chunks for ch in c["choices"] for e in (ch["logprobs"] or {}).get("content", [])
    ]
    assert abs(streamed[len(before)] - logprobs[0]) > 1e-4  # the old weights' KV, as vLLM keeps it


def test_pause_clears_the_prefix_cache_unless_told_not_to(vllm):
    vllm.cached(LONG)
    for mode in ("abort", "wait", "keep"):
        vllm.post("/pause", mode=mode, clear_cache=False)
        vllm.post("/resume")
        assert vllm.cached(LONG) == 256, mode
    for mode in ("abort", "wait", "keep"):
        vllm.post("/pause", mode=mode)  # clear_cache defaults to true
        vllm.post("/resume")
        assert vllm.cached(LONG) == 0, mode
        vllm.cached(LONG)


# --------------------------------------------------------------------------- API keys


def test_an_api_key_guards_inference_and_the_rl_routes(start):
    c = VllmClient(start(engine="vllm", api_key="the-key"))
    assert c.complete([1, 2, 3], max_tokens=1).json() == {"error": "Unauthorized"}
    for method, path in [
        ("POST", "/pause"),
        ("POST", "/resume"),
        ("POST", "/collective_rpc"),
        ("GET", "/weight_info"),
        ("POST", "/update_weight_version"),
        ("POST", "/reset_prefix_cache"),
        ("GET", "/is_paused"),
        ("GET", "/v1/models"),
        ("POST", "/inference/v1/generate"),
    ]:
        assert c.http.request(method, path, headers={"Authorization": "Bearer wrong"}).status_code == 401, path
    assert c.http.get("/version").status_code == 200 and c.http.get("/health").status_code == 200
    key = {"Authorization": "Bearer the-key"}
    assert c.http.get("/is_paused", headers=key).json() == {"is_paused": False}  # the refused pause changed nothing
    assert c.http.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 1}, headers=key).status_code == 200


# --------------------------------------------------------------------------- the prefix cache


def test_reset_prefix_cache_drops_every_prefix(vllm):
    vllm.cached(LONG)
    vllm.cached(LONG, cache_salt="a")
    assert vllm.cached(LONG) == 256
    assert vllm.post("/reset_prefix_cache").json() == {"success": True}
    assert vllm.cached(LONG) == 0 and vllm.cached(LONG, cache_salt="a") == 0


def test_reload_keeps_the_prefix_cache_until_it_is_reset(vllm, bucket):
    step(bucket, "step-1")
    vllm.cached(LONG)
    vllm.reload(bucket / "step-1")
    assert vllm.cached(LONG) == 256  # vLLM's reload_weights leaves the prefix cache alone
    vllm.post("/reset_prefix_cache")
    assert vllm.cached(LONG) == 0


def test_a_reset_while_requests_decode_says_it_did_not_happen(slow):
    slow.cached(SHORT + LONG)  # cached: SHORT + LONG's first two blocks
    s = generating(slow, ids=LONG, max_tokens=100)
    assert slow.post("/reset_prefix_cache").json() == {"success": False}  # as vLLM, while blocks are held
    fast(slow)
    s.join()
    assert slow.cached(SHORT + LONG) == 256  # nothing was reset


def test_a_reset_of_running_requests_preempts_them_and_they_finish_alike(slow):
    whole = slow.decode(SHORT, n=100, cache_salt="uninterrupted")[0]
    s = generating(slow, max_tokens=100)
    assert slow.post("/reset_prefix_cache", reset_running_requests=True).json() == {"success": True}
    fast(slow)
    s.join()
    assert s.done and s.token_ids() == whole  # recomputed on the same weights: token for token
    assert slow.cached(SHORT + whole[:-1]) == 0  # computed (partly) before the reset: not cached after it


def test_a_frozen_request_holds_a_reset_up_unless_it_is_preempted_and_then_goes_on(slow):
    whole = slow.decode(SHORT, n=100, cache_salt="uninterrupted")[0]
    slow.cached(LONG)
    s = generating(slow, max_tokens=100)
    slow.post("/pause", mode="keep", clear_cache=False)
    assert slow.post("/reset_prefix_cache").json() == {"success": False}  # measured on vLLM 0.32 too
    assert slow.post("/reset_prefix_cache", reset_running_requests=True).json() == {"success": True}
    fast(slow)
    slow.post("/resume")
    s.join()
    assert s.token_ids() == whole and slow.cached(LONG) == 0


def test_a_reload_waiting_on_a_deployment_that_closes_gives_up(start, bucket):
    """A reload returns once every replica swapped; a replica stopped with its deployment never
    will. The reload then ends (503) instead of holding its pool thread for good, which the
    interpreter joins at exit: `rlrollout serve` stopped during a reload would never end."""
    from pytest_rlrollout.reference.controller import HotLoadError

    dep = start(engine="vllm").deployment
    step(bucket, "step-1")
    for replica in dep.replicas:  # stopped first, as a close under way stops them
        replica.stop()
        replica.join(timeout=30)
    ended: list[BaseException] = []

    def reload() -> None:
        try:
            dep.reload_weights(str(bucket / "step-1"))
        except HotLoadError as e:
            ended.append(e)

    waiting = threading.Thread(target=reload, daemon=True)  # daemon: a failure here must not hang the run
    waiting.start()
    dep.close()
    waiting.join(timeout=30)
    assert not waiting.is_alive() and ended and ended[0].status == 503, ended
