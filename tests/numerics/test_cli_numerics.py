"""`rlrollout numerics` against the reference deployment, in-process: figures printed, outputs
written, thresholds judged by the exit status, and usage or connection errors as one line."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from pytest_rlrollout.cli import main
from pytest_rlrollout.snapshot import tiny_moe

PNG = b"\x89PNG\r\n\x1a\n"
FAST = ["--prompts", "4", "--tokens", "16"]


@pytest.fixture(autouse=True)
def _no_key_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FIREWORKS_API_KEY", raising=False)


def _args(dep, bucket: Path, *extra: str) -> list[str]:
    return [
        "numerics",
        "--deployment",
        dep.name,
        "--base-url",
        dep.base_url,
        "--model",
        dep.model,
        "--api-key",
        dep.api_key,
        "--snapshot",
        str(bucket / tiny_moe.BASE_IDENTITY),
        *FAST,
        *extra,
    ]


def _figure(out: str, label: str) -> str:
    return re.search(rf"^{re.escape(label)}\s+(\S+)", out, re.MULTILINE).group(1)


def test_the_reference_deployment_matches_its_own_weights(start, bucket, tmp_path, capsys) -> None:
    dep = start()
    assert main(_args(dep, bucket, "--out", str(tmp_path / "out"))) == 0
    out, err = capsys.readouterr()
    assert float(_figure(out, "k3 KL(served‖local)")) < 1e-9
    assert float(_figure(out, "max |Δlogprob|")) < 1e-5
    assert _figure(out, "tokens compared") == "64"
    assert "routing agreement        100.000% of (layer, token) over 64 tokens" in out
    assert "every threshold holds" in out
    assert "sampling 4/4" in err and "scoring 4/4" in err
    assert dep.api_key not in out + err
    doc = json.loads((tmp_path / "out" / "numerics.json").read_text())
    assert doc["crossed"] == [] and doc["figures"]["route_agreement"] == 1.0 and doc["figures"]["tokens"] == 64
    assert sorted(doc["pictures"]) == [
        "numerics-delta-by-position.png",
        "numerics-delta-histogram.png",
        "numerics-routing-by-layer.png",
    ]
    assert all((tmp_path / "out" / name).read_bytes().startswith(PNG) for name in doc["pictures"])


def test_decode_logprobs_in_bfloat16_cross_max_kl(start, bucket, tmp_path, capsys) -> None:
    dep = start(faults={"FID-DECODE-1"})
    assert main(_args(dep, bucket, "--max-kl", "1e-7", "--out", str(tmp_path / "out"))) == 1
    out, _ = capsys.readouterr()
    crossed = [line for line in out.splitlines() if line.startswith("threshold crossed:")]
    assert len(crossed) == 1 and re.fullmatch(r"threshold crossed: k3 KL \S+ > --max-kl 1e-07", crossed[0]), out
    assert "routing agreement        100.000%" in out  # the routing is still the local router's
    assert json.loads((tmp_path / "out" / "numerics.json").read_text())["crossed"] == [crossed[0].split(": ", 1)[1]]


def test_every_threshold_crossed_is_named(start, bucket, capsys) -> None:
    dep = start(faults={"FID-DECODE-1"})
    assert main(_args(dep, bucket, "--max-kl", "1", "--max-logprob-delta", "1e-4")) == 1
    out, _ = capsys.readouterr()
    assert re.search(r"^threshold crossed: max \|Δlogprob\| \S+ > --max-logprob-delta 0.0001$", out, re.MULTILINE)
    assert "--max-kl" not in out


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if not line.startswith(("sampling ", "scoring "))]
    assert len(lines) == 1 and lines[0].startswith("rlrollout numerics: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_a_wrong_key_is_one_line_that_never_shows_the_key(start, bucket, capsys) -> None:
    dep = start()
    args = _args(dep, bucket)
    args[args.index("--api-key") + 1] = "the-wrong-key-1234"
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert "401" in _one_error_line(err) and "the-wrong-key-1234" not in out + err


@pytest.mark.parametrize(
    "change, says",
    [
        ({"--base-url": "http://127.0.0.1:{port}"}, "could not be reached"),
        ({"--model": ""}, "--model"),
        ({"--snapshot": "{missing}"}, "not a directory"),
        ({"--deployment": "not-a-deployment-name"}, "accounts/<account>/deployments/<deployment>"),
        ({"--api-key": ""}, "FIREWORKS_API_KEY"),
        ({"--min-route-agreement": "90"}, "a fraction in [0, 1]"),
    ],
)
def test_usage_and_connection_errors_exit_2_with_one_line(change, says, start, bucket, tmp_path, capsys) -> None:
    dep = start()
    args = _args(dep, bucket)
    for flag, value in change.items():
        value = value.format(port=_closed_port(), missing=tmp_path / "missing")
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert says in _one_error_line(err) and dep.api_key not in out + err
