"""schemathesis against the deployment's own OpenAPI document: no request it generates gets a 5xx."""

import shutil
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402

from pytest_rlrollout import refmodel  # noqa: E402
from pytest_rlrollout.deployment import reference_deployment  # noqa: E402
from pytest_rlrollout.deployment.openapi import document  # noqa: E402
from pytest_rlrollout.deployment.settings import Settings  # noqa: E402

DEFAULTS = Settings(bucket=Path("."))  # names only: the document needs no running server
schema = schemathesis.openapi.from_dict(document(DEFAULTS.deployment, DEFAULTS.model))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    bucket = tmp_path_factory.mktemp("openapi") / "bucket"
    base = refmodel.make_base(tmp_path_factory.mktemp("base") / refmodel.BASE_IDENTITY)
    shutil.copytree(base, bucket / refmodel.BASE_IDENTITY)
    with reference_deployment(bucket) as dep:
        yield dep


def test_the_document_is_served(server):
    import httpx

    served = httpx.get(server.base_url + "/openapi.json").json()
    assert served == document(server.name, server.model)
    assert set(served["paths"]) >= {"/hot_load/v1/models/hot_load", "/inference/v1/completions"}


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case, server):
    headers = {"Authorization": f"Bearer {server.api_key}"}
    if case.path.startswith("/hot_load"):
        headers |= {"fireworks-deployment": server.name, "fireworks-model": server.model}
    response = case.call(base_url=server.base_url, headers=headers)
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
