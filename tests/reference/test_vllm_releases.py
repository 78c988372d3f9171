"""The vLLM dialect speaks 0.32.0 (measured on its CPU build) or 0.33.0 (read from its wheel):
0.33 refuses a request arriving while generation is paused in abort or wait mode (503
ServiceUnavailableError, retryable; a stream gets an error event in a 200) where 0.32 held it,
still holds it in keep mode, and returns the policy-version spans on its OpenAI routes when asked
(`return_weight_versions`), which 0.32 accepts and ignores."""

import json
import re
import threading

import pytest

from pytest_rlrollout.engines.vllm import PAUSED_MESSAGE, at_least
from pytest_rlrollout.reference.settings import Settings

from .vllm_support import SHORT, VllmClient, until

REFUSED = {"error": {"message": PAUSED_MESSAGE, "type": "ServiceUnavailableError", "param": None, "code": 503}}


@pytest.fixture(params=["0.32.0", "0.33.0"])
def vllm(start, request):
    c = VllmClient(start(engine="vllm", vllm_release=request.param))
    c.release = request.param
    yield c
    c.http.post("/resume")
    c.http.close()


def held_until_resumed(vllm, body) -> None:
    """A request sent while paused is held by the engine, and answered 200 once resumed."""
    answers = []
    t = threading.Thread(target=lambda: answers.append(vllm.post("/v1/completions", body)), daemon=True)
    t.start()
    until(lambda: vllm.pending() == 1, "the request held by the engine")
    assert not answers
    vllm.post("/resume")
    t.join(60)
    assert answers[0].status_code == 200


def sse(client, path, body) -> tuple[int, list[str]]:
    with client.http.stream("POST", path, json={**body, "stream": True}) as r:
        return r.status_code, [x for x in r.iter_lines() if x]


def test_get_version_names_the_release(vllm):
    assert vllm.http.get("/version").json() == {"version": vllm.release}


@pytest.mark.parametrize("mode", ["abort", "wait"])
def test_a_request_arriving_while_paused_in_abort_or_wait_mode(vllm, mode):
    """0.33: refused at once, in each route's own shape; 0.32: held until the resume."""
    assert vllm.post("/pause", mode=mode).status_code == 200
    body = {"model": "tiny", "prompt": SHORT, "max_tokens": 2}
    if vllm.release == "0.32.0":
        held_until_resumed(vllm, body)
        return
    r = vllm.post("/v1/completions", body)
    assert (r.status_code, r.json()) == (503, REFUSED)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert (vllm.post("/v1/chat/completions", chat).status_code, vllm.pending()) == (503, 0)
    status, lines = sse(vllm, "/v1/completions", body)
    assert status == 200 and lines == [f"data: {json.dumps(REFUSED)}", "data: [DONE]"]
    status, lines = sse(vllm, "/v1/chat/completions", chat)
    inside = {"error": {**REFUSED["error"], "type": "InternalServerError"}}
    assert status == 200 and [json.loads(lines[0][6:]), lines[1]] == [inside, "data: [DONE]"]
    gen = vllm.http.post("/inference/v1/generate", json={"token_ids": SHORT, "sampling_params": {"max_tokens": 2}})
    assert gen.status_code == 503 and gen.json() == REFUSED
    assert vllm.http.get("/is_paused").json() == {"is_paused": True}
    vllm.post("/resume")
    assert vllm.post("/v1/completions", body).status_code == 200  # the refusal ends with the pause


def test_keep_mode_holds_an_arrival_in_both_releases(vllm):
    assert vllm.post("/pause", mode="keep").status_code == 200
    held_until_resumed(vllm, {"model": "tiny", "prompt": SHORT, "max_tokens": 2})


def test_the_openai_routes_return_spans_when_asked_from_0_33(vllm):
    vllm.set_label("step-7")
    body = {"model": "tiny", "prompt": SHORT, "max_tokens": 3, "return_weight_versions": True}
    want = [{"version": "step-7", "start": 0, "end": 3}] if vllm.release == "0.33.0" else None
    assert vllm.post("/v1/completions", body).json()["choices"][0].get("weight_versions") == want
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "return_weight_versions": True,
        "ignore_eos": True,
    }
    assert vllm.post("/v1/chat/completions", chat).json()["choices"][0].get("weight_versions") == want
    _, lines = sse(vllm, "/v1/completions", body)
    chunks = [json.loads(x[6:]) for x in lines[:-1]]
    # only the last chunk of the choice carries them; 0.33's earlier completion chunks say null
    assert [c["choices"][0].get("weight_versions") for c in chunks] == [None] * (len(chunks) - 1) + [want]
    asked_not = vllm.post("/v1/completions", {**body, "return_weight_versions": False}).json()["choices"][0]
    assert asked_not.get("weight_versions") is None


def test_a_release_the_dialect_does_not_speak_is_refused(bucket):
    with pytest.raises(ValueError, match=re.escape("vllm_release '0.31.0': one of 0.32.0, 0.33.0")):
        Settings(bucket, vllm_release="0.31.0")


@pytest.mark.parametrize(
    ("release", "later"),
    [
        ("0.32.0", False),
        ("0.32.9", False),
        ("0.33.0", True),
        ("0.33.0rc1", True),
        ("0.33.1.dev3+gabc", True),
        ("1.0", True),
        ("0.4.2", False),
    ],
)
def test_releases_compare_by_their_numbers(release, later):
    assert at_least(release, "0.33.0") is later
