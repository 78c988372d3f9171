"""A fleet of SGLang engines with no gateway, as slime and miles run theirs: two reference
SGLang-dialect engines on one bucket, the suite given both URLs (rl_fleet_urls). With
`--rl-engine=auto` it recognises an SGLang fleet, drives each engine with SGLang's binding (its
loads, pauses, labels and cache flushes fanned out), judges each engine by what it serves, and a
fault on one engine only fails exactly its clause, naming that engine."""

import pytest

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.engines import sglang
from pytest_rlrollout.reference.fleet import reference_fleet
from pytest_rlrollout.reference.settings import SERVED_PACE

from .test_gateway import ONE_ENGINE, ROUTING, judged, one_engine_fails, outcomes

SGLANG = {c.id for c in catalogue() if c.binds(sglang.NAME)}


@pytest.fixture
def bucket(tmp_path):
    return tmp_path / "bucket"


def test_a_list_of_sglang_engine_urls_is_recognised_and_judged_on_every_engine(pytester, bucket):
    """Every clause the SGLang binding judges passes on both engines, but those needing what the
    dialect does not offer by default (routed experts) or a key nobody set."""
    with reference_fleet(bucket, 2, engine=sglang.NAME, gateway=False, **SERVED_PACE) as fleet:
        doc = judged(pytester, fleet, bucket)
    assert doc["engine"]["name"] == "sglang-fleet"
    assert doc["engine"]["decided"].startswith("auto: rl_fleet_urls names 2 engines"), doc["engine"]
    assert doc["engine"]["version"] == f"2 engine(s): sglang {sglang.DIALECT_VERSION}"
    got = outcomes(doc)
    unjudged = {k: v for k, v in got.items() if k in SGLANG and v != "pass"}
    assert unjudged == dict.fromkeys((ROUTING | {"HL-AUTH-1"}) & SGLANG, "unsupported"), unjudged
    assert doc["clauses"]["HL-GET-2"]["evidence"].startswith("observed: 2 replicas ready"), doc["clauses"]["HL-GET-2"]


@pytest.mark.parametrize("switch", ONE_ENGINE)
def test_a_fault_on_one_sglang_engine_fails_its_clause_naming_that_engine(pytester, bucket, switch):
    one_engine_fails(pytester, bucket, sglang.NAME, switch, gateway=False)
