"""The hot-load API of the reference deployment (HL clauses and hot-load-time SNAP)."""

import json

import pytest

from pytest_rlrollout.contract import catalogue, schemas
from pytest_rlrollout.snapshot import broken, build, tiny_moe

from ..support import Client

BASE = tiny_moe.BASE_IDENTITY


def step(bucket, name, seed=1, parent=BASE):
    return build.derive(bucket / parent, bucket / name, build.perturbed(bucket / parent, seed=seed))


def test_status_shape_follows_the_schema(client):
    status = client.status()
    assert list(schemas.problems("hot-load-status", status)) == []
    assert len(status["replicas"]) == 2
    assert all(r["current_snapshot_identity"] == BASE and r["readiness"] for r in status["replicas"])


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": ""}, 401),
        ({"fireworks-deployment": "accounts/x/deployments/y"}, 404),
        ({"fireworks-model": "accounts/x/models/y"}, 400),
    ],
)
def test_auth_and_routing_headers(client, bucket, headers, status):
    step(bucket, "step-1")
    r = client.hot_load({"identity": "step-1"}, headers=headers)
    assert r.status_code == status and "message" in r.json()["error"]
    assert all(x["current_snapshot_identity"] == BASE for x in client.status()["replicas"])
    assert client.dep.deployment.ledger == []


def test_full_snapshot_loads_on_every_replica(client, bucket):
    step(bucket, "step-1")
    r = client.hot_load({"identity": "step-1"})
    assert r.status_code == 200 and isinstance(r.json(), dict)
    client.wait_for("step-1")
    [entry] = client.http.get("/v1/accounts/rlrollout/deployments/reference/ledger").json()["entries"]
    assert entry["identity"] == "step-1" and entry["kind"] == "full" and len(entry["replicas"]) == 2


def test_unknown_field_uses_the_sdk_wording(client, bucket):
    step(bucket, "step-1")
    r = client.hot_load({"identity": "step-1", "reset_prompt_cache": True, "priority": "high"})
    assert r.status_code == 400
    assert "Extra inputs are not permitted, field: 'priority'" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("value", "ok"),
    [("all", True), ("new_session", True), ("none", True), (True, True), (False, True), ("some", False), (3, False)],
)
def test_reset_prompt_cache_values(client, bucket, value, ok):
    step(bucket, "step-1")
    r = client.hot_load({"identity": "step-1", "reset_prompt_cache": value})
    assert (r.status_code == 200) == ok, r.text
    if not ok:
        assert r.status_code == 400


@pytest.mark.parametrize("identity", ["a/b", "..", "", "x\x01y"])
def test_bad_identities_get_4xx(client, identity):
    r = client.hot_load({"identity": identity})
    assert 400 <= r.status_code < 500 and "SNAP-ID-1" in r.json()["error"]["clauses"]


SNAP_AT_LOAD = [c.id for c in catalogue().area("SNAP") if c.level == "MUST" and c.id not in ("SNAP-ID-1",)]


@pytest.mark.parametrize("clause", SNAP_AT_LOAD)
def test_broken_snapshots_are_refused_and_the_previous_keeps_serving(client, bucket, tmp_path, clause):
    """Every SNAP MUST clause's broken variant, uploaded to the bucket and signalled."""
    cases = broken.ReferenceCases(tmp_path / "ref")
    case = broken.broken_case(clause, cases, tmp_path / "broken")
    identity = f"broken-{clause.lower()}"
    if case.parent is not None:  # a diff of the base: the deployment's base is the same bytes
        assert (cases.base / "model.safetensors.index.json").read_bytes() == (
            bucket / BASE / "model.safetensors.index.json"
        ).read_bytes()
    if case.snapshot.name != identity:
        import shutil

        shutil.copytree(case.snapshot, bucket / identity, symlinks=True)
    body = dict(case.signal or {})
    body["identity"] = identity if case.signal is None or clause != "SNAP-ID-1" else body["identity"]
    if case.ledger_reset:
        assert client.http.delete("/v1/accounts/rlrollout/deployments/reference/ledger").status_code == 200
    r = client.hot_load(body)
    assert 400 <= r.status_code < 500, r.text
    assert clause in r.json()["error"]["message"]
    assert all(x["current_snapshot_identity"] == BASE and x["readiness"] for x in client.status()["replicas"])


def test_incremental_signal_applies_arc2_and_chains(client, bucket, tmp_path):
    s1 = step(bucket, "step-1")
    client.hot_load({"identity": "step-1"})
    client.wait_for("step-1")
    s2 = build.derive(s1, tmp_path / "step-2-full", build.perturbed(s1, seed=2))
    signal = build.make_incremental(s1, s2, bucket / "step-2")
    assert client.hot_load(signal).status_code == 200
    client.wait_for("step-2")
    wrong = build.make_incremental(s1, s2, bucket / "step-3")  # previous is step-1, but step-2 is served
    r = client.hot_load(wrong)
    assert r.status_code == 400 and "SNAP-INC-5" in r.json()["error"]["message"]


def test_adler32_spelling_is_accepted_too(client, bucket, tmp_path):
    s1 = step(bucket, "step-1")
    signal = build.make_incremental(bucket / BASE, s1, bucket / "step-1-diff")
    signal["incremental_snapshot_metadata"]["checksum_format"] = "adler32"
    assert client.hot_load(signal).status_code == 200
    client.wait_for("step-1-diff")


def test_identity_reuse_and_concurrent_load_get_409(start, bucket):
    c = Client(start(load_delay=0.3))
    step(bucket, "step-1")
    step(bucket, "step-2", seed=2)
    assert c.hot_load({"identity": "step-1"}).status_code == 200
    busy = c.hot_load({"identity": "step-2"})
    assert busy.status_code == 409 and "still loading" in busy.json()["error"]["message"]
    c.wait_for("step-1")
    again = c.hot_load({"identity": "step-1"})
    assert again.status_code == 409 and "already in the ledger" in again.json()["error"]["message"]


def test_config_mismatch_message_and_extra_fields_ignore(client, bucket):
    cfg = json.loads((bucket / BASE / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    build.derive(bucket / BASE, bucket / "eps", {}, config=cfg)
    r = client.hot_load({"identity": "eps"})
    assert r.status_code == 400 and "Config value mismatch for rms_norm_eps" in r.json()["error"]["message"]
    assert (
        client.hot_load({"identity": "eps", "validation": {"extra_fields_ignore": ["rms_norm_eps"]}}).status_code == 200
    )
    client.wait_for("eps")


def test_ledger_reset_forces_a_full_snapshot(client, bucket):
    s1 = step(bucket, "step-1")
    client.hot_load({"identity": "step-1"})
    client.wait_for("step-1")
    r = client.http.delete("/v1/accounts/rlrollout/deployments/reference/ledger")
    assert r.status_code == 200 and r.json() == {"forgotten": 1}
    s2 = step(bucket, "step-2", seed=2, parent="step-1")
    signal = build.make_incremental(s1, s2, bucket / "step-2-diff")
    refused = client.hot_load(signal)
    assert refused.status_code == 400 and "SNAP-INC-7" in refused.json()["error"]["message"]
    assert client.hot_load({"identity": "step-2"}).status_code == 200
    client.wait_for("step-2")


def test_lora_loads_as_an_adapter_and_versions_the_stream(client, bucket):
    build.make_lora(bucket / BASE, bucket / "lora-1", base_model=client.dep.model)
    assert client.hot_load({"identity": "lora-1"}).status_code == 200
    replicas = client.wait_for("lora-1", lora=True)
    assert all(r["current_snapshot_identity"] == BASE for r in replicas)
    r = client.complete([1, 2, 3], max_tokens=2)
    assert r.json()["model"].endswith("@lora-1")


def test_a_failed_load_reports_error_and_keeps_the_previous_snapshot(start, bucket):
    """Valid at POST time, cut short while the replicas download it (HL-GET-3, HL-POST-5)."""
    c = Client(start(load_delay=0.5))
    step(bucket, "step-1")
    assert c.hot_load({"identity": "step-1"}).status_code == 200
    (bucket / "step-1" / "model-00002-of-00005.safetensors").write_bytes(b"")
    replicas = c.replicas_where(
        lambda rs: all(r["loading_state"]["stage"] == "error" for r in rs), what="every replica reporting stage 'error'"
    )
    assert all(r["loading_state"]["target_snapshot_identity"] == "step-1" for r in replicas)
    assert all(r["current_snapshot_identity"] == BASE and r["readiness"] for r in replicas)
    assert c.complete([1, 2, 3], max_tokens=2).json()["model"].endswith(f"@{BASE}")
    assert c.dep.deployment.loading is None  # the next signal is accepted


def test_hint_endpoint(client, bucket):
    step(bucket, "step-1")
    url = "/hot_load/v1/models/hot_load/hint"
    h = client.dep.hot_load_headers()
    ok = client.http.post(url, json={"identity": "step-1", "file": "config.json"}, headers=h)
    assert ok.status_code == 200 and ok.json() == {}
    assert client.http.post(url, json={"identity": "step-1", "file": "nope.bin"}, headers=h).status_code == 404
    assert client.http.post(url, json={"identity": "step-1", "file": "../x"}, headers=h).status_code == 404
    assert all(x["current_snapshot_identity"] == BASE for x in client.status()["replicas"])


def test_control_plane_stub(client):
    accounts = client.http.get("/v1/accounts", params={"pageSize": 2}).json()
    assert accounts["accounts"] == [{"name": "accounts/rlrollout", "displayName": "rlrollout"}]
    d = client.http.get("/v1/accounts/rlrollout/deployments/reference").json()
    assert d["hotLoadTransitionType"] == "ASYNC" and d["state"] == "READY"
    assert client.http.get("/v1/accounts/rlrollout/deployments/other").status_code == 404
