"""Makes the engine conformance matrix (`docs/engines.md`) from runs of the suite on this machine:

    python -m tests.engines.publish [NAME ...]

Each run writes its report into `docs/engines/` (the JSON, compact, and the Markdown report with
its pictures); the page is then rendered from every report there (`rlrollout matrix`). NAMEs
choose runs (default: all of them):

- `coreweave-reference`, `fireworks-reference`, `sglang-reference`, `vllm-reference`: the bundled reference
  deployment in that dialect (not a real engine; every column says so);
- `vllm-0.33-reference`: the bundled reference speaking vLLM 0.33 (read from its wheel; no CPU
  build of 0.33 exists): `-o rl_local_vllm_release=0.33.0`;
- `vllm-0.32-cpu`: a real vLLM 0.32 CPU server (tests/engines/vllm_server.py: its flags and
  layout), judged by the whole suite, the tests that break it last;
- `vllm-0.32-cpu-x2-behind-smg`: two of them on one bucket behind a real smg 1.13
  (`--enable-rl`), judged through the gateway as the `smg` engine;
- `openai-transformers-serve`: `transformers serve` of the reference base (a plain
  OpenAI-compatible server).

tests/engines/test_engines_page.py keeps the page in sync with the reports.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from pytest_rlrollout.remote.polling import wait_until
from pytest_rlrollout.snapshot import tiny_moe
from pytest_rlrollout.suite.options import CONFORMANCE
from tests.processes import ended

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "docs" / "engines"
PAGE = ROOT / "docs" / "engines"  # the page's stem: docs/engines.md and docs/engines.html


def suite(report: Path, *args: str) -> None:
    """The whole installed suite, in a process of its own, writing `report` (its verdicts are the
    point: a failing run is not an error here)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(CONFORMANCE),
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--rl-report={report}",
            *args,
        ],
        cwd=report.parent,
        check=False,
    )
    if not report.is_file():
        raise SystemExit(f"the run wrote no report ({report})")


def reference(engine: str, *settings: str) -> Callable[[Path, Path], None]:
    return lambda report, base: suite(report, f"--rl-engine={engine}", *settings)


def real_vllm(report: Path, base: Path) -> None:
    from tests.engines.vllm_server import DTYPE, STREAM_TOKENS, vllm_server

    bucket = base.parent
    with vllm_server(base, report.parent / "vllm.log") as server:
        suite(
            report,
            f"--rl-base-url={server.url}",
            f"--rl-model={server.model}",
            f"--rl-api-key={server.key}",
            "--rl-engine=auto",
            "--rl-allow-hot-load",
            f"--rl-bucket-url={bucket}",
            f"--rl-base-snapshot={base}",
            "-o",
            f"rl_long_stream_tokens={STREAM_TOKENS}",
            "-o",
            "rl_exchange_timeout=20",
            "-o",
            f"rl_served_dtype={DTYPE}",
        )


def real_vllm_fleet(report: Path, base: Path) -> None:
    """Two real vLLM servers (no key, as behind a gateway) on one bucket behind a real smg."""
    from pytest_rlrollout.reference.fleet import smg_gateway
    from tests.engines.vllm_server import DTYPE, STREAM_TOKENS, vllm_servers

    bucket, logs = base.parent, report.parent
    each = [(base, logs / f"vllm-{i}.log", ()) for i in range(2)]
    with (
        vllm_servers(each, key=None) as servers,
        smg_gateway([s.url for s in servers], backend="vllm", log=logs / "smg.log") as gateway,
    ):
        suite(
            report,
            f"--rl-base-url={gateway.url}",
            "--rl-model=tiny",
            "--rl-engine=auto",
            "--rl-allow-hot-load",
            f"--rl-bucket-url={bucket}",
            f"--rl-base-snapshot={base}",
            "-o",
            f"rl_long_stream_tokens={STREAM_TOKENS}",
            "-o",
            "rl_exchange_timeout=20",
            "-o",
            f"rl_served_dtype={DTYPE}",
        )


@contextlib.contextmanager
def transformers_serve(base: Path, log: Path) -> Iterator[str]:
    command = shutil.which("transformers")
    if command is None:
        raise SystemExit("transformers serve is not installed (pip install 'transformers[serving]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [command, "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", str(base)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"transformers serve exited {proc.returncode}; see {log}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        return False

    try:
        wait_until(healthy, timeout=180, interval=0.25, what="transformers serve answering /health")
        yield url
    finally:
        ended(proc)


def openai_transformers(report: Path, base: Path) -> None:
    with transformers_serve(base, report.parent / "serve.log") as url:
        suite(report, f"--rl-base-url={url}", f"--rl-model={base}")


RUNS: dict[str, Callable[[Path, Path], None]] = {
    "coreweave-reference": reference("coreweave"),
    "fireworks-reference": reference("fireworks"),
    "sglang-reference": reference("sglang"),
    "vllm-reference": reference("vllm"),
    "vllm-0.33-reference": reference("vllm", "-o", "rl_local_vllm_release=0.33.0"),
    "vllm-0.32-cpu": real_vllm,
    "vllm-0.32-cpu-x2-behind-smg": real_vllm_fleet,
    "openai-transformers-serve": openai_transformers,
}


def publish(name: str) -> None:
    """Run `name` in a scratch directory; keep its JSON report (compact) and its Markdown report
    with the pictures it links to."""
    with tempfile.TemporaryDirectory(prefix=f"rlrollout-{name}-") as scratch:
        work = Path(scratch)
        base = tiny_moe.make_base(work / "bucket" / tiny_moe.BASE_IDENTITY)
        report = work / f"{name}.json"
        RUNS[name](report, base)
        for old in REPORTS.glob(f"{name}.*"):
            old.unlink()
        doc = json.loads(report.read_text())
        (REPORTS / report.name).write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")
        for kept in (report.with_suffix(".md"), *work.glob(f"{name}.numerics-*.png")):
            shutil.copy(kept, REPORTS / kept.name)


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        raise SystemExit(f"unknown run(s) {unknown}; known: {', '.join(RUNS)}")
    REPORTS.mkdir(parents=True, exist_ok=True)
    for name in names or list(RUNS):
        publish(name)
    from pytest_rlrollout.cli import main as rlrollout

    return rlrollout(["matrix", *map(str, sorted(REPORTS.glob("*.json"))), "--out", str(PAGE)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
