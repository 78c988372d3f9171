"""Every fault switch of a clause the vLLM binding covers breaks that clause on the vLLM wire: one
proof per switch (`switches_for("vllm")`), each driving a vLLM-dialect deployment with the switch
on and showing, through vLLM's routes alone, what the clause forbids. The behaviour without the
switch is proven in test_vllm_dialect.py and test_vllm_control.py."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from pytest_rlrollout.reference.faults import switches_for
from pytest_rlrollout.reference.model import Model, Sequence_
from pytest_rlrollout.remote.openai_wire import routed_experts
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

PROOFS: dict[str, Callable[..., None]] = {}


def proof(*switches: str):
    def register(fn):
        for s in switches:
            PROOFS[s] = fn
        return fn

    return register


class Case:
    """A proof's deployment (the switch on) and what it needs."""

    def __init__(self, start, bucket, reference, tmp_path, fault):
        self._start, self.bucket, self.reference, self.tmp_path, self.fault = start, bucket, reference, tmp_path, fault

    def client(self, **settings) -> VllmClient:
        return VllmClient(self._start(engine="vllm", faults={self.fault}, **settings))


@pytest.mark.parametrize("switch", switches_for("vllm"))
def test_every_vllm_switch_is_observable_on_the_vllm_wire(start, bucket, reference, tmp_path, switch):
    prove = PROOFS.get(switch) or (snap_rule_let_through if switch.startswith("SNAP-") else None)
    assert prove is not None, f"no proof that {switch} shows on the vLLM wire"
    prove(Case(start, bucket, reference, tmp_path, switch))


def snap_rule_let_through(case):
    """A SNAP switch: reload_weights of that rule's broken variant is no longer refused."""
    c = case.client()
    shutil.copytree(broken.broken_case(case.fault, case.reference, case.tmp_path / "b").snapshot, case.bucket / "bad")
    r = c.reload(case.bucket / "bad")
    assert r.status_code == 200 and r.json() == {"results": [None]}


def spans(stream) -> list[dict]:
    return stream.final_choice()["weight_versions"]


def fingerprint_is(c: VllmClient, snapshot) -> bool:
    return close(c.prompt_logprobs(SHORT), local_prompt_logprobs(snapshot, SHORT), 1e-5)


# --------------------------------------------------------------------------- HL: loads and what is served


@proof("HL-AUTH-1")
def _(case):
    c = case.client(api_key="the-key")
    assert c.complete([1, 2, 3], max_tokens=1).status_code == 401  # inference still asks for the key
    assert c.post("/pause", mode="keep").status_code == 200  # the RL routes do not
    assert c.http.get("/is_paused", headers={"Authorization": "Bearer the-key"}).json() == {"is_paused": True}


@proof("HL-POST-1")
def _(case):
    c = case.client()
    step(case.bucket, "step-1")
    r = c.reload(case.bucket / "step-1")
    assert r.status_code == 200 and r.content == b""  # not a JSON object


@proof("HL-POST-5")
def _(case):
    c = case.client()
    shutil.copytree(
        broken.broken_case("SNAP-SPEC-1", case.reference, case.tmp_path / "b").snapshot, case.bucket / "broken"
    )
    assert c.reload(case.bucket / "broken").status_code == 200  # a snapshot violating SNAP-SPEC-1, served


@proof("HL-GET-1")
def _(case):
    doc = case.client().http.get("/weight_info").json()
    assert "weight_version" not in doc


@proof("HL-GET-2")
def _(case):
    c = case.client()
    step(case.bucket, "step-1")
    c.swap(case.bucket / "step-1", "step-1")
    assert c.label() == "default"  # /weight_info never names the label set


# --------------------------------------------------------------------------- SWAP: a swap with streams in flight


@proof("SWAP-ASYNC-1")
def _(case):
    c = case.client(token_delay=SLOW)
    step(case.bucket, "step-1")
    s = generating(c, max_tokens=200)
    c.swap(case.bucket / "step-1", "step-1")
    s.join()
    assert not s.done and s.final_choice()["finish_reason"] == "abort"  # cut at the swap, no [DONE]


@proof("SWAP-ASYNC-2")
def _(case):
    c = case.client(token_delay=SLOW)
    step(case.bucket, "step-1")
    s = generating(c, max_tokens=60)
    c.swap(case.bucket / "step-1", "step-1")
    fast(c)
    s.join()
    assert len(spans(s)) > 2  # the versions alternate: more than one change


@proof("SWAP-ASYNC-2:stale")
def _(case):
    c = case.client(token_delay=SLOW)
    step(case.bucket, "step-1")
    s = generating(c, max_tokens=60)
    c.swap(case.bucket / "step-1", "step-1")
    fast(c)
    s.join()
    assert [x["version"] for x in spans(s)] == ["default"]  # tokens generated after the swap say the old label


@proof("SWAP-ASYNC-3")
def _(case):
    c = case.client()
    step(case.bucket, "step-1")
    c.post("/pause", mode="keep", clear_cache=False)
    c.reload(case.bucket / "step-1")
    assert c.complete([1, 2, 3], max_tokens=2).status_code == 425  # not held until the resume


@proof("SWAP-NEW-1")
def _(case):
    c = case.client()
    step(case.bucket, "step-1")
    c.swap(case.bucket / "step-1", "step-1")
    assert c.label() == "step-1"
    doc = c.generate(SHORT, max_tokens=2).json()
    assert doc["choices"][0]["weight_versions"][0]["version"] == "default"


@proof("SWAP-KV-1")
def _(case):
    c = case.client(token_delay=SLOW)
    s = generating(c, max_tokens=200)
    c.post("/reset_prefix_cache")
    fast(c)
    s.join()
    assert any("error" in ch for ch in s.chunks)  # the stream ends with an error event


# --------------------------------------------------------------------------- R3: routed_experts
# (on with routed_experts=True, vLLM's --enable-return-routed-experts)


def routed(c: VllmClient, ids=SHORT, n: int = 3, **extra) -> np.ndarray | None:
    """The rows of a non-streamed greedy generate request's routed_experts (None: none said)."""
    return routed_experts(
        c.generate(ids, max_tokens=n, ignore_eos=True, **extra).json()["choices"][0]["routed_experts"]
    )


def engine_routing(snapshot, ids=SHORT) -> np.ndarray:
    """The numpy engine's routing of every prompt position [positions, L, k], computed here."""
    return Model.load(snapshot).step([Sequence_()], [list(ids)], None)[0].routing


def same_experts(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool((np.sort(a, -1) == np.sort(b, -1)).all())


@proof("R3-SHAPE-1")
def _(case):
    rows = routed(case.client(routed_experts=True))
    assert rows.shape[-1] == engine_routing(case.bucket / BASE).shape[-1] - 1  # one expert short in every row


@proof("R3-RANGE-1")
def _(case):
    rows = routed(case.client(routed_experts=True))
    assert (rows[:, -1, -1] == Model.load(case.bucket / BASE).experts).all()  # an expert that does not exist


@proof("R3-COMP-1")
def _(case):
    c = case.client(routed_experts=True)
    assert routed(c) is None  # non-streamed: none
    s = generating(c, max_tokens=3).join()
    assert routed_experts(s.final_choice()["routed_experts"]) is not None  # streamed: said


@proof("R3-ECHO-1")
def _(case):
    assert len(routed(case.client(routed_experts=True))) == 3  # the output's positions only, no prompt rows


@proof("R3-DET-1")
def _(case):
    c = case.client(routed_experts=True)
    a, b = routed(c), routed(c)
    assert same_experts(a, b) and not (a == b).all()  # the same experts, listed in another order


@proof("NUM-ROUTE-1")
def _(case):
    rows = routed(case.client(routed_experts=True))[: len(SHORT)]
    want = engine_routing(case.bucket / BASE)
    assert same_experts(rows, want[:, ::-1]) and not same_experts(rows, want)  # the layers in reverse order


@proof("R3-CACHE-1")
def _(case):
    c = case.client(routed_experts=True)
    first = routed(c, LONG, n=1)
    assert c.cached(LONG) == 256
    again = routed(c, LONG, n=1)
    assert same_experts(first, engine_routing(case.bucket / BASE, LONG))
    assert not same_experts(again[:256], first[:256])  # cached positions report another position's routing


@proof("R3-CHANGE-1")
def _(case):
    c = case.client(routed_experts=True)
    step(case.bucket, "step-1")
    before = routed(c)[: len(SHORT)]
    c.swap(case.bucket / "step-1", "step-1")
    assert not same_experts(engine_routing(case.bucket / "step-1"), engine_routing(case.bucket / BASE))
    assert same_experts(routed(c)[: len(SHORT)], before)  # the routers changed; the routing said did not


# --------------------------------------------------------------------------- CACHE


@proof("CACHE-RPT-1")
def _(case):
    c = case.client()
    r = c.complete(LONG, max_tokens=1, stream=True, stream_options={"include_usage": True})
    usage = [x for x in r.text.split("\n") if '"usage"' in x][-1]
    assert "prompt_tokens_details" not in usage


@proof("CACHE-HIT-1")
def _(case):
    c = case.client()
    c.cached(LONG)
    assert c.cached(LONG) == 0


def _cached_before_a_load(case, reset: bool):
    """LONG cached by session s1 on the base; then step-1 reloaded (and the cache reset)."""
    c = case.client()
    step(case.bucket, "step-1")
    s1 = {"x-multi-turn-session-id": "s1"}
    c.decode(LONG, n=1, headers=s1)
    assert c.decode(LONG, n=1, headers=s1)[2] == 256
    c.swap(case.bucket / "step-1", "step-1", reset=reset)
    return c, s1, {"x-multi-turn-session-id": "s2"}


@proof("CACHE-MATRIX-ALL-SAME")
def _(case):
    c, same, _ = _cached_before_a_load(case, reset=True)
    assert c.decode(LONG, n=1, headers=same)[2] == 256  # the reset left the session its prefix


@proof("CACHE-MATRIX-ALL-NEW")
def _(case):
    c, _, other = _cached_before_a_load(case, reset=True)
    assert c.decode(LONG, n=1, headers=other)[2] == 256


@proof("CACHE-MATRIX-NONE-SAME")
def _(case):
    c, same, _ = _cached_before_a_load(case, reset=False)
    assert c.decode(LONG, n=1, headers=same)[2] == 0  # no reset, and still recomputed


@proof("CACHE-MATRIX-NONE-NEW")
def _(case):
    c, _, other = _cached_before_a_load(case, reset=False)
    assert c.decode(LONG, n=1, headers=other)[2] == 0


@proof("CACHE-ISO-1")
def _(case):
    c = case.client()
    c.cached(LONG, cache_salt="a")
    assert c.cached(LONG, cache_salt="b") == 256


@proof("CACHE-EQ-1")
def _(case):
    c = case.client()
    cold = c.decode(LONG)
    warm = c.decode(LONG)
    assert warm[2] == 256 and not close(cold[1], warm[1], 1e-4)


# --------------------------------------------------------------------------- INF


@proof("INF-SSE-1")
def _(case):
    c = case.client()
    r = c.complete([1, 2, 3], max_tokens=2, stream=True, stream_options={"include_usage": True})
    events = [x for x in r.text.split("\n") if x]
    assert events[-1] == "data: [DONE]" and '"usage":null' in events[-2] and '"prompt_tokens"' in events[-3]


@proof("INF-LOGPROBS-1")
def _(case):
    lp = case.client().complete([1, 2, 3], max_tokens=3, logprobs=0).json()["choices"][0]["logprobs"]
    assert all(x > 0 for x in lp["token_logprobs"])


@proof("INF-USAGE-1")
def _(case):
    doc = case.client().complete([1, 2, 3], max_tokens=3, return_token_ids=True).json()
    assert doc["usage"]["completion_tokens"] == len(doc["choices"][0]["token_ids"]) + 1


@proof("INF-TOKENIDS-1")
def _(case):
    c = case.client()
    doc = c.complete([1, 2, 3], max_tokens=3, return_token_ids=True).json()
    assert len(doc["choices"][0]["token_ids"]) == doc["usage"]["completion_tokens"] - 1
    generated = c.generate([1, 2, 3], max_tokens=3).json()
    assert len(generated["choices"][0]["token_ids"]) == 2


@proof("INF-ERR-1")
def _(case):
    r = case.client().http.post("/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 500


# --------------------------------------------------------------------------- NUM, FID: the weights served


@proof("NUM-LOGPROB-1")
def _(case):
    c = case.client()
    assert not fingerprint_is(c, case.bucket / BASE)  # logits rounded to bfloat16


@proof("FID-SAME-1")
def _(case):
    c = case.client()
    shutil.copytree(case.bucket / BASE, case.bucket / "base-copy")
    assert fingerprint_is(c, case.bucket / BASE)
    c.reload(case.bucket / "base-copy")  # the same weights, loaded by another path
    assert not fingerprint_is(c, case.bucket / BASE)  # the experts read in another layout


@proof("FID-SAME-1:experts")
def _(case):
    c = case.client()
    step(case.bucket, "step-1")
    step(case.bucket, "step-2", seed=2)
    c.reload(case.bucket / "step-1")
    assert fingerprint_is(c, case.bucket / "step-1")  # the first reload is whole
    c.reload(case.bucket / "step-2")
    assert not fingerprint_is(c, case.bucket / "step-2")


@proof("FID-SWAP-1", "FID-SWAP-1:one")
def _(case):
    c = case.client()
    step(case.bucket, "step-1")
    c.swap(case.bucket / "step-1", "step-1")
    assert c.label() == "step-1" and fingerprint_is(c, case.bucket / BASE)  # the label moved, the weights did not


@proof("FID-CACHE-1")
def _(case):
    c = case.client()
    step(case.bucket, "step-1")
    c.decode(LONG)
    c.swap(case.bucket / "step-1", "step-1", reset=True)
    stale = c.decode(LONG)
    fresh = c.decode(LONG, cache_salt="fresh")
    assert stale[2] == 0 and not close(stale[1], fresh[1], 1e-4)  # reused, and said not to be


@proof("FID-DECODE-1")
def _(case):
    c = case.client()
    tokens, decoded, _ = c.decode(SHORT, n=6)
    scored = c.prompt_logprobs(SHORT + tokens)[-6:]
    assert not close(decoded, scored, 1e-4)  # decode logprobs in bfloat16, prefill ones in float32


@proof("FID-BATCH-1")
def _(case):
    c = case.client(token_delay=SLOW)
    alone = c.prompt_logprobs(SHORT)
    s = generating(c, ids=[5, 6, 7], max_tokens=400)  # a stream decoding beside the next request
    beside = c.prompt_logprobs(SHORT)
    fast(c)
    s.join()
    assert not close(alone, beside, 1e-5)


# --------------------------------------------------------------------------- VER


@proof("VER-NONSTREAM-1")
def _(case):
    c = case.client()
    c.set_label("v1")
    assert c.generate(SHORT, max_tokens=2).json()["choices"][0]["weight_versions"][0]["version"] == "default"
    assert spans(generating(c, max_tokens=2).join()) == [{"version": "v1", "start": 0, "end": 2}]


@proof("VER-SPAN-1")
def _(case):
    got = case.client().generate(SHORT, max_tokens=6).json()["choices"][0]["weight_versions"]
    assert got[0]["end"] < got[1]["start"]  # a token no span covers


@proof("VER-SPAN-1:overlap")
def _(case):
    got = case.client().generate(SHORT, max_tokens=6).json()["choices"][0]["weight_versions"]
    assert got[0]["end"] > got[1]["start"]  # a token two spans cover


# --------------------------------------------------------------------------- CTL


@proof("CTL-PAUSE-1")
def _(case):
    c = case.client()
    assert c.post("/pause", mode="keep").json() == {"status": "paused"}
    assert c.http.get("/is_paused").json() == {"is_paused": True}
    assert c.complete([1, 2, 3], max_tokens=2).status_code == 200  # answered while paused: generation went on


@proof("CTL-PAUSE-1:refuse")
def _(case):
    c = case.client()
    c.post("/pause", mode="keep")
    assert c.complete([1, 2, 3], max_tokens=2).status_code == 503


@proof("CTL-PAUSE-2")
def _(case):
    c = case.client(token_delay=SLOW)
    s = generating(c, max_tokens=200)
    c.post("/pause", mode="abort")
    s.join()
    assert isinstance(s.error, httpx.RemoteProtocolError) and not s.done  # the connection dropped mid-stream


@proof("CTL-PAUSE-3")
def _(case):
    c = case.client(token_delay=SLOW)
    s = generating(c, max_tokens=40)
    c.post("/pause", mode="keep", clear_cache=False)
    before = s.read_all(c)
    fast(c)
    c.post("/resume")
    s.join()
    ids = s.token_ids()
    assert len(ids) == 40 + len(before) and ids[len(before) : 2 * len(before)] == before  # the output started over


@proof("CTL-PAUSE-4")
def _(case):
    c = case.client(token_delay=SLOW)
    s = generating(c, max_tokens=200)
    assert c.post("/pause", mode="wait").json() == {"status": "paused"}
    assert sum(len(r._active) for r in c.dep.deployment.replicas) == 1  # the stream has not finished
    c.set_label("after-the-pause")
    fast(c)
    c.post("/resume")
    s.join()
    assert [x["version"] for x in spans(s)] == ["default", "after-the-pause"]


@proof("CTL-PAUSE-5")
def _(case):
    c = case.client()
    assert c.post("/pause", mode="bogus").status_code == 200
    assert c.http.get("/is_paused").json() == {"is_paused": True}


@proof("CTL-LABEL-1")
def _(case):
    c = case.client()
    step(case.bucket, "step-1")
    c.swap(case.bucket / "step-1", "step-1")
    assert c.label() == "step-1" and fingerprint_is(c, case.bucket / BASE)  # the label names the old weights
    until(lambda: fingerprint_is(c, case.bucket / "step-1"), "the late swap")  # ... for a while


@proof("CTL-LABEL-1:aborts")
def _(case):
    c = case.client(token_delay=SLOW)
    s = generating(c, max_tokens=200)
    c.set_label("v2")
    s.join()
    assert s.final_choice()["finish_reason"] == "abort" and len(s.token_ids()) < 200


@proof("CTL-CACHE-1")
def _(case):
    c = case.client()
    step(case.bucket, "step-1")
    c.decode(LONG)
    c.reload(case.bucket / "step-1")
    assert c.post("/reset_prefix_cache").json() == {"success": True}
    after = c.decode(LONG)
    fresh = c.decode(LONG, cache_salt="fresh")
    assert after[2] == 0 and not close(after[1], fresh[1], 1e-4)  # the KV of before the reset, reused unannounced


def test_the_ctl_and_span_switches_do_nothing_on_the_fireworks_wire(start):
    """Their clauses have no Fireworks binding: a Fireworks deployment with them on answers as without."""
    ctl = {s for s in switches_for("vllm") if s.startswith(("CTL-", "VER-SPAN-"))}
    dep = start(faults=ctl)
    r = httpx.post(
        dep.base_url + "/inference/v1/completions",
        json={"model": dep.name, "prompt": [1, 2, 3], "max_tokens": 3, "stream": True},
        headers={"Authorization": f"Bearer {dep.api_key}"},
        timeout=30,
    )
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
