"""The deployment client against the reference deployment."""

import json

import numpy as np
import pytest

from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.drivers import FireworksDriver, Status
from pytest_rlrollout.remote.drivers.fireworks import HotLoadAPI
from pytest_rlrollout.remote.replicas import WaitEnd
from pytest_rlrollout.remote.stream import routing_matrix
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.snapshot import build, tiny_moe

BASE = tiny_moe.BASE_IDENTITY


def client_for(dep):
    return DeploymentClient(Target(dep.name, dep.base_url, dep.model, dep.api_key))


@pytest.mark.parametrize(
    "name", ["accounts/a/models/m", "a/deployments/d", "accounts//deployments/d", "accounts/a/deployments"]
)
def test_target_names_must_be_deployments(name):
    with pytest.raises(ValueError, match="accounts/<account>/deployments/<deployment>"):
        Target(name, "http://x", "m", "k")


def test_target_defaults():
    t = Target("accounts/a/deployments/d", "https://api.example/", "accounts/a/models/m", "k")
    assert t.inference_base == "https://api.example/inference" and t.account == "a" and t.deployment_id == "d"
    assert t.body_model == "accounts/a/deployments/d" and t.name == "accounts/a/deployments/d"
    plain = Target(None, "http://127.0.0.1:8000/", "tiny", "", engine="openai")
    assert plain.inference_base == "http://127.0.0.1:8000" and plain.body_model == "tiny"
    assert plain.name == "tiny at http://127.0.0.1:8000/"
    given = Target(None, "http://x", "m", "", inference_url="http://y/api/", engine="openai")
    assert given.inference_base == "http://y/api"


def test_exchanges_are_kept_without_the_key(dep):
    with client_for(dep) as c:
        c.complete({"prompt": [1, 2], "max_tokens": 1, "user": dep.api_key})
        HotLoadAPI(c).status()
    sent, polled = c.exchanges
    assert sent.method == "POST" and sent.path == "/inference/v1/completions" and sent.status == 200
    assert dep.api_key not in sent.request and "<key>" in sent.request and '"choices"' in sent.response
    assert polled.text().startswith("GET /hot_load/v1/models/hot_load -> 200")


def test_a_usage_only_chunk_and_junk_are_parsed_without_raising():
    import httpx

    events = [
        {"choices": [{"index": 0, "text": "a", "finish_reason": "stop"}], "model": "m@x"},
        {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}},
    ]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [1, 2]\n\ndata: [DONE]"
    sse = {"content-type": "text/event-stream"}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, headers=sse, text=body))
    with DeploymentClient(Target(None, "http://x", "m", "", engine="openai"), transport=transport) as c:
        s = c.complete({"prompt": "hi", "stream": True})
    assert s.finish_reason == "stop" and s.usage["total_tokens"] == 3 and s.choices()[0]["text"] == "a"
    assert s.problems == ["event 3 is not a JSON object: '[1, 2]'"]
    assert s.unterminated and not s.done  # the [DONE] lacked its blank line
    with pytest.raises(AssertionError, match="not a JSON object"):
        s.expect_ok()


def test_hot_load_and_wait_with_progress(dep, bucket):
    build.derive(bucket / BASE, bucket / "step-1", build.perturbed(bucket / BASE, seed=1))
    seen = []
    with client_for(dep) as c:
        assert HotLoadAPI(c).served_identities() == [BASE, BASE]
        assert HotLoadAPI(c).hot_load({"identity": "step-1"}).status_code == 200
        waited = FireworksDriver(c).wait("step-1", timeout=20, poll=0.01, progress=seen.append)
        assert waited.ok and waited.error is None and len(waited.replicas) == 2
        assert seen and all(len(s) == 2 for s in seen)
        assert HotLoadAPI(c).served_identities() == ["step-1", "step-1"]
        assert HotLoadAPI(c).ledger().json()["entries"][0]["identity"] == "step-1"


def test_wait_reports_a_failed_load_and_a_deadline(start, bucket):
    dep = start(load_delay=0.3)
    build.derive(bucket / BASE, bucket / "step-1", build.perturbed(bucket / BASE, seed=1))
    with client_for(dep) as c:
        assert HotLoadAPI(c).hot_load({"identity": "step-1"}).status_code == 200
        (bucket / "step-1" / "model-00002-of-00005.safetensors").write_bytes(b"")
        failed = FireworksDriver(c).wait("step-1", timeout=20, poll=0.01)
        assert failed.end is WaitEnd.FAILED and not failed.ok and "step-1" not in HotLoadAPI(c).served_identities()
        never = FireworksDriver(c).wait("never-signalled", timeout=0.2, poll=0.01)
        assert never.end is WaitEnd.TIMED_OUT and not never.ok and "within" in never.error


def replica(identity, stage="ready"):
    return {
        "name": identity,
        "readiness": True,
        "current_snapshot_identity": identity,
        "loading_state": {"stage": stage, "target_snapshot_identity": "new"},
    }


class Scripted(FireworksDriver):
    """A driver whose status reads are given: each wait ending from what the replicas say."""

    def __init__(self, reads):
        super().__init__(DeploymentClient(Target(None, "http://x", "m", "", engine="openai")))
        self.reads = iter(reads)

    def status(self, *, headers=None):
        import httpx

        replicas, problems = next(self.reads)
        return Status(httpx.Response(200), replicas, problems)


@pytest.mark.parametrize(
    ("reads", "end"),
    [
        ([([replica("old")], []), ([replica("new"), replica("new")], [])], WaitEnd.SERVED),
        ([([], ["GET status: no 'replicas' list"])], WaitEnd.UNREADABLE),
        ([([replica("new"), replica("old", "error")], [])], WaitEnd.FAILED),
        ([([replica("new"), replica("old")], [])] * 1000, WaitEnd.STALLED),
    ],
    ids=["served", "unreadable", "failed", "stalled"],
)
def test_each_wait_ending_is_typed(reads, end):
    """Verdicts branch on how a wait ended, never on its message's words."""
    waited = Scripted(reads).wait("new", timeout=5, poll=0.001, stalled_after=0.01)
    assert waited.end is end and waited.ok == (end is WaitEnd.SERVED)
    assert (waited.error is None) == waited.ok


def test_streams_are_parsed_into_contract_terms(dep):
    with client_for(dep) as c:
        body = {
            "prompt": list(range(10, 90)),
            "max_tokens": 5,
            "temperature": 0,
            "logprobs": True,
            "include_routing_matrix": True,
            "perf_metrics_in_response": True,
            "stream": True,
        }
        headers = {"x-multi-turn-session-id": "s"}
        first = c.complete(body, headers=headers)
        again = c.complete(body, headers=headers)
    assert first.status == 200 and first.done and first.finish_reason == "length"
    assert set(first.versions) == {BASE} and len(first.entries) == 5
    assert all(routing_matrix(e, 3, 2).shape == (3, 2) for e in first.entries)
    assert first.cached_tokens() == {"usage": 0, "header": 0, "perf_metrics": 0}
    assert again.cached_tokens() == {"usage": 64, "header": 64, "perf_metrics": 64}
    with pytest.raises(ValueError, match="expected L\\*k"):
        routing_matrix(first.entries[0], 3, 3)


def test_non_streaming_and_errors(dep):
    with client_for(dep) as c:
        ok = c.complete({"prompt": [1, 2], "max_tokens": 2, "temperature": 0})
        bad = c.complete({"prompt": [], "max_tokens": 2})
        chat = c.complete(
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}, chat=True
        )
    assert ok.status == 200 and ok.versions == [BASE] and ok.usage["completion_tokens"] == 2
    assert bad.status == 400 and bad.chunks == []
    assert chat.status == 200 and chat.final["object"] == "chat.completion"


def test_routing_matrix_decoding():
    import base64

    entry = {"routing_matrix": base64.b64encode(bytes([1, 2, 3, 4, 5, 6])).decode()}
    assert np.array_equal(routing_matrix(entry, 3, 2), np.array([[1, 2], [3, 4], [5, 6]], np.uint8))


def test_a_stream_as_long_as_asked_for_never_meets_a_bound_of_the_suites_own():
    """Limits.events bounds a stream of a few tokens; a stream asked for more tokens than that
    (a slow swap's crossing stream: 18,000 tokens for a 2-minute swap) may have twice as many
    events. Past twice what was asked for, the deployment's stream is what broke the bound."""
    import httpx

    from pytest_rlrollout.remote.limits import LimitExceeded, Limits

    chunk = "data: " + json.dumps({"choices": [{"index": 0, "text": "a", "finish_reason": None}], "model": "m@x"})
    sse = {"content-type": "text/event-stream"}

    def stream(events: int) -> httpx.MockTransport:
        body = f"{chunk}\n\n" * events + "data: [DONE]\n\n"
        return httpx.MockTransport(lambda request: httpx.Response(200, headers=sse, text=body))

    target, limits = Target(None, "http://x", "m", "", engine="openai"), Limits(events=100)
    with DeploymentClient(target, transport=stream(1_000), limits=limits) as c:
        assert c.complete({"prompt": "hi", "stream": True, "max_tokens": 1_000}).done
    with (
        DeploymentClient(target, transport=stream(1_000), limits=limits) as c,
        pytest.raises(LimitExceeded, match="264 events"),
    ):
        c.complete({"prompt": "hi", "stream": True, "max_tokens": 100})
