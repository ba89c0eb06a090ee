"""Calling a target under the contract, from ropecheck's side.

A :class:`Caller` hands each call to the target's executor (its worker process, or this
process with ``--in-process``: ``ropecheck.execution`` runs the call the same way in
both) and checks what comes back: a tensor, x's shape, dtype and device, finite for
finite input, inputs untouched. Any breach is a :class:`CallError` (a finding about the
target); a call that does not return in time is :class:`TargetHung`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Optional

import torch

from ropecheck.call_forms import Form, mismatch
from ropecheck.execution import Execution, Outcome, describe_exception, strided_copy  # noqa: F401

DEFAULT_TIMEOUT = 20.0
HARD_KILL_GRACE = 10.0


class TargetHung(BaseException):
    """A call did not return within the time limit. A BaseException so that neither the
    target's own ``except Exception`` nor hypothesis' shrinking swallows it."""

    def __init__(self, seconds: float, message: str = ""):
        super().__init__(message or f"the target did not return within {seconds:g} s")
        self.seconds = seconds


class CallError(Exception):
    """The target broke the call contract: it raised, crashed, or returned something unusable."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# --- in-process execution: SIGALRM and a last-resort watchdog --------------------------

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
                how = ("it caught the interrupt and went on" if self.fired else
                       "it is stuck in native code, where the interrupt cannot reach it")
                reason = (f"the target did not return within {self.limit:g} s and could not be "
                          f"stopped in this process ({how}); run without --in-process to "
                          "isolate it in a worker process")
                for hook in _abort_hooks:
                    try:
                        hook(reason)
                    except Exception:
                        pass
                sys.stderr.write(f"\nropecheck: {reason}; giving up.\n")
                sys.stderr.flush()
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
    """Executes calls in this process (``--in-process``, and targets built in Python)."""

    def __init__(self, fn: Callable):
        self.execution = Execution(fn)
        self.state_changes: list = []

    def run(self, op: str, args: tuple, positions, grads=None, inplace: bool = False,
            timeout: Optional[float] = None, form=None, device: str = "cpu", mode: str = "eager") -> Outcome:
        with time_limit(timeout):
            outcome = self.execution.run(op, args, positions, grads, inplace, form, device, mode)
        self.state_changes += [c for c in outcome.state_changes if c not in self.state_changes]
        return outcome

    def close(self):
        pass


class PlainCaller:
    """Calls a target that takes no tensors (a position builder) in its executor, within
    the time limit: its result as it came, or CallError when it raised, exited or crashed
    its process."""

    def __init__(self, executor, timeout: float | None = DEFAULT_TIMEOUT):
        self.executor, self.timeout = executor, timeout

    def __call__(self, *args):
        outcome = self.executor.run("plain", args, None, timeout=self.timeout)
        if outcome.error is not None:
            raise CallError(*outcome.error)
        return outcome.outputs


def executor_of(target):
    """The target's executor: its worker when it has one, else this process."""
    return getattr(target, "executor", None) or InProcess(target.fn)


# --- the contract ------------------------------------------------------------------------

def validate(y, x: torch.Tensor) -> None:
    """y has x's shape, dtype and device and is finite (x is finite)."""
    problem = mismatch(y, x)
    if problem:
        raise CallError(*problem)
    if not bool(torch.isfinite(y).all()):
        bad = torch.nonzero(~torch.isfinite(y))[0].tolist()
        raise CallError("non-finite", f"non-finite output {y[tuple(bad)].item()} at index "
                                      f"{tuple(bad)} for finite input")


def raise_violations(outcome: Outcome) -> None:
    for kind, message in outcome.violations:
        raise CallError(kind, message)


class Caller:
    """Calls ``target(x, positions)`` under the contract, in the target's call form
    (``ropecheck.call_forms``). Every check goes through it. ``case`` is the input being
    checked: its q/k split and sequence lengths shape the calls made on its tensors."""

    def __init__(self, target, timeout: float | None = DEFAULT_TIMEOUT):
        self.target = target
        self.timeout = timeout
        self.executor = executor_of(target)
        self.call = getattr(target, "call", "x")
        self.device = getattr(target, "device", "cpu")  # where the inputs are made (--device)
        self.mode = getattr(target, "mode", "eager")  # how the target is run (--mode)
        self.case = None

    def form(self, x: torch.Tensor, case=None) -> Optional[Form]:
        """How a call on x goes to the target: the case's split where x is the case's
        whole input, else the form's default (``Form``)."""
        if self.call == "x":
            return None
        case = case or self.case
        whole = case is not None and getattr(case, "call", "x") == self.call
        if self.call == "qk":
            fits = whole and case.heads + case.k_heads == x.shape[2]
            return Form("qk", case.heads if fits else None, separate=bool(whole and case.separate))
        fits = whole and x.shape[0] == 1 and sum(case.lengths) == x.shape[1]
        return Form("packed", lengths=case.lengths if fits else ())

    @property
    def state_changes(self) -> list:
        """Process-wide state the target changed in any call so far (each restored)."""
        return self.executor.state_changes

    def outcome(self, op: str, args: tuple, positions: torch.Tensor, grads=None, case=None) -> Outcome:
        form = self.form(args[0], case)
        outcome = self.executor.run(op, args, positions, grads, getattr(self.target, "inplace", False),
                                    self.timeout, form=form, device=self.device, mode=self.mode)
        if outcome.error is not None:
            raise CallError(*outcome.error)
        return outcome

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, case=None) -> torch.Tensor:
        """y = f(x, positions); the target works on copies, checked afterwards."""
        outcome = self.outcome("call", (x,), positions, case=case)
        if not isinstance(outcome.outputs, torch.Tensor):
            raise CallError("type", f"the target returned {outcome.returned}, expected a torch.Tensor")
        validate(outcome.outputs, x)
        raise_violations(outcome)
        return outcome.outputs

    def vjp(self, x: torch.Tensor, positions: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """The vector-Jacobian product g^T df/dx at x, through the target's autograd; the
        incoming gradient stays the caller's (a backward writing into it is a finding)."""
        outcome = self.outcome("vjp", (x,), positions, (grad,))
        if outcome.outputs is None:
            raise CallError("type", f"the target returned {outcome.returned}, expected a torch.Tensor")
        y, g = outcome.outputs
        validate(y, x)
        if g is None:
            raise CallError("backward", "backward returned no gradient for x")
        validate(g, x)
        raise_violations(outcome)
        return g
