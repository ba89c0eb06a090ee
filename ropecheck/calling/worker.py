"""Crash isolation: the target lives in a worker process.

ropecheck (the parent) keeps the hypothesis engine, the float64 reference and the
reporting; the worker imports the target and runs each call on the tensors it is sent
(``ropecheck.execution``: private copies, state guard, exceptions as findings) and sends
back the outcome. What the target does to its process stays there:
- a crash (a signal such as SIGSEGV, ``os._exit``, a CUDA error that poisons the
  context) ends the worker, not ropecheck: the call reports "the target crashed the
  process (SIGSEGV) ..." and the next call starts a new worker;
- a call that does not return within the time limit is stopped by killing the worker
  (the parent's watchdog: nothing has to interrupt the target from inside);
- ``sys.exit`` is the call's error; threads the target leaves running die with the
  worker; process-wide state it changes is restored in the worker.

The worker is forked from a zygote (``ropecheck.calling.spawn``: a fork of ropecheck
made before it ran torch), else a fresh interpreter (``python -c``): forking a process
whose OpenMP pool has run deadlocks the child, and multiprocessing's spawn would re-import
the user's ``__main__``. It gets ropecheck's ``sys.path``, so it imports what the parent
would. Tensors travel by value with their strides and storage offsets
(:func:`dumps`), so a view arrives as the same view.
"""

from __future__ import annotations

import atexit
import faulthandler
import importlib
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import weakref
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable, Optional

import torch

from ropecheck.calling import memory, modes, quiet, sanitizer, sanitizer_reports, spawn
from ropecheck.calling.execution import Execution, Outcome, Request, describe_exception
from ropecheck.calling.messages import Call, Crashed, Done, Exit, Failed, Internal, Load, Loaded, Time, Warm, dumps
from ropecheck.calling.timed import Timed, TimeRequest
from ropecheck.properties.core.contract import CallError, TargetHung

LOAD_TIMEOUT = 600.0  # seconds to import and build a target (a library's import can be slow)
_CUDA_FAULT = re.compile(
    r"CUDA error|illegal memory access|device-side assert|cudaError|"
    r"unspecified launch failure",
    re.IGNORECASE,
)


# --- waiting for the other side ----------------------------------------------------------


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# Seconds each side polls without sleeping before it blocks. Waking a sleeping process
# costs about 50 us on the virtual machines CI runs on, a fifth of a small call's cost;
# with a core each (two or more), the two processes hand calls back and forth awake.
SPIN = 0.002 if cores() > 1 else 0.0


def spin(seconds: float) -> None:
    """How long this process, and from their next call the workers it calls, poll awake
    (SPIN): none while the run shares the cores with a helper (``ropecheck.session.helper``),
    whose processes would wait for the core a spinning one holds."""
    global SPIN
    SPIN = seconds


def spin_until_ready(conn: Connection, timeout: Optional[float], seconds: Optional[float] = None) -> bool:
    """conn.poll(timeout), polling without sleeping for the first ``seconds`` (SPIN)."""
    seconds = SPIN if seconds is None else seconds
    spin = seconds if timeout is None else min(seconds, timeout)
    end = time.perf_counter() + spin
    while time.perf_counter() < end:
        if conn.poll(0):
            return True
    return conn.poll(None if timeout is None else timeout - spin)


# --- the worker's side ---------------------------------------------------------------------


def serve(fd: int, crash_log: str, preload: tuple = ()) -> None:
    """The worker's loop: load the target, then run calls until told to stop (``Exit``, or
    ropecheck closing the connection). ``preload``: modules to import while waiting."""
    spawn.die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is ropecheck's to handle
    faulthandler.enable(open(crash_log, "w"))
    memory.keep_freed_memory()
    # One core stays ropecheck's: a thread of the worker's spinning there (OpenMP's
    # threads spin after a parallel region) slows down ropecheck's reference and next
    # draw; on two cores that was the larger part of the worker's cost per call.
    torch.set_num_threads(max(1, min(torch.get_num_threads(), cores() - 1)))
    for module in preload:  # the loaders ropecheck will ask for, imported while it starts up
        importlib.import_module(module)
    conn = Connection(fd)
    state: dict = {"execution": None, "spin": SPIN}

    def reply(message):
        try:
            try:
                data = dumps(message)
            except Exception as exc:  # an output that cannot be sent back
                data = dumps(Failed(f"the target's result cannot be sent back to ropecheck: {describe_exception(exc)}"))
            conn.send_bytes(data)
        except OSError:  # ropecheck is gone, or no longer wants this worker
            os._exit(0)

    def on_load(message: Load) -> bool:
        sys.path[:] = message.path
        try:
            with memory.importing():  # the target's imports; its calls then collect as usual
                fn, info = spawn.resolve(message.loader)(*message.args)
            state["execution"] = Execution(fn)
            reply(Loaded(info))
        except BaseException as exc:  # the loader's message, or whatever the import raised
            reply(
                Failed(
                    str(exc)
                    if type(exc).__name__ == "TargetLoadError"
                    else f"loading the target failed: {describe_exception(exc)}"
                )
            )
        return True

    def on_call(message: Call) -> bool:
        state["spin"] = message.spin
        try:
            outcome = state["execution"].run(message.request)
        except Exception as exc:  # ropecheck's code around the call (the target's errors are outcomes)
            reply(Internal(describe_exception(exc)))
            return True
        poisoned = outcome.error is not None and _CUDA_FAULT.search(outcome.error[1])
        if poisoned:
            outcome.error = (
                "crashed",
                f"{outcome.error[1]}: a CUDA error that poisons the process's CUDA context (the worker was restarted)",
            )
        reply(Done(outcome))
        return not poisoned

    def on_time(message: Time) -> bool:
        try:
            timed = state["execution"].time(message.request)
        except Exception as exc:  # ropecheck's code around the calls
            reply(Internal(describe_exception(exc)))
            return True
        poisoned = timed.error is not None and _CUDA_FAULT.search(timed.error[1])
        reply(timed)
        return not poisoned

    def on_warm(message: Warm) -> bool:
        with memory.importing():  # mostly imports (dynamo, inductor): frozen, as the target's are
            modes.warm_up(message.modes)
        return True

    handlers: dict[type, Callable[..., bool]] = {Warm: on_warm, Load: on_load, Call: on_call, Time: on_time}
    while True:
        try:
            spin_until_ready(conn, None, state["spin"])
            message = pickle.loads(conn.recv_bytes())
        except EOFError:
            break
        handler = handlers.get(type(message))
        if handler is None or not handler(message):
            break
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # threads the target left running do not keep the worker alive


# --- ropecheck's side ----------------------------------------------------------------------


def _death(returncode: Optional[int], sanitize: Optional[str] = None) -> str:
    if sanitize is not None and returncode == sanitizer.ERROR_EXITCODE:
        return (
            f"the target's process ended under compute-sanitizer {sanitize}, which found errors "
            f"(its error exit status {returncode})"
        )
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the target crashed the process ({name})"
    return f"the target ended the process (exit status {returncode}: os._exit or a native exit)"


def _crash_site(log_path: str) -> str:
    """The innermost Python frames of faulthandler's dump (most recent call first) that are
    not ropecheck's own: the target's, up to where ropecheck's calling layer called it (the
    frames past it are the worker's and, in a forked worker, the zygote's)."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return ""
    frames: list = []
    for file, line, func in re.findall(r'File "([^"]+)", line (\d+) in (\S+)', text):
        if not file.startswith(str(Path(__file__).parent)):
            frames.append(f"{file}:{line} in {func}")
        elif frames:
            break
    if not frames:
        return ""
    return f" at {frames[0]}" + (f", called from {frames[1]}" if len(frames) > 1 else "")


class WorkerError(Exception):
    """The worker could not load the target."""


class _Process:
    """One worker process: started at once, its target loading while ropecheck goes on."""

    def __init__(self, loader: str, args: tuple, sanitize: Optional[str] = None):
        self.proc, self.conn, self.crash_log, self.sanitizer_log, self.output_log = spawn.take(sanitize)
        self.sanitize, self.sanitizer_read = sanitize, 0  # bytes of the sanitizer's log read so far
        self.sanitizer_last: list = []  # the reports of a process that ended, read before its log went
        self.conn.send_bytes(dumps(Load(list(sys.path), loader, args)))

    def new_sanitizer_reports(self) -> list:
        """The compute-sanitizer reports written since the last look (--sanitize)."""
        reports, self.sanitizer_last = self.sanitizer_last, []
        if self.sanitizer_log is None:
            return reports
        try:
            with open(self.sanitizer_log, errors="replace") as log:
                log.seek(self.sanitizer_read)
                text = log.read()
        except OSError:
            return reports
        if self.alive:  # a report still being written waits for the next look
            text = text[: text.rfind("\n") + 1]
        self.sanitizer_read += len(text.encode())
        return reports + sanitizer_reports.parse(text, self.sanitize)

    def _kill(self) -> None:
        if self.sanitize is not None:  # the sanitizer and the interpreter under it: its process group
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        else:
            self.proc.kill()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def receive(self, timeout: Optional[float], during: str):
        """The next message; TargetHung after ``timeout`` (the process is killed); Crashed
        when the process died instead of answering."""
        try:
            ready = spin_until_ready(self.conn, timeout)
        except (OSError, EOFError):
            ready = True
        if not ready:
            self.stop(kill=True)
            assert timeout is not None  # no timeout: the wait ends only when a message is ready
            raise TargetHung(
                timeout, f"the target did not return within {timeout:g} s ({during}; its worker process was stopped)"
            )
        try:
            return pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            try:
                returncode = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                returncode = None
            why = _death(returncode, self.sanitize) + _crash_site(self.crash_log)
            printed = quiet.tail(self.output_log)
            why += f" (its last output: {printed})" if printed else ""
            # what the sanitizer saw before the end: its log goes with the process
            self.sanitizer_last = self.new_sanitizer_reports()
            self.stop(kill=True)
            return Crashed(f"{why} ({during})" if during.startswith("loading") else why)

    def stop(self, kill: bool = False) -> None:
        if kill and self.alive:
            self._kill()
        if not self.conn.closed:
            try:
                self.conn.send_bytes(dumps(Exit()))
            except OSError:
                pass
            self.conn.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._kill()
            self.proc.wait()
        for log in (self.crash_log, self.sanitizer_log, self.output_log):
            if log is not None:
                Path(log).unlink(missing_ok=True)


class Worker:
    """The target's worker: a process that loads it with ``loader(*args)`` (a
    'module:function' returning (callable, picklable description)) and runs its calls.
    Replaced on demand after a crash or a hang; once the target has crashed, a standby
    process is kept loading, so the next crash costs no start-up wait."""

    def __init__(
        self, loader: str, args: tuple = (), load_timeout: float = LOAD_TIMEOUT, sanitize: Optional[str] = None
    ):
        self.loader, self.args, self.load_timeout = loader, args, load_timeout
        self.sanitize = sanitize  # a compute-sanitizer tool every process of it runs under (--sanitize)
        self.current: Optional[_Process] = None
        self.standby: Optional[_Process] = None
        self.crashes = 0
        self.info = None
        self.state_changes: list = []  # every change the target made, over all calls
        _LIVE.add(self)

    def start(self):
        """Have a loaded process (the standby if there is one); returns the target's
        description. Raises WorkerError when it cannot be loaded (a crash included)."""
        if self.current is not None:
            self.current.stop(kill=True)
        self.current, self.standby = (self.standby or _Process(self.loader, self.args, self.sanitize)), None
        try:
            reply = self.current.receive(self.load_timeout, during="loading the target")
        except TargetHung:
            self.current = None
            raise WorkerError(f"loading the target did not finish within {self.load_timeout:g} s") from None
        if not isinstance(reply, Loaded):
            self.current.stop(kill=True)
            self.current = None
            raise WorkerError(reply.message)
        self.info = reply.info
        if self.crashes:
            self.standby = _Process(self.loader, self.args, self.sanitize)
        return self.info

    @property
    def function(self) -> RemoteFunction:
        return RemoteFunction(self)

    @property
    def alive(self) -> bool:
        return self.current is not None and self.current.alive

    def close(self) -> None:
        for process in (self.current, self.standby):
            if process is not None:
                process.stop()
        self.current = self.standby = None

    def _ready(self) -> Optional[str]:
        """A loaded process (a new one if a crash or a hang stopped the last), or why not."""
        if not self.alive:
            try:
                self.start()
            except WorkerError as exc:
                return f"restarting the target's worker failed: {exc}"
        return None

    def run(self, request: Request) -> Outcome:
        """One call in the worker (a new one first if a crash or hang stopped the last),
        within ``request.timeout``."""
        failed = self._ready()
        if failed:
            return Outcome(error=("crashed", failed))
        assert self.current is not None  # started by _ready
        self.current.conn.send_bytes(dumps(Call(request, SPIN)))
        reply = self.current.receive(request.timeout, during="during the call")
        if isinstance(reply, Failed):
            return Outcome(error=("type", reply.message))
        if isinstance(reply, Internal):  # as in-process: an internal error, not the target's
            raise RuntimeError(f"in the target's worker process: {reply.message}")
        outcome = Outcome(error=("crashed", reply.message)) if isinstance(reply, Crashed) else reply.outcome
        found = sanitizer_reports.findings(self.current.new_sanitizer_reports())
        if found:  # memory the kernels of this call read or wrote without owning it
            said = f"compute-sanitizer {self.sanitize}: " + sanitizer_reports.said(found)
            if outcome.error and outcome.error[0] == "crashed":  # the report is the cause: a
                # faulting kernel leaves CUDA's context unusable, and the process ends
                outcome.error = ("crashed", f"{said} (then {outcome.error[1]})")
            else:
                outcome.violations.append(("sanitizer", said))
        self.state_changes += [c for c in outcome.state_changes if c not in self.state_changes]
        modes.record_notes(outcome.notes)
        if outcome.error and outcome.error[0] == "crashed":
            self.crashes += 1
            self.current.stop(kill=True)
            self.current = None
            if self.standby is None:
                self.standby = _Process(self.loader, self.args, self.sanitize)
        return outcome

    def time(self, request: TimeRequest) -> Timed:
        """A block of timed samples in the worker (``ropecheck.calling.timed``), within
        ``request.timeout``; a crash is the block's error (the next block starts a new
        worker, which prepares its subjects again)."""
        failed = self._ready()
        if failed:
            return Timed(error=("crashed", failed))
        assert self.current is not None  # started by _ready
        self.current.conn.send_bytes(dumps(Time(request)))
        reply = self.current.receive(request.timeout, during="while timing the call")
        if isinstance(reply, Internal):
            raise RuntimeError(f"in the target's worker process: {reply.message}")
        if isinstance(reply, (Crashed, Failed)):
            self.current.stop(kill=True)
            self.current = None
            return Timed(error=("crashed", reply.message))
        return reply


class RemoteFunction:
    """The target's callable as seen from ropecheck: a plain call run in the worker
    (no contract checks: those are the Caller's)."""

    def __init__(self, worker: "Worker"):
        self.worker = worker

    def __call__(self, *args):
        *tensors, positions = args
        outcome = self.worker.run(Request("call", tuple(tensors), positions))
        if outcome.error is not None:
            raise CallError(*outcome.error)
        return outcome.outputs


_LIVE: "weakref.WeakSet[Worker]" = weakref.WeakSet()


@atexit.register
def close_all() -> None:
    """Stop every worker (at exit, and before an exit that skips atexit)."""
    for worker in list(_LIVE):
        worker.close()
    spawn.discard()
