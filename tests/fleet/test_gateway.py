"""A fleet judged engine by engine: two reference vLLM-dialect engines on one bucket, either behind
a real `smg launch --enable-rl` (the project's `fleet` extra) with the suite pointed at the
gateway, or with no gateway and the suite given both URLs (rl_fleet_urls), fanning out itself.
With `--rl-engine=auto` it recognises the fleet, judges each engine by what that engine serves,
and a fault on one engine only fails exactly its clause, naming that engine."""

import json

import pytest

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.reference.fleet import reference_fleet
from pytest_rlrollout.reference.settings import SERVED_PACE
from pytest_rlrollout.snapshot import tiny_moe
from pytest_rlrollout.suite.options import CONFORMANCE

# what a swap takes on this pace (every engine loads at once, then pauses at the swap)
SWAP_SECONDS = SERVED_PACE["load_delay"] + SERVED_PACE["swap_delay"]
# the clauses smg 1.13 cannot carry over vLLM 0.32, each for a reason the report gives:
POLICY_VERSIONS = {  # spans come only on /inference/v1/generate, a route the gateway does not route
    "SWAP-ASYNC-2",
    "SWAP-NEW-1",
    "VER-NONSTREAM-1",
    "VER-SPAN-1",
    "CTL-PAUSE-3",
}
ROUTING = {c.id for c in catalogue().area("R3")} | {"NUM-ROUTE-1"}  # routed_experts: a GPU runner's flag


class OnlyClauses:
    """Keeps only the tests of `clauses` (a fault's row need run nothing else)."""

    def __init__(self, clauses: set[str]):
        self.clauses = clauses

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        kept = [i for i in items if {c for m in i.iter_markers("rl_clause") for c in m.args} & self.clauses]
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


FRONTS = ["gateway", "urls"]  # how the suite reaches the fleet: smg in front, or every engine's URL


def judged(pytester, fleet, bucket, *plugins) -> dict:
    """The suite, in this process, against the fleet (its gateway, else its engines): the report."""
    urls = [] if fleet.gateway is not None else ["-o", f"rl_fleet_urls={' '.join(fleet.urls)}"]
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE),
        f"--rl-base-url={fleet.base_url}",
        *urls,
        "--rl-model=tiny",
        "--rl-engine=auto",
        "--rl-allow-hot-load",
        f"--rl-bucket-url={bucket}",
        f"--rl-base-snapshot={bucket / tiny_moe.BASE_IDENTITY}",
        "-o",
        f"rl_swap_seconds={SWAP_SECONDS}",
        "-o",
        "rl_served_dtype=float32",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "--tb=native",
        "--rl-report=r.json",
        plugins=list(plugins),
    )
    report = pytester.path / "r.json"
    assert report.is_file(), "\n".join(result.outlines[-30:])
    return json.loads(report.read_text())


def outcomes(doc: dict) -> dict[str, str]:
    return {cid: c["outcome"] for cid, c in doc["clauses"].items()}


@pytest.fixture
def bucket(tmp_path):
    return tmp_path / "bucket"


def test_a_fleet_behind_the_gateway_is_recognised_and_judged_on_every_engine(pytester, bucket):
    """Green: every clause the vLLM binding judges passes, on each of the two engines where it is
    about replicas, but those the gateway cannot carry, each saying why (no policy-version spans
    through the gateway's routes; routed experts off, as on vLLM's CPU build; no API key set);
    the preflight says which probe recognised the fleet."""
    with reference_fleet(bucket, 2, engine="vllm", **SERVED_PACE) as fleet:
        doc = judged(pytester, fleet, bucket)
    assert doc["engine"]["name"] == "smg"
    assert "GET /v1/rl/workers lists 2 engine(s) (vllm)" in doc["engine"]["decided"]
    assert doc["engine"]["version"] == "2 engine(s): vllm 0.32.0"
    got = outcomes(doc)
    vllm = {c.id for c in catalogue() if c.binds("vllm")}
    unjudged = {k: v for k, v in got.items() if k in vllm and v != "pass"}
    assert unjudged == dict.fromkeys((POLICY_VERSIONS | ROUTING | {"HL-AUTH-1"}) & vllm, "unsupported"), unjudged
    assert got["SESS-1"] == "pass"  # smg binds it: the routing key sticks to one engine
    for cid in POLICY_VERSIONS & vllm:
        assert all(
            "/inference/v1/generate" in t["reason"] or "spans: None" in t["reason"]
            for t in doc["clauses"][cid]["tests"]
            if t["outcome"] == "unsupported"
        ), doc["clauses"][cid]
    # the status the suite judges is each engine's own, one replica per engine
    assert doc["clauses"]["HL-GET-2"]["evidence"].startswith("observed: 2 replicas ready"), doc["clauses"]["HL-GET-2"]


# one engine's fault: (switch, the clause it breaks)
ONE_ENGINE = [
    pytest.param("FID-SWAP-1", id="keeps-its-old-weights"),  # the label moves, the weights do not
    pytest.param("HL-GET-2", id="keeps-its-old-label"),  # its /weight_info keeps the start label
    pytest.param("CTL-CACHE-1", id="keeps-its-cache"),  # a reset says success and keeps every prefix
]


def test_a_list_of_engine_urls_is_recognised_and_judged_on_every_engine(pytester, bucket):
    """No gateway: the suite fans every call out to the two engines itself and routes sessions by
    their key. Every clause the vLLM binding judges passes, but those needing what the dialect
    does not offer (routed experts; an API key nobody set); each engine's own routes are there,
    so the policy-version clauses are judged too."""
    with reference_fleet(bucket, 2, engine="vllm", gateway=False, **SERVED_PACE) as fleet:
        doc = judged(pytester, fleet, bucket)
    assert doc["engine"]["name"] == "fleet"
    assert doc["engine"]["decided"].startswith("auto: rl_fleet_urls names 2 engines"), doc["engine"]
    assert doc["engine"]["version"] == "2 engine(s): vllm 0.32.0"
    got = outcomes(doc)
    vllm = {c.id for c in catalogue() if c.binds("vllm")}
    unjudged = {k: v for k, v in got.items() if k in vllm and v != "pass"}
    assert unjudged == dict.fromkeys((ROUTING | {"HL-AUTH-1"}) & vllm, "unsupported"), unjudged
    assert doc["clauses"]["HL-GET-2"]["evidence"].startswith("observed: 2 replicas ready"), doc["clauses"]["HL-GET-2"]


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize("switch", ONE_ENGINE)
def test_a_fault_on_one_engine_fails_its_clause_naming_that_engine(pytester, bucket, switch, front):
    """Every call reaches both engines and the other engine behaves: only what the faulty engine
    then serves shows the fault. Exactly its clause fails, and the failure names that engine."""
    one_engine_fails(pytester, bucket, "vllm", switch, gateway=front == "gateway")


def one_engine_fails(pytester, bucket, engine: str, switch: str, *, gateway: bool) -> None:
    """Two engines of `engine`'s dialect, the second with the fault `switch`: exactly its clause
    fails, and each failure's sentence names the faulty engine, never the sound one."""
    with reference_fleet(
        bucket, 2, engine=engine, faults={1: frozenset({switch})}, gateway=gateway, **SERVED_PACE
    ) as fleet:
        doc = judged(pytester, fleet, bucket, OnlyClauses({switch}))
        faulty, sound = fleet.urls[1], fleet.urls[0]
    got = outcomes(doc)
    assert {k: v for k, v in got.items() if v == "fail"} == {switch: "fail"}, got
    failed = [t for t in doc["clauses"][switch]["tests"] if t["outcome"] == "fail"]
    # the verdict's sentence names the faulty engine (the status it rests on, shown after it, lists both)
    said = [t["reason"].split("; [{", 1)[0] for t in failed]
    assert failed and all(faulty in x and sound not in x for x in said), said
