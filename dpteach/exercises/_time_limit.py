"""A time limit for the exercise checks: a watchdog thread interrupts a check that runs too long.

A learner's endless loop would otherwise hang the notebook. The watchdog sends the main thread a SIGINT, as
Jupyter's "interrupt kernel" does (it wakes a ``time.sleep`` or a wait on a replica thread too); the check turns it
into a sentence. It is armed only where that can be caught: the main thread, with Python's own SIGINT handler
(in Jupyter while a cell runs, and in plain Python).
"""

from __future__ import annotations

import _thread
import signal
import threading
import time

DEFAULT_SECONDS = 120.0  # the checks take seconds on a laptop; two minutes leaves room for a slow machine
_seconds: float | None = DEFAULT_SECONDS


def set_time_limit(seconds: float | None) -> None:
    """How long a check may run before it stops with a sentence (``None``: no limit)."""
    global _seconds
    if seconds is not None and not seconds > 0:
        raise ValueError(f"the time limit is a positive number of seconds, or None (no limit): {seconds!r}")
    _seconds = seconds


def time_limit() -> float | None:
    """The current limit in seconds (``None``: none)."""
    return _seconds


class TimeLimit:
    """``with TimeLimit(s) as limit: ...``: a KeyboardInterrupt inside the block after ``s`` seconds, ``limit.fired`` set."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.fired = False
        self._done = False
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.armed = (
            seconds is not None
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )

    def __enter__(self) -> "TimeLimit":
        if self.armed:
            self._timer = threading.Timer(self.seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # an interrupt on its way arrives here, inside the with
        self.stop(wait=exc_type is not KeyboardInterrupt)

    def _fire(self) -> None:
        with self._lock:
            if self._done:  # the check finished first: nothing to interrupt
                return
            self.fired = True
        if hasattr(signal, "pthread_kill"):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # wakes sleeps and waits too
        else:  # pragma: no cover - Windows
            _thread.interrupt_main()

    def stop(self, wait: bool = True) -> None:
        """End the watch; if it fired and ``wait``, let its interrupt arrive here, inside the caller's ``try``."""
        with self._lock:
            self._done = True
        if self._timer is not None:
            self._timer.cancel()
        if self.fired and wait:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:  # the signal's KeyboardInterrupt is raised in this loop
                time.sleep(0.01)
