import contextlib
import json
import shutil
import time
from pathlib import Path

import httpx
import pytest

from pytest_rlrollout import refmodel
from pytest_rlrollout.deployment import reference_deployment


@pytest.fixture(scope="session")
def base_snapshot(tmp_path_factory) -> Path:
    return refmodel.make_base(tmp_path_factory.mktemp("base") / refmodel.BASE_IDENTITY)


@pytest.fixture
def bucket(tmp_path, base_snapshot) -> Path:
    b = tmp_path / "bucket"
    b.mkdir()
    shutil.copytree(base_snapshot, b / refmodel.BASE_IDENTITY)
    return b


@pytest.fixture
def start(bucket):
    """start(**settings) -> a running reference deployment, stopped at teardown."""
    with contextlib.ExitStack() as stack:
        yield lambda **settings: stack.enter_context(reference_deployment(bucket, **settings))


@pytest.fixture
def dep(start):
    return start()


class Client:
    """httpx against a running deployment with the right headers."""

    def __init__(self, dep):
        self.dep = dep
        self.http = httpx.Client(base_url=dep.base_url, timeout=30, headers={"Authorization": f"Bearer {dep.api_key}"})

    def hot_load(self, body=None, method="POST", headers=None):
        h = self.dep.hot_load_headers() | (headers or {})
        if method == "GET":
            return self.http.get("/hot_load/v1/models/hot_load", headers=h)
        return self.http.post("/hot_load/v1/models/hot_load", json=body, headers=h)

    def status(self):
        r = self.hot_load(method="GET")
        assert r.status_code == 200
        return r.json()

    def wait_for(self, identity, timeout=20.0, lora=False):
        """Poll the status (with a deadline) until every replica serves `identity`."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            replicas = self.status()["replicas"]
            if lora:
                ok = all(
                    any(a["identity"] == identity and a["status"] == "loaded" for a in r["loaded_adapters"])
                    for r in replicas
                )
            else:
                ok = all(r["readiness"] and r["current_snapshot_identity"] == identity for r in replicas)
            if ok:
                return replicas
            if any(
                r["loading_state"]["stage"] == "error" and r["loading_state"]["target_snapshot_identity"] == identity
                for r in replicas
            ):
                raise AssertionError(f"load of {identity} failed: {replicas}")
            time.sleep(0.005)
        raise AssertionError(f"{identity} not served within {timeout} s: {self.status()}")

    def complete(self, prompt, stream=False, headers=None, **body):
        payload = {"model": self.dep.name, "prompt": prompt, "temperature": 0, **body, "stream": stream}
        if not stream:
            return self.http.post("/inference/v1/completions", json=payload, headers=headers or {})
        return self.http.stream("POST", "/inference/v1/completions", json=payload, headers=headers or {})


@pytest.fixture
def client(dep):
    c = Client(dep)
    yield c
    c.http.close()


def poll(predicate, timeout=10.0):
    """Call `predicate` until it returns something truthy (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
    raise AssertionError("condition not reached before the deadline")


def chunks(lines):
    """The JSON chunks of SSE `data:` lines ([DONE] left out)."""
    return [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]


def versions(chs):
    """The policy version of every chunk (the whole model name where the suffix is missing)."""
    return [ch["model"].rsplit("@", 1)[-1] for ch in chs]
