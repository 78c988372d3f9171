"""Stop signals without a lock in the handler: what a long-running command (`rlrollout serve`)
waits on, and how a pytest run (`conformance`, `soak`) ends on SIGTERM as it ends on Ctrl-C.

Python runs a signal's handler on the main thread, between two bytecodes of whatever the main
thread was doing. A handler that takes a lock the interrupted code may hold can deadlock. `serve`
once set a `threading.Event` from its SIGTERM handler while its main thread waited on that very
Event: a signal landing just after `Event.wait()` had taken the Event's lock back left the handler
waiting for that lock for good, and every later signal nested one more handler on it (SIGKILL was
the only way out).

Here the handler takes nothing and does nothing: Python's own C-level handler has already written
the signal's number to a pipe (`signal.set_wakeup_fd`), and the main thread waits by reading that
pipe with select(2), which a signal interrupts and Python resumes. Another thread wakes the waiter
by writing to the same pipe (`wake`), which is how a command learns that its own shutdown ended.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType, TracebackType

# What stops a command: kill/systemd/docker stop, Ctrl-C, the terminal closing.
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)
# What ends a pytest run as Ctrl-C does (`interrupting`): Ctrl-C itself already does.
INTERRUPTING: tuple[signal.Signals, ...] = tuple(s for s in STOP_SIGNALS if s != signal.SIGINT)
WOKEN = 0  # what `wait` returns when another thread woke it: no signal has the number 0


class StopTimedOut(RuntimeError):
    """A command asked to stop did not within its bound: something of it hangs."""


class StopSignals:
    """Catch `signums` on the main thread from `__enter__` until `__exit__`; `wait` for them.

    A signal ignored on purpose stays ignored (`nohup rlrollout serve &` must outlive its terminal).
    On exit the previous handlers come back (`then="restore"`, for a caller in the same process),
    or, when the command is the whole process and is about to end, the default ones
    (`then="default"`): a signal arriving after the command stopped and cleaned up then ends the
    process at once and quietly (SIGINT's default handler would print a KeyboardInterrupt
    traceback from wherever the interpreter was in its exit)."""

    def __init__(self, signums: tuple[int, ...] = STOP_SIGNALS, *, then: str = "restore") -> None:
        if then not in ("restore", "default"):
            raise ValueError(f"then: 'restore' or 'default', not {then!r}")
        self.signums, self.then = tuple(signums), then
        self.caught: tuple[int, ...] = ()  # the signals this object catches (not those ignored on purpose)
        self._previous: dict[int, signal.Handlers | object] = {}
        self._previous_fd = -1
        self._read = self._write = -1
        self._wakeup_set = False
        self._pending = bytearray()  # bytes read from the pipe, not yet returned by `wait`
        self._woken = False
        # held by `wake` (any thread) and by closing the pipe; never by the signal handler
        self._closing = threading.Lock()

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            # signal.signal and set_wakeup_fd refuse other threads: Python delivers signals to the main one
            raise RuntimeError("stop signals can only be caught on the main thread")
        self._read, self._write = os.pipe()  # neither end is inherited by child processes
        os.set_blocking(self._write, False)  # set_wakeup_fd's requirement: a full pipe never blocks a handler
        try:
            # the pipe first: a signal caught before it is there would leave nothing to read
            self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
            self._wakeup_set = True
            for s in self.signums:
                if signal.getsignal(s) != signal.SIG_IGN:
                    self._previous[s] = signal.signal(s, _noted)
        except BaseException:
            self._release()
            raise
        self.caught = tuple(self._previous)
        return self

    def wait(self, timeout: float | None = None) -> int | None:
        """The number of the next caught signal, `WOKEN` once another thread called `wake`, or
        None when neither came within `timeout` seconds (None: wait for as long as it takes).
        Signals are returned one at a time, in the order they came."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._woken:
                self._woken = False
                return WOKEN
            while self._pending:
                # Python's C-level handler writes the number of every signal with a Python-level
                # handler (a test runner's SIGALRM, say): only ours end the wait; a 0 is a wake's,
                # already said by the flag
                number = self._pending.pop(0)
                if number in self.caught:
                    return number
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._read], [], [], left)[0]:
                return None
            self._pending += os.read(self._read, 512)

    def wake(self) -> None:
        """End a `wait` under way or the next one (from any thread)."""
        self._woken = True  # before the byte: a waiter that reads the byte sees the flag
        with self._closing:  # never a write to a descriptor closed (its number maybe reused) meanwhile
            if self._write == -1:
                return  # the waiter is gone
            # a pipe too full to take the byte is full of signals' bytes: it wakes the waiter as well
            with contextlib.suppress(BlockingIOError):
                os.write(self._write, bytes([WOKEN]))

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._release()

    def _release(self) -> None:
        for s, previous in self._previous.items():
            handler = signal.SIG_DFL if self.then == "default" else previous
            if handler is not None:  # None: a handler set outside Python, which cannot be put back
                signal.signal(s, handler)  # type: ignore[arg-type]
        self._previous = {}
        if self._wakeup_set:
            # the wakeup fd goes back before the pipe closes: a signal must never write to a closed
            # descriptor whose number the process may already have given to another file
            signal.set_wakeup_fd(self._previous_fd)
            self._wakeup_set = False
        with self._closing:
            for fd in (self._read, self._write):
                if fd != -1:
                    os.close(fd)
            self._read = self._write = -1


def _noted(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler: there must be one for Python to catch the signal at all, and it
    has nothing to do (the signal's number is already in the wakeup pipe). Taking no lock, it can
    interrupt anything."""


@contextlib.contextmanager
def interrupting(signums: tuple[int, ...] = INTERRUPTING) -> Iterator[None]:
    """Inside, `signums` (SIGTERM and SIGHUP) interrupt the main thread as Ctrl-C does: a
    KeyboardInterrupt, so a pytest run under way ends through its teardown (the soak's Locust
    processes stopped, the deployment served what it served at the start) instead of dying where
    it stands. The handler is Python's own Ctrl-C handler, which raises and takes no lock; a
    second signal interrupts the teardown in turn. An ignored signal stays ignored; outside the
    main thread (which alone catches signals) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        s: signal.signal(s, signal.default_int_handler) for s in signums if signal.getsignal(s) != signal.SIG_IGN
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            if handler is not None:  # None: a handler set outside Python, which cannot be put back
                signal.signal(s, handler)
