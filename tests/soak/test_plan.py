"""The plan Locust's processes get: it round-trips, refuses what it does not know, holds no key."""

import json

import pytest

from pytest_rlrollout.soak.plan import Plan


def test_a_plan_travels_as_json_without_the_key(tmp_path):
    plan = Plan("fireworks", "http://127.0.0.1:1", "tiny", "accounts/a/deployments/d", think=(0.1, 0.2), t0=5.0)
    path = plan.write(tmp_path / "plan.json")
    assert Plan.from_json(json.loads(path.read_text())) == plan
    assert "key" not in path.read_text()
    fleet = Plan("fleet", "http://127.0.0.1:1", "tiny", members=("http://127.0.0.1:1", "http://127.0.0.1:2"))
    assert Plan.from_json(json.loads(fleet.write(tmp_path / "fleet.json").read_text())) == fleet  # every engine's URL


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"api_key": "x"}, "unknown plan fields ['api_key']"),
        ({"turns": 0}, "a plan needs turns"),
        ({"think": [1.0, 0.5]}, "think time"),
        ({"grace": -1}, "grace -1"),
    ],
)
def test_a_plan_that_cannot_be_run_is_refused(change, said):
    doc = {**Plan("vllm", "http://x", "tiny").to_json(), **change}
    with pytest.raises(ValueError, match=said.replace("[", r"\[").replace("]", r"\]")):
        Plan.from_json(doc)
