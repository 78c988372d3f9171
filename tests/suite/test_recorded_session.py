"""A recorded session's meta is checked against schemas/recorded-session.schema.json: the shipped
recordings satisfy it, and what breaks it is named by field (the replays of hostile recordings,
tests/hostile/test_replay.py, hold the run's side: one usage error)."""

import json

import pytest

from pytest_rlrollout.contract.capabilities import CAPABILITIES
from pytest_rlrollout.engines import ENGINES
from pytest_rlrollout.suite.file_schemas import problems, schema
from pytest_rlrollout.suite.recorded_session import SHIPPED_CASSETTES, meta_problems, usable_run_id

SHIPPED = sorted(p.name for p in SHIPPED_CASSETTES.iterdir() if (p / "_session.json").is_file())


def shipped_meta(name):
    return json.loads((SHIPPED_CASSETTES / name / "_session.json").read_text())["meta"]


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_recordings_satisfy_the_schema(name):
    meta = shipped_meta(name)
    assert problems("recorded-session", meta) == {}
    assert meta_problems(meta) == []


def test_the_schema_takes_its_names_from_the_registries():
    s = schema("recorded-session")
    assert s["properties"]["engine"]["enum"] == [*ENGINES, None]
    discovery = s["$defs"]["discovery"]["properties"]
    assert discovery["engine"]["enum"] == list(ENGINES)
    assert discovery["capabilities"]["propertyNames"]["enum"] == list(CAPABILITIES)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"run_id": "abc\n"}, "meta.run_id is not allowed: 'abc\\n' (run_id: not 1 to 64 letters"),
        ({"deployment": "accounts/a/deployments/d/x"}, "meta.deployment is not allowed"),
        ({"model": "a\x00b"}, "(model: not a non-empty string with no control character)"),
        ({"engine": "nope"}, "meta.engine is not allowed: 'nope' (engine: 'nope' is not one of"),
        ({"served_dtype": "float8"}, "meta.served_dtype is not allowed"),
        ({"discovery": {"capabilities": 1}}, "(discovery.capabilities: 1 is not of type 'object')"),
        ({"deployment": None}, "meta.deployment is missing: a Fireworks recording names its deployment"),
    ],
)
def test_what_breaks_the_meta_is_named_by_field(changes, said):
    wrong = meta_problems({**shipped_meta("reference"), **changes})
    assert len(wrong) == 1 and said in wrong[0], wrong


def test_a_start_fingerprint_too_big_is_said_without_quoting_it():
    meta = shipped_meta("reference")
    start = {"identity": "base", "logprobs": [[0.0] * 5000]}
    (wrong,) = meta_problems({**meta, "discovery": {**meta["discovery"], "start": start}})
    assert wrong.endswith("(discovery.start.logprobs[0]: more than 4096 items)"), wrong


def test_missing_fields_and_a_meta_that_is_no_object():
    assert meta_problems([1]) == ["its meta is not an object"]
    assert meta_problems({"deployment": None}) == ["meta: run_id, model missing"]


@pytest.mark.parametrize(
    ("value", "usable"),
    [("44fb11f1", True), ("a-b_C", True), ("../x", False), ("", False), ("a" * 65, False), (5, False), ("é", False)],
)
def test_a_run_id_names_snapshots_and_files(value, usable):
    assert usable_run_id(value) is usable
