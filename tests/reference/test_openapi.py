"""schemathesis against the deployment's own OpenAPI document: no request it generates gets a 5xx."""

import shutil
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from pytest_rlrollout.reference import reference_deployment  # noqa: E402
from pytest_rlrollout.reference.openapi import document  # noqa: E402
from pytest_rlrollout.reference.settings import Settings  # noqa: E402
from pytest_rlrollout.snapshot import tiny_moe  # noqa: E402

DEFAULTS = Settings(bucket=Path("."))  # names only: the document needs no running server
schema = schemathesis.openapi.from_dict(document(DEFAULTS.deployment, DEFAULTS.model))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    bucket = tmp_path_factory.mktemp("openapi") / "bucket"
    base = tiny_moe.make_base(tmp_path_factory.mktemp("base") / tiny_moe.BASE_IDENTITY)
    shutil.copytree(base, bucket / tiny_moe.BASE_IDENTITY)
    with reference_deployment(bucket) as dep:
        yield dep


def test_the_document_is_served(server):
    import httpx

    served = httpx.get(server.base_url + "/openapi.json").json()
    assert served == document(server.name, server.model)
    assert set(served["paths"]) >= {"/hot_load/v1/models/hot_load", "/inference/v1/completions"}


# the schema's own strategy (hypothesis only): schemathesis's pytest plugin is not loaded
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=schema.as_strategy())
def test_no_server_errors(server, case):
    headers = {"Authorization": f"Bearer {server.api_key}"}
    if case.path.startswith("/hot_load"):
        headers |= {"fireworks-deployment": server.name, "fireworks-model": server.model}
    response = case.call(base_url=server.base_url, headers=headers)
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
