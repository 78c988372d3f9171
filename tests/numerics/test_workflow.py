"""The numerics workflow as a library (what `rlrollout numerics` calls): thresholds, the target
and the snapshot's config judged without a deployment or an argparse Namespace."""

from __future__ import annotations

import json
import math

import pytest

from pytest_rlrollout.numerics.figures import Figures
from pytest_rlrollout.numerics.workflow import NumericsError, Thresholds, deployment_target, snapshot_config


def _figures(k3_kl: float = 0.0, max_abs: float = 0.0, route_agreement: float | None = None) -> Figures:
    return Figures(
        tokens=4, mean_abs=0.0, max_abs=max_abs, k3_kl=k3_kl, ratio_outside=0.0, route_agreement=route_agreement
    )


def test_thresholds_name_each_figure_crossed_and_a_nan_crosses() -> None:
    limits = Thresholds(max_kl=1e-3, max_logprob_delta=0.5, min_route_agreement=0.9)
    assert limits.crossed(_figures(route_agreement=0.95)) == []
    assert limits.crossed(_figures(k3_kl=math.nan, max_abs=1.0, route_agreement=0.5)) == [
        "k3 KL nan > --max-kl 0.001",
        "max |Δlogprob| 1 > --max-logprob-delta 0.5",
        "routing agreement 50.000% < --min-route-agreement 0.9",
    ]
    # no routing compared, no logprob limit: only the KL is judged
    assert Thresholds().crossed(_figures(max_abs=9.0)) == []
    assert Thresholds().as_dict() == {"max_kl": 1e-3, "max_logprob_delta": None, "min_route_agreement": 0.99}


def test_a_target_needs_a_model_and_a_fireworks_deployment_a_key() -> None:
    with pytest.raises(NumericsError, match=r"^pass --model"):
        deployment_target(None, "http://127.0.0.1:1", None, "")
    with pytest.raises(NumericsError, match=r"^--deployment accounts/a/deployments/d: pass --api-key"):
        deployment_target("accounts/a/deployments/d", "https://api.fireworks.ai", "m", "")
    target = deployment_target(None, "http://127.0.0.1:1/", "tiny", "")
    assert target.base_url == "http://127.0.0.1:1" and target.engine == "openai"


def test_the_snapshot_config_is_a_json_object_in_a_directory(tmp_path) -> None:
    with pytest.raises(NumericsError, match="not a directory"):
        snapshot_config(tmp_path / "missing")
    with pytest.raises(NumericsError, match=r"no readable config\.json"):
        snapshot_config(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(NumericsError, match="not a JSON object"):
        snapshot_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 7}))
    assert snapshot_config(tmp_path) == {"vocab_size": 7}
