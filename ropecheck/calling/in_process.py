"""Calling a target in ropecheck's own process (``--in-process``, and targets given as Python
objects): the call runs here (``ropecheck.calling.execution``) under a time limit that
interrupts Python code (SIGALRM), and a last-resort watchdog ends the process when the
interrupt cannot stop the call.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Callable

from ropecheck.calling import modes, quiet
from ropecheck.calling.execution import Execution, Outcome, Request
from ropecheck.calling.timed import Timed, TimeRequest
from ropecheck.properties.core.contract import TargetHung

HARD_KILL_GRACE = 10.0


_abort_hooks: list[Callable[[str], None]] = []


def on_abort(hook: Callable[[str], None]) -> None:
    """Run ``hook(reason)`` before the watchdog ends the process (write the JSON, say)."""
    _abort_hooks.append(hook)


class _Watchdog:
    """Ends the process when an in-process call outlives its time limit and the interrupt
    cannot stop it: the call swallowed it (Python code catching BaseException) or never
    saw it (native code, where SIGALRM cannot reach)."""

    def __init__(self):
        self.deadline = None
        self.thread = None
        self.fired = False
        self.limit = 0.0

    def arm(self, seconds: float):
        self.deadline = time.monotonic() + seconds + HARD_KILL_GRACE
        self.limit, self.fired = seconds, False
        if self.thread is None:
            self.thread = threading.Thread(target=self._watch, daemon=True, name="ropecheck-watchdog")
            self.thread.start()

    def disarm(self):
        self.deadline = None

    def _watch(self):
        while True:
            time.sleep(0.5)
            if self.deadline is not None and time.monotonic() > self.deadline:
                how = (
                    "it caught the interrupt and went on"
                    if self.fired
                    else "it is stuck in native code, where the interrupt cannot reach it"
                )
                reason = (
                    f"the target did not return within {self.limit:g} s and could not be "
                    f"stopped in this process ({how}); run without --in-process to "
                    "isolate it in a worker process"
                )
                for hook in _abort_hooks:
                    try:
                        hook(reason)
                    except Exception:
                        pass
                terminal = quiet.terminal_stderr()
                terminal.write(f"\nropecheck: {reason}; giving up.\n")
                terminal.flush()
                os._exit(2)


_watchdog = _Watchdog()


@contextmanager
def time_limit(seconds: float | None):
    """Raise TargetHung in the calling (main) thread after ``seconds``."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        _watchdog.fired = True
        raise TargetHung(seconds)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    _watchdog.arm(seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _watchdog.disarm()


class InProcess:
    """Executes calls in this process (an ``Executor``: ``ropecheck.calling.caller``)."""

    def __init__(self, fn: Callable):
        self.execution = Execution(fn)
        self.state_changes: list = []

    def run(self, request: Request) -> Outcome:
        with time_limit(request.timeout), quiet.captured():
            outcome = self.execution.run(request)
        self.state_changes += [c for c in outcome.state_changes if c not in self.state_changes]
        modes.record_notes(outcome.notes)
        return outcome

    def time(self, request: TimeRequest) -> Timed:
        with time_limit(request.timeout), quiet.captured():
            return self.execution.time(request)

    def close(self) -> None:
        self.execution.timing.close()
