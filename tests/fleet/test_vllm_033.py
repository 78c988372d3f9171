"""vLLM 0.33's dialect judged by the suite (its behaviour read from the 0.33.0 wheel; no CPU build
of it exists to run): a request arriving while generation is paused in abort or wait mode is
refused (503), which CTL-PAUSE-1 fails, naming the mode and the release; the policy-version spans
come on the OpenAI routes too, so behind smg, which routes no /inference/v1/generate, the clauses
judged by versions are judged, where over 0.32 they are unsupported."""

import pytest

from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.reference.fleet import reference_fleet
from pytest_rlrollout.reference.settings import SERVED_PACE

from .test_gateway import POLICY_VERSIONS, ROUTING, judged, outcomes

RELEASE = "0.33.0"


@pytest.fixture
def bucket(tmp_path):
    return tmp_path / "bucket"


def test_vllm_0_33_engines_behind_smg_are_judged_on_what_that_release_does(pytester, bucket):
    """Green but CTL-PAUSE-1, whose failure shows the refusal and names the release; the clauses
    judged by policy versions pass through the gateway (over 0.32: unsupported); routed experts
    and the API key as over 0.32."""
    with reference_fleet(bucket, 2, engine="vllm", vllm_release=RELEASE, **SERVED_PACE) as fleet:
        doc = judged(pytester, fleet, bucket)
    assert doc["engine"]["version"] == f"2 engine(s): vllm {RELEASE}"
    got = outcomes(doc)
    vllm = {c.id for c in catalogue() if c.binds("vllm")}
    # through the gateway too: every clause judged by policy versions is judged, on the OpenAI routes' spans
    assert {c: got[c] for c in POLICY_VERSIONS & vllm} == dict.fromkeys(POLICY_VERSIONS & vllm, "pass")
    unjudged = {k: v for k, v in got.items() if k in vllm and v != "pass"}
    assert unjudged == {"CTL-PAUSE-1": "fail"} | dict.fromkeys((ROUTING | {"HL-AUTH-1"}) & vllm, "unsupported")
    [failed] = [t for t in doc["clauses"]["CTL-PAUSE-1"]["tests"] if t["outcome"] == "fail"]
    reason = failed["reason"]
    # a stream's headers are out before the engine refuses it: the refusal is an error event in a 200
    said = "a request sent while paused in abort mode was refused, not held: HTTP 200, an error event in the stream"
    assert said in reason and "'code': 503" in reason, reason
    assert "Generation is paused. Please retry after it resumes." in reason and f"vllm {RELEASE}" in reason, reason
