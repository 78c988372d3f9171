"""Hostile and random requests never get a 5xx or a dropped connection (INF-ERR-1, HL-*)."""

import json
import shutil

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.remote.polling import wait_until
from pytest_rlrollout.snapshot import tiny_moe

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))

json_leaf = hs.none() | hs.booleans() | hs.integers(-(2**70), 2**70) | hs.floats(allow_nan=True) | hs.text(max_size=20)
json_value = hs.recursive(
    json_leaf, lambda c: hs.lists(c, max_size=4) | hs.dictionaries(hs.text(max_size=8), c, max_size=4), max_leaves=12
)
FIELDS = [
    "prompt",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "seed",
    "stream",
    "logprobs",
    "echo",
    "echo_last",
    "raw_output",
    "return_token_ids",
    "perf_metrics_in_response",
    "include_routing_matrix",
    "stop",
    "prompt_cache_isolation_key",
    "prompt_cache_max_len",
    "user",
]
plausible = {
    "prompt": hs.lists(hs.integers(-5, 600), max_size=40) | hs.text(max_size=60),
    "messages": hs.lists(
        hs.fixed_dictionaries(
            {"role": hs.sampled_from(["user", "system", 3]), "content": hs.text(max_size=20) | hs.integers()}
        ),
        max_size=3,
    ),
    "max_tokens": hs.integers(-3, 3000),
    "temperature": hs.floats(-1, 3) | hs.just(float("nan")),
    "echo_last": hs.integers(-2, 100),
    "stop": hs.lists(hs.text(max_size=3), max_size=3) | hs.text(max_size=3),
}


@hs.composite
def bodies(draw, model):
    body = {}
    if draw(hs.booleans()):
        body["model"] = draw(hs.sampled_from([model, "accounts/x/models/y", 7]))
    for key in draw(hs.lists(hs.sampled_from(FIELDS), max_size=8, unique=True)):
        body[key] = draw(plausible[key] if key in plausible and draw(hs.booleans()) else json_value)
    return body


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    bucket = tmp_path_factory.mktemp("robust") / "bucket"
    base = tiny_moe.make_base(tmp_path_factory.mktemp("b") / tiny_moe.BASE_IDENTITY)
    shutil.copytree(base, bucket / tiny_moe.BASE_IDENTITY)
    shutil.copytree(base, bucket / "copy-of-base")
    with (
        reference_deployment(bucket, token_delay=0.0) as dep,
        httpx.Client(base_url=dep.base_url, timeout=30, headers={"Authorization": f"Bearer {dep.api_key}"}) as http,
    ):
        yield dep, http


def raw_json(body) -> dict:
    """Request kwargs carrying `body` as JSON text, NaN and Infinity included (httpx's json= refuses them)."""
    return {"content": json.dumps(body).encode(), "headers": {"Content-Type": "application/json"}}


def check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert isinstance(r.json()["error"]["message"], str)


@SETTINGS
@given(data=hs.data())
def test_random_completion_requests(server, data):
    dep, http = server
    body = data.draw(bodies(dep.name))
    path = data.draw(
        hs.sampled_from(["/inference/v1/completions", "/inference/v1/chat/completions", "/v1/completions"])
    )
    if body.get("stream") is True:
        with http.stream("POST", path, **raw_json(body)) as r:
            text = "".join(r.iter_text())
        assert r.status_code < 500, text[:300]
        if r.status_code == 200:
            assert text.rstrip().endswith("data: [DONE]")
    else:
        check(http.post(path, **raw_json(body)))


@SETTINGS
@given(body=json_value, with_identity=hs.sampled_from([None, "copy-of-base", "missing", "../x", "a/b", ""]))
def test_random_hot_load_bodies(server, body, with_identity):
    dep, http = server
    if isinstance(body, dict) and with_identity is not None:
        body["identity"] = with_identity
    kwargs = raw_json(body)
    kwargs["headers"] |= dep.hot_load_headers()
    r = http.post("/hot_load/v1/models/hot_load", **kwargs)
    check(r)
    if r.status_code == 200:  # a valid signal of a valid snapshot: let it finish before the next example
        wait_until(lambda: _at_rest(dep), timeout=20, interval=0.005, what="the deployment at rest")


def _at_rest(dep) -> bool:
    return dep.deployment.loading is None and not any(r._swap or r.swapping for r in dep.deployment.replicas)


@SETTINGS
@given(
    raw=hs.binary(max_size=200),
    path=hs.sampled_from(
        [
            "/inference/v1/completions",
            "/hot_load/v1/models/hot_load",
            "/hot_load/v1/models/hot_load/hint",
            "/v1/chat/completions",
        ]
    ),
)
def test_random_bytes(server, raw, path):
    dep, http = server
    check(http.post(path, content=raw, headers=dep.hot_load_headers() if "hot_load" in path else {}))


@pytest.mark.parametrize("path", ["/", "/v2/completions", "/inference/v1/models", "/hot_load/v1/models/hot_load/x"])
@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE"])
def test_unknown_paths_and_methods(server, path, method):
    _, http = server
    check(http.request(method, path))
