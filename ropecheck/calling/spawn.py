"""Starting worker processes (``ropecheck.calling.worker`` runs in them).

A worker is forked from a zygote: a fork of ropecheck's own process made once, right after
it imported torch and the loaders and before it ran anything (``fork_zygote``: the
``ropecheck`` command, and the project's test session, make it first thing). The zygote
never runs torch, so its OpenMP pool never starts and forking it is safe (forking a
process whose pool has run deadlocks the child); a worker forked from it starts with
torch already imported, in milliseconds and without a second import's CPU (2.4 s on the
CI machine). The zygote reaps its workers and tells ropecheck how each one ended
(``Forked``: what ``subprocess.Popen`` tells of a child).

The pytest plugin forks one too where it can tell that nothing has run torch since its
import (``fork_zygote_if_unthreaded``). Without a zygote (a process that imported torch
and ran it before: ``ropecheck.check`` in a user's program, a pytest run whose conftest
ran torch), and for a worker under compute-sanitizer (which must exec it), a worker is a
fresh interpreter (``python -c``). Nothing here imports torch but ``prestart``, for the
zygote.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import NamedTuple, Optional

from ropecheck.calling import quiet, sanitizer

ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the ropecheck package
COMMANDS_WITH_A_WORKER = ("check", "identify", "report")
# The module whose ``serve`` a worker runs (named, not imported: it imports this one).
WORKER = "ropecheck.calling.worker"


def die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent dies (even by os._exit)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the parent closes the pipe, the worker sees EOF
        pass


class Started(NamedTuple):
    proc: "subprocess.Popen | Forked"
    conn: Connection
    crash_log: str  # where faulthandler writes the Python stack of a crash
    sanitizer_log: Optional[str] = None  # where compute-sanitizer writes its reports (--sanitize)
    output_log: Optional[str] = None  # where the worker's stdout and stderr go (None: the terminal, --debug)


def fork(entry: str) -> Optional[Started]:
    """A process forked from the zygote that runs ``entry`` ('module:function', called with
    the fd of its end of the connection and its crash log's path) in place of a worker's
    loop; None without a zygote. What it prints goes to a log file as a worker's does
    (to the terminal with --debug)."""
    if _zygote is None or not _zygote.alive():
        return None
    ours, theirs = socket.socketpair()
    handle, crash_log = tempfile.mkstemp(prefix="ropecheck-helper-", suffix=".log")
    os.close(handle)
    out, output = tempfile.mkstemp(prefix="ropecheck-output-", suffix=".log") if not quiet.showing() else (None, None)
    try:
        forked = _zygote.fork(theirs.fileno(), crash_log, out, entry)
    finally:
        if out is not None:
            os.close(out)
        theirs.close()
    if forked is None:
        ours.close()
        for log in (crash_log, output):
            if log is not None:
                Path(log).unlink(missing_ok=True)
        return None
    return Started(forked, Connection(ours.detach()), crash_log, None, output)


def start(preload: tuple = (), sanitize: Optional[str] = None) -> Started:
    """A process serving calls (``worker.serve``) on one end of a socket pair: forked from
    the zygote if there is one, else a fresh interpreter that imports the modules
    ``preload`` names and waits for its target. ``sanitize``: a compute-sanitizer tool
    (``ropecheck.calling.sanitizer``) the interpreter runs under, in a process group of its
    own (so that stopping it stops the sanitizer too). What the worker prints goes to a
    log file of its own unless ``quiet.showing()`` (--debug)."""
    ours, theirs = socket.socketpair()
    handle, crash_log = tempfile.mkstemp(prefix="ropecheck-worker-", suffix=".log")
    os.close(handle)
    if sanitize is None and _zygote is not None and _zygote.alive():
        output = None
        if not quiet.showing():
            handle, output = tempfile.mkstemp(prefix="ropecheck-output-", suffix=".log")
        try:
            forked = _zygote.fork(theirs.fileno(), crash_log, None if output is None else handle)
        finally:
            if output is not None:
                os.close(handle)
        if forked is not None:
            theirs.close()
            return Started(forked, Connection(ours.detach()), crash_log, None, output)
        if output is not None:
            Path(output).unlink(missing_ok=True)
    code = (
        f"import sys; sys.path.insert(0, {ROOT!r}); from {WORKER} import serve; "
        f"serve({theirs.fileno()}, {crash_log!r}, {tuple(preload)!r})"
    )
    argv, env, log = [sys.executable, "-c", code], None, None
    if sanitize is not None:
        handle, log = tempfile.mkstemp(prefix="ropecheck-sanitizer-", suffix=".log")
        os.close(handle)
        argv, env = sanitizer.wrap(argv, sanitize, log_file=log), sanitizer.environment()
    output = None
    if not quiet.showing():
        handle, output = tempfile.mkstemp(prefix="ropecheck-output-", suffix=".log")
    try:
        proc = subprocess.Popen(
            argv,
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=None if output is None else handle,
            stderr=None if output is None else handle,
            env=env,
            start_new_session=sanitize is not None,
        )
    finally:
        if output is not None:
            os.close(handle)
    theirs.close()
    return Started(proc, Connection(ours.detach()), crash_log, log, output)


# --- the zygote ------------------------------------------------------------------------


class Forked:
    """A worker forked from the zygote, as ``subprocess.Popen`` shows a child: ``pid``,
    ``poll``, ``wait``, ``kill``, ``returncode`` (the zygote, its parent, reaps it and says
    how it ended)."""

    def __init__(self, zygote: "Zygote", pid: int):
        self.zygote, self.pid = zygote, pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        return self.wait(0.0, raising=False)

    def wait(self, timeout: Optional[float] = None, raising: bool = True) -> Optional[int]:
        if self.returncode is None:
            self.returncode = self.zygote.status(self.pid, timeout)
            if self.returncode is None and raising:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# A zygote that does not answer within this many seconds is taken for dead: workers start
# as fresh interpreters from then on.
ZYGOTE_TIMEOUT = 30.0
# How often the zygote looks for ended workers while it waits for a request.
REAP_INTERVAL = 0.01
# A wait for a worker's end is answered as ended, or still running, after at most this.
STATUS_WAIT = 5.0


class Zygote:
    """ropecheck's side of the zygote: a fork of this process that forks workers on request
    (one SOCK_SEQPACKET socket: a request, with the worker's socket passed along, then
    its answer) and says how they ended."""

    def __init__(self, preload: tuple):
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # what exists now (torch, the modules) stays out of the garbage collector's sight on
        # both sides: its passes would write into every shared page and copy it
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # the zygote
            ours.close()
            code = 0
            try:
                _zygote_loop(theirs, preload)
            except BaseException:
                code = 1
            os._exit(code)
        theirs.close()
        self.pid, self.sock, self.lock = pid, ours, threading.Lock()
        self.dead = False
        atexit.register(self.end)

    def alive(self) -> bool:
        return not self.dead

    def _ask(self, request: tuple, fds: tuple = (), wait: float = ZYGOTE_TIMEOUT):
        with self.lock:
            try:
                socket.send_fds(self.sock, [pickle.dumps(request)], list(fds))
                ready, _, _ = select.select([self.sock], [], [], wait)
                if not ready:
                    raise OSError("the zygote did not answer")
                return pickle.loads(self.sock.recv(4096))
            except (OSError, EOFError, pickle.UnpicklingError):
                self.close()
                return None

    def fork(self, conn_fd: int, crash_log: str, output_fd: Optional[int], entry: str = "") -> Optional[Forked]:
        """A worker serving calls on ``conn_fd`` (None: the zygote is gone); ``entry``: a
        'module:function' the process runs instead of the worker's ``serve`` (it gets the
        same arguments: the connection's fd and the crash log's path)."""
        fds = (conn_fd,) if output_fd is None else (conn_fd, output_fd)
        pid = self._ask(("fork", crash_log, entry), fds)
        return None if pid is None else Forked(self, pid)

    def status(self, pid: int, timeout: Optional[float]) -> Optional[int]:
        """How worker ``pid`` ended (as Popen's returncode), waiting up to ``timeout``
        seconds (None: STATUS_WAIT at a time until it ends); None while it runs."""
        while True:
            wait = STATUS_WAIT if timeout is None else min(timeout, STATUS_WAIT)
            answer = self._ask(("status", pid, wait), wait=wait + ZYGOTE_TIMEOUT)
            if answer is None and self.dead:
                return -signal.SIGKILL  # the zygote died, and its workers with it
            if answer is not None or (timeout is not None and timeout <= STATUS_WAIT):
                return answer
            if timeout is not None:
                timeout -= STATUS_WAIT

    def close(self) -> None:
        self.dead = True
        try:
            self.sock.close()
        except OSError:
            pass

    def end(self, wait: float = 5.0) -> None:
        """Stop the zygote (its workers stopped first) and reap it: its CPU and its workers'
        then count as this process's children's, as a fresh interpreter's did."""
        self.close()
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid:
                return
            time.sleep(REAP_INTERVAL)


def resolve(entry: str):
    """The object a 'module:name' names (its module imported)."""
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


def _zygote_loop(sock: socket.socket, preload: tuple) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is ropecheck's to handle
    serve = importlib.import_module(WORKER).serve  # imported once here, for every worker forked

    for module in preload:
        importlib.import_module(module)
    running: set = set()  # the workers forked and not yet reaped
    ended: dict = {}  # pid -> how it ended, until ropecheck asks

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            running.discard(pid)
            ended[pid] = os.waitstatus_to_exitcode(status)

    while True:
        ready, _, _ = select.select([sock], [], [], REAP_INTERVAL)
        reap()
        if not ready:
            continue
        message, fds, _, _ = socket.recv_fds(sock, 4096, 2)
        if not message:  # ropecheck is done (or gone): its workers with it, reaped
            for pid in running:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            while True:
                try:
                    os.wait()
                except ChildProcessError:
                    return
        request = pickle.loads(message)
        if request[0] == "fork":
            pid = os.fork()
            if pid == 0:  # the worker
                sock.close()
                if len(fds) > 1:
                    os.dup2(fds[1], 1)
                    os.dup2(fds[1], 2)
                    os.close(fds[1])
                # print to the worker's fds 1 and 2, not to what this process's sys.stdout
                # was at the fork (a test session's capture, a buffer holding ropecheck's output)
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                code = 0
                try:
                    (resolve(request[2]) if request[2] else serve)(fds[0], request[1])
                except BaseException:  # escaped the worker's own handling: said in its output,
                    code = 1  # which ropecheck shows with the process's end ("its last output")
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            running.add(pid)
            for fd in fds:
                os.close(fd)
            sock.send(pickle.dumps(pid))
        elif request[0] == "status":
            _, pid, wait = request
            end = time.monotonic() + wait
            while pid not in ended and time.monotonic() < end:
                time.sleep(REAP_INTERVAL)
                reap()
            sock.send(pickle.dumps(ended.pop(pid, None)))


_zygote: Optional[Zygote] = None


def fork_zygote(preload: tuple = ()) -> None:
    """Fork the zygote now (once per process; a failed fork leaves workers to start as
    fresh interpreters). Call it only where this process has imported torch and not run
    it (no OpenMP pool yet): first thing in a command or a test session."""
    global _zygote
    if _zygote is None:
        try:
            _zygote = Zygote(preload)
        except (OSError, AttributeError):  # no fork, no fd passing (not a Unix)
            _zygote = None


def threads() -> int:
    """How many OS threads this process runs (Linux's /proc; 0 where it cannot be told)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def fork_zygote_if_unthreaded(baseline: int, preload: tuple = ()) -> None:
    """``fork_zygote``, in a process that may have run torch: only if it runs no more OS
    threads than ``baseline``, counted (``threads()``) right after it imported torch, before
    anything ran. Running torch starts OpenMP's pool (a thread per core), which a fork
    cannot take along (a worker forked past it would deadlock at its first parallel
    region); numpy's BLAS threads are there from the import on and survive a fork."""
    if _zygote is None and unthreaded_since(baseline):
        fork_zygote(preload)


def unthreaded_since(baseline: int) -> bool:
    """Whether this process runs no more OS threads than ``baseline`` (and can tell)."""
    return bool(baseline) and threads() == baseline


_spare: Optional[Started] = None


def prestart(argv: list, preload: tuple = ()) -> None:
    """If this command line will want a worker (``check``, ``identify`` or ``report``
    without ``--in-process``, ``--sanitize`` or ``--help``): import torch and ``preload``
    (the loaders), fork the zygote, and start the first worker from it now, its target
    loading while ropecheck's CLI imports (``report``: a worker per target, each forked)."""
    global _spare
    words = [word for word in argv if not word.startswith("-")]
    wants = words and words[0] in COMMANDS_WITH_A_WORKER and "--in-process" not in argv
    sanitized = any(word == "--sanitize" or word.startswith("--sanitize=") for word in argv)
    if wants and not sanitized and not {"-h", "--help"} & set(argv):  # a sanitized worker starts when asked for
        quiet.show("--debug" in argv)
        for module in ("torch", *preload):  # what every worker imports, imported once for all
            importlib.import_module(module)
        fork_zygote(preload)
        try:
            _spare = start(preload)
        except OSError:  # no process to spare now: the run starts its worker when it needs it
            _spare = None
        if _spare is not None:  # what the run's modes need, started while ropecheck starts up
            from ropecheck.calling import modes
            from ropecheck.calling.messages import Warm, dumps

            given = [b for a, b in zip(argv, argv[1:]) if a == "--mode"]
            given += [word.split("=", 1)[1] for word in argv if word.startswith("--mode=")]
            try:
                wanted = modes.parse(given)
            except ValueError:  # an unknown mode: the command line's to report
                return
            if "compile" in wanted:
                _spare.conn.send_bytes(dumps(Warm(tuple(wanted))))


def take(sanitize: Optional[str] = None) -> Started:
    """The started worker if there is one (and no sanitizer is asked for, and its output
    goes where ``quiet`` now says), else a new one."""
    global _spare
    if sanitize is not None:
        return start(sanitize=sanitize)
    started, _spare = _spare, None
    if started is not None and (started.output_log is None) != quiet.showing():
        stop(started)
        started = None
    return started or start()


def discard() -> None:
    """Stop the started worker nobody took (the run ended before loading a target)."""
    global _spare
    if _spare is not None:
        stop(_spare)
        _spare = None


def stop(started: Started) -> None:
    """Kill the process if it still runs, reap it, close its connection, remove its logs."""
    if started.proc.poll() is None:
        started.proc.kill()
    started.proc.wait()
    started.conn.close()
    for log in (started.crash_log, started.output_log):
        if log is not None:
            Path(log).unlink(missing_ok=True)
