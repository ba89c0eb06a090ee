"""Timing a target's call where it runs (its worker, or ropecheck's process with
``--in-process``): the calling layer's side of ``ropecheck bench``.

A :class:`TimeRequest` names what is timed and keeps it prepared under its ``key`` for
the next blocks of samples:
- ``call``: the target's call as ``check`` makes it (the request's staged call,
  ``forms.drive``), prepared once per input set: private copies of the inputs made on the
  device, the stages run once with the target (the call recorded, its result not judged:
  that is the caller's, on its own call), then the recorded calls made again and again,
  nothing else in the timed region (no copies, no clones, no checks);
- ``copy``: a copy moving the same bytes on the same device (``timing.timers.copy_call``),
  the yardstick the call is compared with in the same run;
- ``empty``: the device's cheapest call, the launch time below which a call is
  launch-bound.
The timer (``ropecheck.timing.timers``) is the request's; the samples go back as a
:class:`Timed`. A request for a new row (the part of the key before ``|``) releases the
prepared subjects of the others (their input sets can be large).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ropecheck.calling.devices import Placement
from ropecheck.calling.forms import ReturnedWrong, record
from ropecheck.timing import timers

SUBJECTS = ("call", "copy", "empty")
TIMERS = ("cpu", "host", "cuda-cold", "cuda-graph")


class Unprepared(Exception):
    """A block asked for a call this process has not prepared (a new worker): the caller
    sends it again with its Request."""


@dataclass(frozen=True)
class TimeRequest:
    """``samples`` samples of ``subject`` with ``timer``, prepared under ``key`` (see the
    module's docstring). ``request``: the call (subject "call"), an ``execution.Request``, needed with
    the first block only (the inputs are not sent again);
    ``sets``: input sets a timer rotates through; ``moved_bytes``: the copy's bytes;
    ``threads``: the CPU timer's thread count (None: the process's); ``calls_per_graph``:
    calls captured in one CUDA graph; ``timeout``: seconds the whole block may take."""

    key: str
    subject: str
    timer: str
    samples: int
    request: Any = None  # an execution.Request (execution imports this module)
    sets: int = 1
    moved_bytes: int = 0
    device: str = "cpu"
    threads: Optional[int] = None
    calls_per_graph: int = 1
    timeout: Optional[float] = None

    @property
    def row(self) -> str:
        return self.key.split("|", 1)[0]


@dataclass
class Timed:
    """A block of samples (seconds per call), or ``error`` (kind, message) when preparing or
    calling failed; ``info``: what the timer saw (threads, target calls per timed call, the
    GPU's clock)."""

    samples: list = field(default_factory=list)
    error: Optional[tuple] = None
    info: dict = field(default_factory=dict)


def make_timer(request: TimeRequest) -> timers.Timer:
    """The request's timer (TIMERS)."""
    name = request.timer
    if name == "cpu":
        return timers.CpuTimer(threads=request.threads)
    if name == "host":
        cuda = request.device.startswith("cuda")
        return timers.HostTimer(sync=torch.cuda.synchronize if cuda else (lambda: None))
    if name == "cuda-cold":
        return timers.CudaColdTimer()
    if name == "cuda-graph":
        return timers.CudaGraphTimer(request.calls_per_graph)
    raise ValueError(f"unknown timer {name!r} (one of {', '.join(TIMERS)})")


def _replay(fn: Callable, made: list) -> Callable[[], object]:
    """The recorded calls of one input set, made again: one call, or each in turn."""
    if len(made) == 1:
        return functools.partial(fn, *made[0].args, **made[0].kwargs)

    def calls():
        for call in made:
            fn(*call.args, **call.kwargs)

    return calls


class Timing:
    """The subjects a process keeps prepared for timing, by key. ``stages(args, positions,
    form)`` and ``in_mode(mode)`` are the execution's (``execution.Execution``)."""

    def __init__(self, stages: Callable, in_mode: Callable):
        self.stages, self.in_mode = stages, in_mode
        self.prepared: dict = {}  # key -> (timer, info)

    def close(self) -> None:
        for timer, _ in self.prepared.values():
            timer.close()
        self.prepared.clear()

    def _calls(self, request: TimeRequest) -> tuple[list, dict]:
        if request.subject == "copy":
            return [timers.copy_call(request.moved_bytes, request.device) for _ in range(request.sets)], {}
        if request.subject == "empty":
            return [timers.empty_call(request.device)], {}
        call = request.request
        if call is None:
            raise Unprepared(request.key)
        place = Placement(call.device)
        fn = self.in_mode(call.mode)
        sets, per_call = [], 1
        for _ in range(request.sets):
            copies = tuple(place(a) for a in call.args)
            _, made = record(self.stages(copies, place(call.positions), call.form), fn)
            sets.append(_replay(fn, made))
            per_call = len(made)
        return sets, {"target_calls": per_call}

    def _prepare(self, request: TimeRequest):
        for key in [k for k in self.prepared if k.split("|", 1)[0] != request.row]:
            self.prepared.pop(key)[0].close()
        calls, info = self._calls(request)
        timer = make_timer(request)
        timer.prepare(calls)
        if request.timer == "cpu":
            info["threads"] = torch.get_num_threads()
        self.prepared[request.key] = (timer, info)
        return timer, info

    def run(self, request: TimeRequest) -> Timed:
        """A block of samples of the request's subject (prepared first where new)."""
        try:
            timer, info = self.prepared.get(request.key) or self._prepare(request)
        except Unprepared:
            return Timed(error=("unprepared", f"{request.key} is not prepared here: send its call"))
        except ReturnedWrong as wrong:
            return Timed(error=(wrong.kind, str(wrong)))
        except (Exception, SystemExit) as exc:
            return Timed(error=("raised", f"preparing the timed call raised {type(exc).__name__}: {exc}"))
        clock = timers.gpu_clock_mhz(request.device) if request.device.startswith("cuda") else None
        try:
            samples = [timer.sample() for _ in range(request.samples)]
        except (Exception, SystemExit) as exc:
            self.prepared.pop(request.key, None)
            return Timed(error=("raised", f"the timed call raised {type(exc).__name__}: {exc}"))
        info = dict(info)
        if clock is not None:
            info["clock_mhz"] = (clock, timers.gpu_clock_mhz(request.device))
        return Timed(samples, info=info)
