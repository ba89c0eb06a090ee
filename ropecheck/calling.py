"""Calling a target safely: a time limit, exceptions turned into findings, and the
contract checked on every call (tensor out, x's shape and dtype, input untouched,
finite output for finite input)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager

import torch

DEFAULT_TIMEOUT = 20.0
HARD_KILL_GRACE = 10.0


class TargetHung(BaseException):
    """A call did not return within the time limit. A BaseException so that neither the
    target's own ``except Exception`` nor hypothesis' shrinking swallows it."""

    def __init__(self, seconds: float, message: str = ""):
        super().__init__(message or f"the target did not return within {seconds:g} s")
        self.seconds = seconds


class CallError(Exception):
    """The target broke the call contract: it raised, or returned something unusable."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class _Watchdog:
    """Ends the process when a call is stuck in native code, where SIGALRM cannot reach."""

    def __init__(self):
        self.deadline = None
        self.thread = None

    def arm(self, seconds: float):
        self.deadline = time.monotonic() + seconds + HARD_KILL_GRACE
        self.limit = seconds
        if self.thread is None:
            self.thread = threading.Thread(target=self._watch, daemon=True, name="ropecheck-watchdog")
            self.thread.start()

    def disarm(self):
        self.deadline = None

    def _watch(self):
        while True:
            time.sleep(0.5)
            if self.deadline is not None and time.monotonic() > self.deadline:
                sys.stderr.write(f"\nropecheck: the target did not return within {self.limit:g} s "
                                 "and cannot be interrupted (stuck in native code); giving up.\n")
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


def describe_exception(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def strided_copy(x: torch.Tensor) -> torch.Tensor:
    """A fresh tensor with x's values *and* x's strides (clone() would compact a view)."""
    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    return out.copy_(x)


class Caller:
    """Calls ``target(x, positions)`` under the contract. Every check goes through it."""

    def __init__(self, target, timeout: float | None = DEFAULT_TIMEOUT):
        self.target = target
        self.timeout = timeout

    def _invoke(self, x, positions):
        with time_limit(self.timeout):
            try:
                return self.target(x, positions)
            except TargetHung:
                raise
            except Exception as exc:  # the target's failure is a finding, not our crash
                raise CallError("raised", f"the target raised {describe_exception(exc)}") from None

    def _validate(self, y, x):
        if not isinstance(y, torch.Tensor):
            raise CallError("type", f"the target returned {type(y).__name__}, expected a torch.Tensor")
        if tuple(y.shape) != tuple(x.shape):
            raise CallError("shape", f"output shape {tuple(y.shape)} differs from input shape "
                                     f"{tuple(x.shape)}")
        if y.dtype != x.dtype:
            raise CallError("dtype", f"output dtype {y.dtype} differs from input dtype {x.dtype}")
        if y.device != x.device:
            raise CallError("device", f"output on {y.device}, input on {x.device}")
        if not bool(torch.isfinite(y).all()):
            bad = torch.nonzero(~torch.isfinite(y))[0].tolist()
            raise CallError("non-finite", f"non-finite output {y[tuple(bad)].item()} at index "
                                          f"{tuple(bad)} for finite input")

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """y = f(x, positions); x and positions are passed as copies and checked after."""
        arg, pos = strided_copy(x), positions.clone()
        y = self._invoke(arg, pos)
        self._validate(y, x)
        if not torch.equal(pos, positions):
            raise CallError("mutated", "the target modified its positions argument")
        if self.target.inplace:
            if not torch.equal(arg, y):
                raise CallError("inplace", "declared in-place, but the input does not hold the output")
        elif not torch.equal(arg, x):
            changed = torch.nonzero(arg != x)
            raise CallError("mutated", f"the target modified its input x in place ({len(changed)} "
                                       f"elements changed, first at {tuple(changed[0].tolist())})")
        return y.detach()

    def vjp(self, x: torch.Tensor, positions: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """The vector-Jacobian product g^T df/dx at x, through the target's autograd."""
        leaf = x.detach().clone().requires_grad_(True)
        arg = leaf.clone() if self.target.inplace else leaf
        y = self._invoke(arg, positions.clone())
        self._validate(y.detach(), x)
        if not y.requires_grad:
            raise CallError("backward", "the output does not require grad: autograd does not "
                                        "flow through the target (declare --no-backward)")
        with time_limit(self.timeout):
            try:
                (g,) = torch.autograd.grad(y, leaf, grad.to(y.dtype), allow_unused=True)
            except TargetHung:
                raise
            except Exception as exc:
                raise CallError("backward", f"backward raised {describe_exception(exc)}") from None
        if g is None:
            raise CallError("backward", "backward returned no gradient for x")
        self._validate(g, x)
        return g.detach()
