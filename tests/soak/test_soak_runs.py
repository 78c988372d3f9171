"""Soaks of the bundled reference deployment, end to end: Locust in child processes (one, or a
master and two workers), the trainer swapping through the suite's swap path, every verdict read
back from the suite's report. Each soak here is short (two or three swaps, about ten seconds);
the README gives the ten-minute ones."""

import json

import pytest

from pytest_rlrollout.suite.options import CONFORMANCE

pytestmark = pytest.mark.xdist_group("soak")  # each soak takes both cores: one at a time

ALWAYS = ("SWAP-NEW-1", "VER-STREAM-1", "HL-GET-2", "FID-SWAP-1")  # judged on every stream, or every swap


def soak(pytester, tmp_path, *more: str, swaps: int = 2, users: int = 12, workers: int = 0):
    report = tmp_path / "report.json"
    pytester.inline_run(
        str(CONFORMANCE / "test_soak.py"),
        "-o",
        "rl_soak=true",
        "-p",
        "no:randomly",
        f"--rl-report={report}",
        "-o",
        "rl_soak_seconds=25",
        "-o",
        f"rl_soak_swaps={swaps}",
        "-o",
        "rl_soak_every=1",
        "-o",
        f"rl_soak_users={users}",
        "-o",
        f"rl_soak_workers={workers}",
        *more,
    )
    doc = json.loads(report.read_text())
    books = json.loads((tmp_path / "soak" / "soak.json").read_text())
    return {cid: c["outcome"] for cid, c in doc["clauses"].items()}, doc, books


def failures(doc: dict) -> dict[str, str]:
    return {cid: c["tests"][0]["reason"] for cid, c in doc["clauses"].items() if c["outcome"] == "fail"}


def test_a_sync_soak_is_green(pytester, tmp_path):
    outcomes, doc, books = soak(pytester, tmp_path, "-o", "rl_transition=SYNC")
    assert not failures(doc)
    assert {c: outcomes[c] for c in ALWAYS} == dict.fromkeys(ALWAYS, "pass")
    assert outcomes["SWAP-ASYNC-1"] == outcomes["SWAP-ASYNC-3"] == "not-applicable"
    assert books["transition"] == "SYNC"
    # the report's Soak section: figures, every swap, three pictures beside the report
    section = doc["soak"]
    assert len(section["swaps"]) == 2 and all(s["served_at"] for s in section["swaps"])
    assert [p.rsplit(".soak-", 1)[1] for p in section["pictures"]] == ["throughput.png", "latency.png", "stalls.png"]
    assert all((tmp_path / p).stat().st_size > 1000 for p in section["pictures"])
    assert "## Soak" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    "faults, caught, tokens",
    [
        # a stale label after a swap, in turns of 256 tokens: a stream outlasts a swap by more than
        # the judge's 0.5 s grace whatever the machine's speed (a 32-token turn lasts about 0.1 s,
        # and only a loaded machine stretched one past the grace)
        (["SWAP-ASYNC-2:stale"], ["SWAP-ASYNC-2"], 256),
        # cache entries kept across 'all'; a replica that keeps its old weights. Apart from the stale
        # labels, which leave turns undated for the cache (and long turns leave few turns to date)
        (["CACHE-MATRIX-ALL-SAME", "FID-SWAP-1:one"], ["CACHE-MATRIX-ALL-SAME", "FID-SWAP-1"], 32),
        # a swap that ends the streams in flight (on its own: a cut stream carries no stale label)
        (["SWAP-ASYNC-1"], ["SWAP-ASYNC-1"], 32),
    ],
    ids=["stale-labels", "cache-and-replica", "cut-streams"],
)
def test_faults_are_caught_and_named_with_counts(pytester, tmp_path, faults, caught, tokens):
    _, doc, books = soak(
        pytester,
        tmp_path,
        "-o",
        f"rl_local_faults={' '.join(faults)}",
        "-o",
        f"rl_soak_max_tokens={tokens}",
        swaps=3,
        users=16,
    )
    failed = failures(doc)
    assert sorted(failed) == sorted(caught), failed
    for cid in caught:
        v = books["verdicts"][cid]
        assert 0 < v["violations"] <= v["judged"] and v["examples"]
        assert failed[cid].startswith(f"{v['violations']} of {v['judged']} judged broke {cid}")


def test_a_master_and_two_workers_soak_the_vllm_dialect_and_their_books_add_up(pytester, tmp_path):
    # Locust's distributed mode; the vLLM driver's swaps (one engine, full snapshots, pause keep ->
    # reload -> label -> reset -> resume); its version spans cut short by a fault
    outcomes, doc, books = soak(pytester, tmp_path, "--rl-engine=vllm", "-o", "rl_local_faults=VER-SPAN-1", workers=2)
    assert failures(doc).keys() == {"VER-SPAN-1"}
    assert {c: outcomes[c] for c in ("SWAP-NEW-1", "HL-GET-2", "FID-SWAP-1")} == dict.fromkeys(
        ("SWAP-NEW-1", "HL-GET-2", "FID-SWAP-1"), "pass"
    )
    assert outcomes["VER-STREAM-1"] == "not-applicable" and all(s["kind"] == "full" for s in books["swaps"])
    v = books["verdicts"]["VER-SPAN-1"]
    # (a one-token output has one span, and no room for the fault's gap)
    assert 0 < v["violations"] <= v["judged"] and all("(a gap)" in e for e in v["examples"])
    # two worker processes, each counted its own turns; their sum is exactly what reached the
    # judge (turns, tokens, every latency bucket, every error)
    assert len(books["workers"]) == 2 and all(w["turns"] for w in books["workers"].values())
    summed = {k: sum(w[k] for w in books["workers"].values()) for k in ("turns", "tokens")}
    assert summed == {"turns": books["figures"]["turns"], "tokens": books["figures"]["tokens"]}
    assert books["exit_codes"] == [0, 0, 0] and outcomes.get("SWAP-ASYNC-1") == "pass"
