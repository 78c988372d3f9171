"""The hot-load wire schemas accept what the official SDK sends and tag what they reject."""

import pytest

from pytest_rlrollout.contract import schemas


def clauses(name, doc):
    return [(p.clause, p.message) for p in schemas.problems(name, doc)]


@pytest.mark.parametrize(
    "body",
    [
        {"identity": "step-1"},
        {"identity": "step-1", "reset_prompt_cache": True},  # what the SDK sends
        {"identity": "step-1", "reset_prompt_cache": "new_session"},
        {
            "identity": "step-2",
            "reset_prompt_cache": "none",
            "incremental_snapshot_metadata": {
                "previous_snapshot_identity": "step-1",
                "compression_format": "arc_v2",
                "checksum_format": "alder32",
            },
        },
        {"identity": "step-3", "validation": {"extra_fields_ignore": ["rope_scaling"]}},
    ],
)
def test_sdk_bodies_are_accepted(body):
    assert clauses("hot-load-request", body) == []


@pytest.mark.parametrize(
    ("body", "clause", "words"),
    [
        (
            {"identity": "x", "reset_prompt_cache": True, "force": 1},
            "HL-POST-2",
            "Extra inputs are not permitted, field: 'force'",
        ),
        ({"identity": "x", "reset_prompt_cache": "sometimes"}, "HL-POST-3", "reset_prompt_cache"),
        ({"identity": "a/b"}, "SNAP-ID-1", "one path segment"),
        ({"identity": ".."}, "SNAP-ID-1", "one path segment"),
        (
            {
                "identity": "x",
                "incremental_snapshot_metadata": {
                    "previous_snapshot_identity": "p",
                    "compression_format": 2,
                    "checksum_format": "alder32",
                },
            },
            "SNAP-INC-4",
            "compression_format",
        ),
        ({"identity": "x", "validation": {"extra_fields_ignore": "rope"}}, "HL-CONFIG-2", "extra_fields_ignore"),
        ({"reset_prompt_cache": "all"}, "HL-POST-2", "'identity' is a required property"),
    ],
)
def test_rejections_carry_their_clause(body, clause, words):
    found = clauses("hot-load-request", body)
    assert any(c == clause and words in m for c, m in found), found


def test_status_schema():
    ok = {
        "replicas": [
            {
                "readiness": True,
                "current_snapshot_identity": "s1",
                "loading_state": {"stage": "done", "target_snapshot_identity": "s1"},
                "loaded_adapters": [{"identity": "lora-1", "status": "loaded"}],
            }
        ]
    }
    assert clauses("hot-load-status", ok) == []
    assert clauses("hot-load-status", {"replicas": [{"readiness": False, "current_snapshot_identity": None}]}) == []
    assert [c for c, _ in clauses("hot-load-status", {"status": "ok"})] == ["HL-GET-1"]
    null_state = {"replicas": [{"readiness": True, "current_snapshot_identity": "s", "loading_state": None}]}
    assert [c for c, _ in clauses("hot-load-status", null_state)] == ["HL-GET-1a"]
    null_target = {
        "replicas": [
            {
                "readiness": True,
                "current_snapshot_identity": "s",
                "loading_state": {"stage": "loading", "target_snapshot_identity": None},
            }
        ]
    }
    assert [c for c, _ in clauses("hot-load-status", null_target)] == ["HL-GET-1a"]


def test_a_schema_constraint_without_a_clause_is_a_bug(monkeypatch):
    untagged = {"type": "object", "required": ["x"]}
    monkeypatch.setattr(schemas, "schema", lambda name: untagged)
    schemas.check.cache_clear()
    try:
        with pytest.raises(ValueError, match="no x-clause"):
            list(schemas.problems("anything", {}))
    finally:
        schemas.check.cache_clear()


@pytest.mark.parametrize(
    ("name", "doc"),
    [
        ("hot-load-request", {"identity": "x", "reset_prompt_cache": 10**30}),  # beyond 64 bits
        ("hot-load-request", {"identity": "a/b"}),
        ("weight-spec", {"tensor_map": {"w": {"shape": [1, -1], "dtype": "F32"}}}),
        ("safetensors-index", {"weight_map": {"w": "../x.safetensors"}}),
        ("safetensors-index", {"weight_map": {"w": "model-1.safetensors"}}),
    ],
)
def test_the_fast_and_the_explaining_validator_agree(name, doc):
    fast = schemas.is_valid(name, doc)
    explained = list(schemas.check(name).errors(doc))
    assert fast == (not explained), explained
