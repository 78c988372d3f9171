"""The suite judges a fleet of two real vLLM 0.32 CPU servers behind a real smg 1.13 (`smg launch
--enable-rl --backend vllm --policy consistent_hashing`, the fleet extra), as self-hosted RL teams
run their rollout engines: `--rl-engine auto` against the gateway, both engines started (without
a key, as behind a gateway) from the reference base in one bucket.

- The single engine's reload finding is found on each engine through the gateway: a reloaded
  checkpoint's MoE experts are left in the checkpoint's layout (test_vllm.py has the second
  observation), so CTL-LABEL-1, NUM-LOGPROB-1 and FID-SAME-1 fail as on one server.
- The breaking test, last: one engine is made unable to read what the suite writes into the
  bucket (its own mount namespace, the bucket bound over by a directory holding only the base: a
  directory it cannot load, for real), then the suite swaps through the gateway. The fan-out
  answers 207; the verdict names that engine, says the fleet now serves mixed snapshots and shows
  the gateway's per-engine answer.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from pytest_rlrollout.reference.fleet import smg_gateway
from pytest_rlrollout.snapshot import tiny_moe
from pytest_rlrollout.suite.options import CONFORMANCE
from tests.engines.vllm_server import DTYPE, STREAM_TOKENS, vllm_servers

pytestmark = pytest.mark.xdist_group("vllm")  # one fleet at a time on a 2-core machine

# a mount namespace of its own, private: a bind mount inside it is the engine's alone
OWN_MOUNTS = ("unshare", "--mount", "--propagation", "private", "--")
# vLLM 0.32's reload finding, on each engine (see the module docstring)
FAILS = {"CTL-LABEL-1", "NUM-LOGPROB-1", "FID-SAME-1"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two vLLM servers on one bucket (the second in a mount namespace of its own) behind smg."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.fail("util-linux's unshare and nsenter are needed to take a directory from one engine")
    root = tmp_path_factory.mktemp("fleet")
    bucket = root / "bucket"
    base = tiny_moe.make_base(bucket / tiny_moe.BASE_IDENTITY)
    each = [(base, root / "vllm-0.log", ()), (base, root / "vllm-1.log", OWN_MOUNTS)]
    with (
        vllm_servers(each, key=None) as servers,
        smg_gateway([s.url for s in servers], backend="vllm", log=root / "smg.log") as gateway,
    ):
        yield servers, gateway, bucket, base


def conformance(pytester, fleet, report: str, *extra: str) -> dict:
    _, gateway, bucket, base = fleet
    pytester.runpytest_inprocess(
        str(CONFORMANCE),
        "-p",
        "no:randomly",
        f"--rl-base-url={gateway.url}",
        "--rl-model=tiny",
        "--rl-engine=auto",
        "--rl-allow-hot-load",
        f"--rl-bucket-url={bucket}",
        f"--rl-base-snapshot={base}",
        f"--rl-report={report}",
        "-o",
        f"rl_long_stream_tokens={STREAM_TOKENS}",
        "-o",
        f"rl_served_dtype={DTYPE}",
        *extra,
    )
    return json.loads((pytester.path / report).read_text())


def verdicts(doc: dict) -> dict[str, str]:
    return {k: v["outcome"] for k, v in doc["clauses"].items()}


def test_the_suite_judges_the_fleet_through_the_gateway(pytester, fleet):
    doc = conformance(pytester, fleet, "fleet.json", "-m", "not rl_breaks")
    got = verdicts(doc)
    assert doc["engine"]["name"] == "smg", doc["engine"]
    assert "GET /v1/rl/workers lists 2 engine(s) (vllm)" in doc["engine"]["decided"], doc["engine"]
    assert doc["engine"]["version"] == "2 engine(s): vllm 0.32.0", doc["engine"]
    assert "error" not in got.values(), {c: o for c, o in got.items() if o == "error"}
    assert {c for c, o in got.items() if o == "fail"} == FAILS, {c: o for c, o in got.items() if o == "fail"}
    assert doc["clauses"]["HL-GET-2"]["evidence"].startswith("observed: 2 replicas ready"), doc["clauses"]["HL-GET-2"]
    provenance = doc["provenance"]
    assert provenance["served_at_end"] == provenance["served_at_start"] == ["default"], provenance


def test_an_engine_that_cannot_load_leaves_the_fleet_mixed(pytester, fleet, tmp_path):
    """Last (it leaves engine 1 unable to load, and vLLM 0.32 does not survive a refused reload)."""
    servers, _, bucket, base = fleet
    only_base = tmp_path / "only-the-base"
    shutil.copytree(base, only_base / base.name)
    subprocess.run(
        [
            "nsenter",
            "--target",
            str(servers[1].process.pid),
            "--mount",
            "--",
            "mount",
            "--bind",
            str(only_base),
            str(bucket),
        ],
        check=True,
    )
    doc = conformance(
        pytester,
        fleet,
        "mixed.json",
        "-k",
        "test_every_replica_reaches_the_new_identity",
        "-o",
        "rl_exchange_timeout=60",
    )
    [test] = [t for t in doc["clauses"]["HL-GET-2"]["tests"] if t["outcome"] == "fail"]
    reason = test["reason"]
    assert (
        f"got 207: the load failed on {servers[1].url} (HTTP 500), 1 of 2 engines, and the fleet now serves "
        "mixed snapshots: " in reason
    ), reason
    assert servers[0].url not in reason.split(", and the fleet")[0], reason
    assert servers[1].url in reason.split("; ")[1] and "answered" in reason.split("; ")[1], reason
    # the gateway's own per-engine answer follows
    assert "The gateway's answer (HTTP 207): " in reason and '"failed":[' in reason, reason
