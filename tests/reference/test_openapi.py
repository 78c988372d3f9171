"""schemathesis against the deployment's own OpenAPI document: no request it generates gets a 5xx,
whether it fits the schema (positive), breaks it (negative) or sits on its edges (coverage)."""

import collections
import shutil
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.config import GenerationConfig  # noqa: E402

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
    response = case.call(base_url=server.base_url, headers=_headers(server, case))
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])


def _headers(server, case) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    if case.path.startswith("/hot_load"):
        headers |= {"fireworks-deployment": server.name, "fireworks-model": server.model}
    return headers


def _served_model(server, case) -> None:
    """A generated model name is one the deployment does not serve (a 404 before any other check):
    a case whose model is a plausible string names the deployment instead, so what else it holds
    reaches the parameter checks, the tokenizer and the decoder."""
    body = case.body if isinstance(case.body, dict) else None
    if body is not None and case.path.endswith("completions") and isinstance(body.get("model"), str):
        body["model"] = server.name


def _short_default(case, defaulted: set[str]) -> None:
    """A completion body without max_tokens decodes the server's default (128 tokens for chat,
    0.4 s each): the first such case of each path keeps it, so the default is exercised; the
    others, each about another field's edge, decode 2 tokens, which still samples with their
    parameters (a 5xx from decoding would show on the first token). 11 s of CPU, now ~2 s."""
    body = case.body if isinstance(case.body, dict) else None
    if body is None or not case.path.endswith("completions") or "max_tokens" in body:
        return
    if case.path in defaulted:
        body["max_tokens"] = 2
    defaulted.add(case.path)


# negative data: bodies, headers and parameters that break the schema (wrong types, values out
# of range, missing fields); every one must be a 4xx
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=schema.as_strategy(GenerationMode.NEGATIVE))
def test_no_server_errors_on_negative_data(server, case):
    _served_model(server, case)
    case.call_and_validate(base_url=server.base_url, headers=_headers(server, case), checks=[not_a_server_error])


def test_no_server_errors_in_the_coverage_phase(server):
    """schemathesis's coverage phase: the schema's edge cases, both sides of every boundary
    (minimum, maximum, maxLength, maxItems, const, enum, pattern), missing and wrong-typed
    fields, unexpected methods; positive and negative, deterministically enumerated."""
    modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    statuses: collections.Counter[int] = collections.Counter()
    defaulted: set[str] = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        for case in schema.iter_coverage_cases(operation, generation_modes=modes, generation_config=GenerationConfig()):
            _served_model(server, case)
            _short_default(case, defaulted)
            response = case.call_and_validate(
                base_url=server.base_url, headers=_headers(server, case), checks=[not_a_server_error]
            )
            statuses[response.status_code] += 1
    # the phase did reach past the front door: requests were served, and refused for what they held
    assert statuses[200] > 0 and statuses[400] > 100, statuses
