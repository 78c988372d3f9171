"""Snapshot validation in a child process.

A signalled snapshot is untrusted input: its safetensors headers may hold ~100 MB of JSON, and
parsing that holds the GIL (and GBs of memory) for seconds. In a process of its own, validation
stalls no stream of the server, the server's memory stays its own, a validation past its time is
killed, and a validator that crashes (an exception, a segfault, the memory limit) is a refusal
of that one snapshot, not a failure of the deployment.

One child serves every deployment of a process, one validation at a time; it starts on first use
and again after it died. Frames on its stdin and stdout: an 8-byte length, then a pickle (the
child is this module, started by this module: both ends are ours).
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

MEMORY_LIMIT = 4 << 30  # bytes of address space the child may map; past it, validation fails


class ValidatorFailed(Exception):
    """The validation did not finish: the validator raised, died, or ran out of time."""


class Validator:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def warm(self) -> None:
        """Start the child now, so the first signal does not wait for its imports."""
        with self._lock:
            self._started()

    def validate(self, snapshot: Path, context: Any, timeout: float) -> Any:
        """`validate(snapshot, context=context)` of pytest_rlrollout.snapshot.validate, in the
        child; ValidatorFailed when it raises, dies or takes longer than `timeout` seconds."""
        with self._lock:
            proc = self._started()
            try:
                _write(proc.stdin, (snapshot, context))
                kind, value = _read(proc.stdout, time.monotonic() + timeout)
            except (OSError, EOFError, TimeoutError, pickle.UnpicklingError) as e:
                self._kill()
                why = f"took longer than {timeout:g} s" if isinstance(e, TimeoutError) else "died"
                raise ValidatorFailed(f"the validator {why}") from None
        if kind == "error":
            raise ValidatorFailed(value)
        return value

    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            # the child imports exactly the modules this process imports
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                # one BLAS thread: per-thread buffers of a many-core host would eat the memory limit
                "OPENBLAS_NUM_THREADS": "1",
                "OMP_NUM_THREADS": "1",
            }
            # `-c`, not `-m`: this package imports this module, and runpy warns about that
            code = f"from {__name__} import _serve; _serve()"
            # A process group of its own: a terminal's Ctrl-C reaches the whole foreground group,
            # and it is the parent's to act on (the child ends when its stdin closes, or is
            # killed). Ignoring SIGINT in the child's own code came too late: a signal during the
            # interpreter's start (site, .pth files) still printed a traceback.
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                process_group=0,
            )
        return self._proc

    def close(self) -> None:
        """End the child now (at exit, or it would linger until the interpreter tears down)."""
        with self._lock:
            self._kill()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


_shared = Validator()
atexit.register(_shared.close)


def shared() -> Validator:
    return _shared


def _write(stream: IO[bytes] | None, value: Any) -> None:
    assert stream is not None
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def _read(stream: IO[bytes] | None, deadline: float) -> Any:
    assert stream is not None
    fd = stream.fileno()

    def exactly(n: int) -> bytes:
        chunks, left = [], n
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    return pickle.loads(exactly(int.from_bytes(exactly(8), "little")))


def _serve() -> None:
    """The child: validate what arrives on stdin until it closes (the parent has gone)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the validator prints goes to stderr, not into the frames
    from pytest_rlrollout.snapshot.validate import validate

    stdin = sys.stdin.buffer
    while True:
        head = stdin.read(8)
        if len(head) < 8:
            return
        snapshot, context = pickle.loads(stdin.read(int.from_bytes(head, "little")))
        try:
            answer: tuple[str, Any] = ("ok", validate(snapshot, context=context))
        except MemoryError:
            answer = ("error", f"the validator ran out of memory ({MEMORY_LIMIT >> 30} GiB)")
        except Exception as e:
            answer = ("error", f"the validator raised {type(e).__name__}: {str(e)[:300]}")
        try:
            _write(out, answer)
        except Exception as e:  # a report that does not pickle: say so instead of dying
            _write(out, ("error", f"the validator's report could not be sent ({type(e).__name__})"))
