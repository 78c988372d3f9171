"""Stop signals raced against the wait: the bare mechanism (`cli.stopping`) and a real `rlrollout
serve`, under bursts of SIGTERM and SIGINT such as several callers stopping a process at once.

Once, `serve`'s SIGTERM handler set a `threading.Event` its main thread waited on, and a signal
landing while `Event.wait()` held the Event's lock deadlocked the handler: 15 of 20 bare processes
hung under such bursts, and a `serve` that did not hang died of the burst's next SIGTERM before
removing its temporary bucket (40 of 46)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from pytest_rlrollout.cli import main
from pytest_rlrollout.cli.stopping import INTERRUPTING, STOP_SIGNALS, WOKEN, StopSignals, interrupting

from .processes import PROGRAM, ROOT, started

BURST = 0.1  # seconds of signals per burst: SIGTERM and SIGINT alternately, as fast as they go
BURSTS = (signal.SIGTERM, signal.SIGINT)


def burst(pids: list[int], seconds: float = BURST) -> int:
    """Signal every process in `pids`, SIGTERM and SIGINT alternately, for `seconds`; how many
    signals were sent."""
    rounds, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for pid in pids:  # each process gets SIGTERM, SIGINT, SIGTERM, ...
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, BURSTS[rounds % 2])
        rounds += 1
    return rounds * len(pids)


# --------------------------------------------------------------------------- the bare mechanism

BARE = """
import sys, threading
from pytest_rlrollout.cli.stopping import StopSignals

def spin():
    while True:
        pass

for _ in range(int(sys.argv[1])):  # threads wanting the GIL widen every window a signal can hit
    threading.Thread(target=spin, daemon=True).start()
with StopSignals() as signals:
    print("ready", flush=True)
    first = signals.wait()
    later = 0
    while signals.wait(timeout=0.3) is not None:  # the rest of the burst: every one still caught
        later += 1
    print(f"stopped by {first}, then {later} more", flush=True)
"""


@pytest.mark.parametrize("busy", [0, 1], ids=["idle", "a busy thread"])
def test_the_bare_mechanism_survives_bursts_many_times_over(busy):
    """40 processes (4 at a time) each waiting on StopSignals get 0.1 s of SIGTERM and SIGINT
    alternately: each one's wait returns its first signal, catches every later one until the
    burst ends, and the process exits 0 within 3 s of the burst's end."""
    worst = 0.0
    for _ in range(10):
        children = [started(BARE, str(busy), until="ready") for _ in range(4)]
        sent = burst([c.pid for c in children])
        t0 = time.monotonic()
        for c in children:
            said = c.rest(timeout=3)
            assert c.proc.returncode == 0, (c.proc.returncode, said, c.proc.stderr.read())
            assert said and said[-1].startswith("stopped by "), said
            assert int(said[-1].split()[2].rstrip(",")) in (signal.SIGTERM, signal.SIGINT)
        worst = max(worst, time.monotonic() - t0)
    assert sent > 100  # a burst, not a signal or two
    print(f"worst stop after a burst: {worst:.2f} s")


def test_stop_signals_returns_them_in_order_and_puts_the_handlers_back():
    """Caught signals come out of `wait` one at a time in order; a signal with a handler of its
    own (not a stop signal) runs its handler and does not end the wait; `wake` does; on exit the
    handlers and the wakeup descriptor are the caller's again."""
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    wakeup = signal.set_wakeup_fd(-1)  # read by setting it: put straight back
    signal.set_wakeup_fd(wakeup)
    usr1: list[int] = []
    previous_usr1 = signal.signal(signal.SIGUSR1, lambda s, f: usr1.append(s))
    try:
        with StopSignals() as signals:
            assert set(signals.caught) == set(STOP_SIGNALS)
            for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
                signal.raise_signal(signum)
            assert [signals.wait(), signals.wait()] == [signal.SIGTERM, signal.SIGINT]
            assert usr1 == [signal.SIGUSR1]
            assert signals.wait(timeout=0) is None
            threading.Thread(target=signals.wake).start()
            assert signals.wait(timeout=30) == WOKEN
        assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before
        assert signal.set_wakeup_fd(wakeup) == wakeup  # the caller's descriptor, not ours
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)


def test_stop_signals_leaves_an_ignored_signal_ignored_and_can_end_on_the_defaults():
    """`nohup` (SIGHUP ignored) stays in force; `then="default"` hands the defaults back (the
    program ending: a later signal ends it at once, and quietly)."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with StopSignals(then="default") as signals:
            assert signal.SIGHUP not in signals.caught and signal.SIGTERM in signals.caught
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == signal.getsignal(signal.SIGINT) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, previous)
        for s, handler in before.items():
            signal.signal(s, handler)


def test_stop_signals_refuses_a_thread_that_cannot_catch_them():
    """Only the main thread catches signals: elsewhere StopSignals says so instead of waiting
    for a signal that can never come."""
    errors: list[BaseException] = []

    def other():
        try:
            with StopSignals():
                pass
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join(timeout=30)
    assert len(errors) == 1 and "main thread" in str(errors[0])


# --------------------------------------------------------------------------- rlrollout serve


def freed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("engine", ["fireworks", "vllm"])
def test_serve_under_bursts_of_stop_signals_always_stops_and_cleans_up(serve, engine):
    """12 runs of `rlrollout serve`, each given 0.1 s of SIGTERM and SIGINT alternately: each ends
    within 5 s of the burst, having said it stopped; nothing listens on its port; its temporary
    bucket is gone; it prints no traceback. It exits 0, or, where the burst outlasted the stop,
    dies of a later signal after it said so (the default handlers are back by then)."""
    worst = 0.0
    for _ in range(12):
        child = serve("--engine", engine)
        burst([child.pid])
        t0 = time.monotonic()
        said = child.rest(timeout=5)
        worst = max(worst, time.monotonic() - t0)
        err = child.proc.stderr.read()
        assert said and said[0].startswith("stopping (") and said[-1].startswith("stopped ("), (said, err)
        assert child.proc.returncode in (0, -signal.SIGTERM, -signal.SIGINT), (child.proc.returncode, err)
        assert "Traceback" not in err, err
        assert not child.bucket.exists() and freed(child.port)
    print(f"{engine}: worst stop after a burst {worst:.2f} s")


def test_a_terminals_ctrl_c_stops_serve_and_nothing_of_it_prints_a_traceback(tmp_path):
    """Ctrl-C in a terminal reaches the foreground job's whole process group. Serve stops (exit
    0, bucket removed) and nothing prints a traceback: the validator child serve starts, whose
    life is its parent's, is in a group of its own. It once printed a KeyboardInterrupt from its
    imports, and later (CI) from its interpreter's start: here a site that takes 1 s to import
    (as a slow .pth file did in CI) holds every child in that start when the Ctrl-C comes."""
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(1)\n")
    child = started(PROGRAM, "serve", until="serving", session=True, env={"PYTHONPATH": str(tmp_path)})
    try:
        os.killpg(child.pid, signal.SIGINT)
        said = child.rest(timeout=30)
        assert child.proc.returncode == 0 and said[-1] == "stopped (SIGINT)", said
        assert child.proc.stderr.read() == ""
        assert not child.bucket.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # whatever of the group is left


def stream(port: int, max_tokens: int) -> tuple[threading.Event, list[bytes]]:
    """A streamed completion from the vLLM dialect on `port`, read in a thread: set once the
    first chunk came; the chunks, and b"ended" once the stream ended (either way)."""
    first, chunks = threading.Event(), []

    def read() -> None:
        body = {"model": "tiny", "prompt": "count", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
        try:
            with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120) as r:
                for chunk in r.iter_raw():
                    chunks.append(chunk)
                    first.set()
        except httpx.HTTPError:
            pass
        chunks.append(b"ended")
        first.set()

    threading.Thread(target=read, daemon=True).start()
    return first, chunks


def test_serve_lets_a_stream_in_flight_finish_on_the_first_signal(serve):
    """One SIGTERM while a short stream runs: the stream ends complete ([DONE]), then serve
    exits 0 and removes its bucket."""
    child = serve("--engine", "vllm", "--token-delay", "0.02")
    first, chunks = stream(child.port, max_tokens=40)
    assert first.wait(30) and chunks[0] != b"ended"
    child.proc.send_signal(signal.SIGTERM)
    said = child.rest(timeout=30)
    assert child.proc.returncode == 0 and said[-1] == "stopped (SIGTERM)", said
    assert b"data: [DONE]" in b"".join(chunks) and chunks[-1] == b"ended"
    assert not child.bucket.exists() and freed(child.port)


def test_a_second_signal_during_the_stop_ends_the_streams_and_serve_at_once(serve):
    """SIGTERM while a stream with 40 s still to go runs: serve says it is stopping and waits for
    the stream; a SIGINT then ends the stream and serve within 5 s, exit 0, bucket removed."""
    child = serve("--engine", "vllm", "--token-delay", "0.02")
    first, chunks = stream(child.port, max_tokens=2000)
    assert first.wait(30) and chunks[0] != b"ended"
    child.proc.send_signal(signal.SIGTERM)
    stopping = child.lines.get(timeout=30)
    assert stopping.startswith("stopping (SIGTERM)"), stopping
    t0 = time.monotonic()
    child.proc.send_signal(signal.SIGINT)
    said = child.rest(timeout=5)
    assert child.proc.returncode == 0 and said == ["stopped (SIGTERM)"], said
    assert time.monotonic() - t0 < 5
    assert b"data: [DONE]" not in b"".join(chunks)  # cut short, 40 s early
    assert not child.bucket.exists() and freed(child.port)


# --------------------------------------------------------------------------- a stop that hangs


class _Hangs:
    """A reference deployment whose stop never ends (the test's `release` lets it go) and which
    leaves a thread the interpreter joins at exit: what a stop that hangs looks like."""

    def __init__(self, release: threading.Event):
        self.release = release

    def __call__(self, bucket, **options):
        return self

    def __enter__(self):
        from pytest_rlrollout.reference.server import Running

        threading.Thread(target=self.release.wait, name="stuck", daemon=False).start()
        signal.raise_signal(signal.SIGTERM)  # caught: serve stops as soon as it served
        return Running("http://127.0.0.1:9", _Deployment())

    def __exit__(self, *exc):
        self.release.wait()


class _Deployment:
    class settings:
        engine = "fireworks"
        base_identity = "tiny-qwen3-moe-base"
        deployment = "accounts/rlrollout/deployments/reference"
        model = "accounts/rlrollout/models/tiny-qwen3-moe"
        load_delay, stagger, swap_delay = 0.03, 0.0, 1.0
        bucket = Path("/nonexistent/rlrollout-bucket")  # no base there: nothing for a swap's timeout to count

    replicas = (None, None)


def test_a_stop_that_hangs_is_given_up_with_the_bucket_removed(monkeypatch, capsys):
    """In process: a deployment that never stops makes serve give up after STOP_WITHIN seconds,
    remove its temporary bucket itself, and end 3 with one line saying so."""
    from pytest_rlrollout import reference
    from pytest_rlrollout.cli import serve as serve_command

    release = threading.Event()
    monkeypatch.setattr(reference, "reference_deployment", _Hangs(release))
    monkeypatch.setattr(serve_command, "STOP_WITHIN", 0.5)
    try:
        assert main(["serve"]) == 3
    finally:
        release.set()
    out, err = capsys.readouterr()
    bucket = Path(next(x for x in out.splitlines() if x.startswith("bucket:")).split(":", 1)[1].strip())
    assert not bucket.exists()
    assert err.count("\n") == 1 and "did not stop within 0.5 s" in err and str(bucket) in err


def test_the_program_ends_even_when_a_thread_of_its_stop_hangs(tmp_path):
    """As the `rlrollout` program, the same hung stop ends the process (exit 3) although a thread
    the interpreter would join at exit never ends."""
    script = (
        "import threading; from pytest_rlrollout import reference; from pytest_rlrollout.cli import serve; "
        "from tests.test_stopping import _Hangs; "
        "reference.reference_deployment = _Hangs(threading.Event()); serve.STOP_WITHIN = 0.5; " + PROGRAM
    )
    done = subprocess.run([sys.executable, "-c", script, "serve"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert "did not stop within 0.5 s" in done.stderr and "Traceback" not in done.stderr
    bucket = Path(next(x for x in done.stdout.splitlines() if x.startswith("bucket:")).split(":", 1)[1].strip())
    assert not bucket.exists()


# --------------------------------------------------------------------------- pytest runs


def test_interrupting_makes_sigterm_a_ctrl_c_and_puts_the_handlers_back():
    """Inside `interrupting`, SIGTERM and SIGHUP raise KeyboardInterrupt (as Ctrl-C does); an
    ignored one stays ignored; outside, the caller's handlers are back."""
    noted: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in INTERRUPTING}
    try:
        for signum in INTERRUPTING:
            with pytest.raises(KeyboardInterrupt), interrupting():
                signal.raise_signal(signum)  # its handler has run when raise_signal returns
            signal.raise_signal(signum)  # the caller's handler again
        assert noted == list(INTERRUPTING)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with interrupting():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def test_rlrollout_conformance_ends_on_sigterm_through_its_teardown(tmp_path):
    """SIGTERM while the suite runs against the bundled reference deployment: pytest stops as on
    Ctrl-C (its teardown runs: the report is written, the deployment stopped) and the command
    ends 130 within 30 s."""
    run = started(
        PROGRAM,
        "conformance",
        "-v",
        "-p",
        "no:randomly",
        f"--rl-report={tmp_path / 'r.json'}",
        until="conformance/test_",
        within=120,
    )
    run.proc.send_signal(signal.SIGTERM)
    said = run.rest(timeout=30)
    assert run.proc.returncode == 130, (said[-5:], run.proc.stderr.read()[-2000:])
    assert any("KeyboardInterrupt" in line for line in said), said[-5:]
    assert (tmp_path / "r.json").is_file()
