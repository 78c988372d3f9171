"""The reference deployment's CoreWeave dialect: the v1alpha1 hot-load control plane over the engine
core (enums by name or number, Connect errors, one hot-load at a time, state and replicas per
hot-load), and the gateway's completions (vLLM's shapes, `nvext.cache_salt`)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from pytest_rlrollout.remote.polling import wait_until
from pytest_rlrollout.snapshot import build, tiny_moe

BASE = tiny_moe.BASE_IDENTITY
HOT_LOADS = "/v1alpha1/inference/hotLoads"


@pytest.fixture
def cw(start, bucket):
    dep = start(engine="coreweave", load_delay=0.05)
    for i in (1, 2):
        build.derive(bucket / BASE, bucket / f"step-{i}", build.perturbed(bucket / BASE, seed=i))
    with httpx.Client(base_url=dep.base_url, headers={"Authorization": f"Bearer {dep.api_key}"}, timeout=30) as http:
        yield dep, http


def create(cw, **body):
    dep, http = cw
    return http.post(HOT_LOADS, json={"deploymentId": dep.settings.deployment_id, **body})


def finished(http, hot_load_id: str) -> dict:
    def state():
        doc = http.get(f"{HOT_LOADS}/{hot_load_id}").json()["hotLoad"]
        return doc if doc["status"]["state"] != "HOT_LOAD_STATE_IN_PROGRESS" else None

    return wait_until(state, timeout=20, interval=0.01, what=f"hot-load {hot_load_id} to finish")


def test_a_full_hot_load_by_number_completes_on_every_replica(cw):
    dep, http = cw
    chosen = str(uuid.uuid4())
    r = create(cw, identity="step-1", type=1, hotLoadId=chosen, promptCachePolicy=1)
    assert r.status_code == 200, r.text
    spec = r.json()["hotLoad"]["spec"]
    assert spec == {
        "id": chosen,
        "deploymentId": dep.settings.deployment_id,
        "identity": "step-1",
        "type": "SNAPSHOT_TYPE_FULL",
        "promptCachePolicy": "PROMPT_CACHE_POLICY_RESET_ALL",
    }
    assert finished(http, chosen)["status"]["state"] == "HOT_LOAD_STATE_COMPLETED"
    replicas = http.get(f"{HOT_LOADS}/{chosen}/replicas").json()["replicas"]
    assert [(x["state"], x["currentSnapshotIdentity"]) for x in replicas] == [("READY", "step-1")] * 2
    listed = http.get(HOT_LOADS, params={"parentDeploymentId": dep.settings.deployment_id}).json()["hotLoads"]
    assert [h["spec"]["id"] for h in listed] == [chosen]


def test_the_prompt_cache_is_preserved_unless_asked_and_a_hot_load_id_is_used_once(cw):
    _, http = cw
    r = create(cw, identity="step-1", type="SNAPSHOT_TYPE_FULL")
    assert r.json()["hotLoad"]["spec"]["promptCachePolicy"] == "PROMPT_CACHE_POLICY_PRESERVE"  # CoreWeave's default
    first = r.json()["hotLoad"]["spec"]["id"]
    finished(http, first)
    again = create(cw, identity="step-2", type="SNAPSHOT_TYPE_FULL", hotLoadId=first)
    assert again.status_code == 409 and again.json()["code"] == "already_exists", again.text


def test_one_hot_load_at_a_time(start, bucket):
    dep = start(engine="coreweave", load_delay=1.0)
    build.derive(bucket / BASE, bucket / "step-1", build.perturbed(bucket / BASE, seed=1))
    build.derive(bucket / BASE, bucket / "step-2", build.perturbed(bucket / BASE, seed=2))
    with httpx.Client(base_url=dep.base_url, headers={"Authorization": f"Bearer {dep.api_key}"}, timeout=30) as http:
        body = {"deploymentId": dep.settings.deployment_id, "type": "SNAPSHOT_TYPE_FULL"}
        assert http.post(HOT_LOADS, json={**body, "identity": "step-1"}).status_code == 200
        second = http.post(HOT_LOADS, json={**body, "identity": "step-2"})
    assert second.status_code == 400, second.text
    assert second.json()["code"] == "failed_precondition" and "already in progress" in second.json()["message"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"identity": "step-1", "type": 0}, "invalid_argument"),  # the zero value is refused
        ({"identity": "step-1", "type": "FULL"}, "invalid_argument"),  # names carry their prefix
        ({"identity": "step-1", "type": 2}, "invalid_argument"),  # incremental without its metadata
        (
            {"identity": "step-1", "type": 1, "incrementalSnapshotMetadata": {"previousSnapshotIdentity": BASE}},
            "invalid_argument",
        ),
        ({"identity": "step-1", "type": 1, "hotLoadId": "not-a-uuid"}, "invalid_argument"),
        ({"identity": "step-1", "type": 1, "promptCachePolicy": 7}, "invalid_argument"),
        ({"identity": "step-1", "type": 1, "surprise": True}, "invalid_argument"),
        ({"identity": "a/b", "type": 1}, "invalid_argument"),  # SNAP-ID-1
        ({"identity": "missing", "type": 1}, "invalid_argument"),
    ],
)
def test_refusals_are_connect_errors_and_load_nothing(cw, body, code):
    _, http = cw
    r = create(cw, **body)
    assert r.status_code == 400 and r.json()["code"] == code and r.json()["details"] == [], r.text
    assert http.get(HOT_LOADS).json()["hotLoads"] == []


def test_another_deployment_unknown_routes_and_cancel(cw):
    _, http = cw
    r = http.post(HOT_LOADS, json={"deploymentId": str(uuid.uuid4()), "identity": "step-1", "type": 1})
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert http.get(f"{HOT_LOADS}/{uuid.uuid4()}").json()["code"] == "not_found"
    assert http.post(f"{HOT_LOADS}/{uuid.uuid4()}:cancel").status_code == 501


def test_the_control_plane_and_the_gateway_ask_for_the_key(cw):
    dep, _ = cw
    for method, path in (("GET", HOT_LOADS), ("POST", HOT_LOADS), ("POST", "/v1/completions")):
        r = httpx.request(method, dep.base_url + path, json={}, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401, (path, r.text)


def test_a_failed_load_fails_the_hot_load_and_names_why(start, bucket):
    # the shard is cut right after the signal is answered, each replica reads it `load_delay` later:
    # 0.3 s was once too short on a loaded machine (a replica read it whole and served step-1)
    dep = start(engine="coreweave", load_delay=2.0)
    build.derive(bucket / BASE, bucket / "step-1", build.perturbed(bucket / BASE, seed=1))
    with httpx.Client(base_url=dep.base_url, headers={"Authorization": f"Bearer {dep.api_key}"}, timeout=30) as http:
        r = http.post(HOT_LOADS, json={"deploymentId": dep.settings.deployment_id, "identity": "step-1", "type": 1})
        (bucket / "step-1" / "model-00002-of-00005.safetensors").write_bytes(b"")  # gone before it is read
        hot_load = finished(http, r.json()["hotLoad"]["spec"]["id"])

        def every_replica_done():  # the hot-load fails with the first replica's error; the others end after
            got = http.get(f"{HOT_LOADS}/{hot_load['spec']['id']}/replicas").json()["replicas"]
            return got if all(x["state"] in ("READY", "ERROR") for x in got) else None

        replicas = wait_until(every_replica_done, timeout=20, interval=0.01, what="every replica's load to end")
    assert hot_load["status"]["state"] == "HOT_LOAD_STATE_FAILED"
    assert {x["state"] for x in replicas} == {"ERROR"} and all(x["errorReason"] for x in replicas)
    assert {x["currentSnapshotIdentity"] for x in replicas} == {BASE}  # the previous weights keep serving


def test_the_gateway_isolates_by_nvext_cache_salt(cw):
    _, http = cw
    prompt = list(range(10, 300))
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}

    def cached(salt):
        # one session: one replica (two replicas keep two caches)
        r = http.post(
            "/v1/completions", json={**body, "nvext": {"cache_salt": salt}}, headers={"x-multi-turn-session-id": "s"}
        )
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("a") == 0 and cached("a") > 0
    assert cached("b") == 0  # another salt shares nothing
