"""Helpers: processes that run part of a session's checks beside ropecheck (``--jobs``).

A check spends its time in two processes that take turns, ropecheck (drawing inputs,
computing the float64 reference, judging) and the target's worker (the calls): one core
busy at a time. A helper is a second such pair. It is forked from the zygote (torch and
the loaders already imported), prepares the same session from the same options and seed
(its own worker, loaded and warmed up in every dtype as ropecheck's was) and takes checks
from the rows it shares with ropecheck (``ropecheck.session.sharing``): each check runs
once, in one of the two, with the inputs its seed draws there as here. Its results come
back over a socket as they finish; ropecheck records them, and the position-range probes.

A helper is used where it pays and changes nothing else: the ``ropecheck`` command (its
zygote), a target in a worker (the helper loads its own), on the CPU (a GPU is one per
machine), no compute-sanitizer, two cores or more. It takes eager checks only: a compiled
model is one per process, so the checks of a compiling mode stay in ropecheck's process,
which takes them first. While one runs, no process of the run polls awake for an answer
(``worker.spin``): four processes share the cores.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Optional

import torch

from ropecheck.calling import memory, quiet, spawn, worker
from ropecheck.session.options import Options
from ropecheck.session.prepare import prepare
from ropecheck.session.session import Session
from ropecheck.session.sharing import Share, SharedRows

ENTRY = "ropecheck.session.helper:serve"
DEFAULT_JOBS = 2  # processes the command shares a run among unless --jobs says otherwise
LOADERS = ("ropecheck.session.loading",)  # what a helper's workers import before their target
SPIN_ALONE = worker.SPIN  # how long this process polls awake when no helper runs
EXIT_WAIT = 5.0  # seconds a helper that is done has to stop its worker and end, before it is killed


# The modes a helper runs checks in: a compiled model (or a CUDA graph) is one per process,
# so those checks stay in ropecheck's process, which takes them first.
HELPER_MODES = ("eager",)


def shared_rows(session: Session) -> list[int]:
    """The rows (``session.checks``) a helper may take, in a run's order."""
    return [i for i, (_, mode, _) in enumerate(session.checks) if mode in HELPER_MODES]


def leader_rows(session: Session) -> list[int]:
    """ropecheck's order: the rows only it runs, then the shared ones in a run's order. So
    the checks it runs see the calls they see in a run alone: a target that keeps state
    from call to call (a cache, a dynamic rescaling) meets each of them in the state it
    would be in without a helper."""
    shared = shared_rows(session)
    return [i for i in range(len(session.checks)) if i not in shared] + shared


def helper_rows(session: Session) -> list[int]:
    """A helper's order: the shared rows from the last one back, so that the two meet in
    the middle and only the rows past that point see another history."""
    return shared_rows(session)[::-1]


def jobs_for(session: Session) -> int:
    """Processes ``session``'s checks are shared among: --jobs, or DEFAULT_JOBS (the
    command line's option; the other front doors run alone); 1 where a helper cannot run
    the session as ropecheck does."""
    options = session.options
    if options is None:
        return 1
    jobs = options.get("jobs") or (min(DEFAULT_JOBS, worker.cores()) if options.door == "cli" else 1)
    shareable = (
        isinstance(options.target, (str, type(None)))  # a helper loads it by name
        and session.target.executor is not None  # a worker, not this process
        and session.target.device == "cpu"
        and not options.sanitize
        and len(shared_rows(session)) > 1
    )
    return jobs if shareable else 1


@dataclass(frozen=True)
class Job:
    """What a helper needs: ropecheck's sys.path, the options (as Options' parts), the
    session's seed, the shared rows and the checks they number ((dtype, mode, property))."""

    path: list
    options: tuple
    seed: Optional[int]
    rows: str
    checks: tuple
    jobs: int


def named(session: Session) -> tuple:
    """``session.checks`` as (dtype, mode, property name)."""
    return tuple((dtype, mode, prop.name) for dtype, mode, prop in session.checks)


class Leading(Share):
    """ropecheck's side: the helpers' results as they arrive, the rows they left."""

    leads = True

    def __init__(self, rows: SharedRows, order: list[int], helpers: list, jobs: int):
        super().__init__(rows, order)
        self.helpers = helpers  # spawn.Started, each sent its Job
        self.failures: list = []  # the tracebacks of helpers that failed (shown with --debug)
        self.threads = torch.get_num_threads()  # this process's own, given back at the end
        share_cores(jobs)

    def _read(self, helper: spawn.Started, block: bool) -> tuple[list, bool]:
        """(index, Result) of what ``helper`` sent; whether it is done."""
        arrived: list = []
        try:
            while block or helper.conn.poll(0):
                message = pickle.loads(helper.conn.recv_bytes())
                if message[0] == "result":
                    arrived.append(message[1:])
                else:  # ("done",) or ("failed", traceback)
                    if message[0] == "failed":
                        self.failures.append(message[1])
                    return arrived, True
        except (EOFError, OSError, pickle.UnpicklingError):  # it died: its rows are the leader's
            return arrived, True
        return arrived, False

    def arrived(self) -> list:
        out: list = []
        for helper in list(self.helpers):
            arrived, done = self._read(helper, block=False)
            out += arrived
            if done:
                self._end(helper)
        return out

    def end(self) -> list:
        out: list = []
        for helper in list(self.helpers):
            out += self._read(helper, block=True)[0]
            self._end(helper)
        if quiet.showing():
            for failure in self.failures:
                print(f"ropecheck: a helper process failed; its checks ran here:\n{failure}", file=sys.stderr)
        return out

    def _end(self, helper: spawn.Started, wait: float = EXIT_WAIT) -> None:
        self.helpers.remove(helper)
        try:
            helper.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        spawn.stop(helper)

    def close(self) -> None:
        """The helpers still running stopped (the run ended early: Ctrl-C, an error), this
        process alone on the cores again."""
        for helper in list(self.helpers):
            self._end(helper, wait=0)
        super().close()
        worker.spin(SPIN_ALONE)
        torch.set_num_threads(self.threads)


def share_cores(jobs: int) -> None:
    """This process as one of ``jobs`` sharing the cores: torch's threads, a share of the
    cores (its worker has its own, one fewer than the cores), and no polling awake."""
    torch.set_num_threads(max(1, worker.cores() // jobs))
    worker.spin(0.0)


def start(session: Session) -> Optional[Share]:
    """Helpers for ``session`` (``jobs_for`` - 1 of them), or None (no helper pays or starts)."""
    jobs = jobs_for(session)
    if jobs < 2:
        return None
    options = session.options
    assert options is not None  # jobs_for says 1 without options
    rows = SharedRows.create(len(session.checks))
    job = Job(
        list(sys.path),
        (options.command, dict(options), tuple(options.given), options.door),
        session.run_options.seed,
        rows.path,
        named(session),
        jobs,
    )
    try:
        sent = pickle.dumps(job)
    except Exception:  # an option value that cannot cross to another process
        rows.close(remove=True)
        return None
    helpers = []
    for _ in range(jobs - 1):
        started = spawn.fork(ENTRY)
        if started is None:
            break
        try:
            started.conn.send_bytes(sent)
        except OSError:
            spawn.stop(started)
            continue
        helpers.append(started)
    if not helpers:
        rows.close(remove=True)
        return None
    return Leading(rows, leader_rows(session), helpers, jobs)


class _Sending(Share):
    """A helper's side: each result sent to ropecheck as it finishes."""

    def __init__(self, rows: SharedRows, order: list[int], conn: Connection):
        super().__init__(rows, order)
        self.conn = conn

    def finished(self, index: int, result) -> None:
        self.conn.send_bytes(pickle.dumps(("result", index, result)))


def serve(fd: int, crash_log: str) -> None:
    """A helper's life (forked from the zygote): its Job, the session prepared as
    ropecheck's was, the checks it takes run and sent back, then its end."""
    spawn.die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is ropecheck's to handle
    faulthandler.enable(open(crash_log, "w"))
    conn = Connection(fd)
    session = None
    try:
        job: Job = pickle.loads(conn.recv_bytes())
        sys.path[:] = job.path
        with memory.importing():  # the zygote imported with the collector off
            spawn.fork_zygote(LOADERS)  # this helper's own workers fork from it (before torch runs here)
        share_cores(job.jobs)
        session = prepare(Options(*job.options), seed=job.seed)
        checks = named(session)
        if checks != job.checks:  # its warm-up found other dtypes callable: rows would differ
            raise RuntimeError(f"the helper's checks differ from ropecheck's: {checks} != {job.checks}")
        session.run(share=_Sending(SharedRows(job.rows, len(job.checks)), helper_rows(session), conn))
        conn.send_bytes(pickle.dumps(("done",)))
    except BaseException:
        try:
            conn.send_bytes(pickle.dumps(("failed", traceback.format_exc())))
        except OSError:
            pass
    finally:
        if session is not None:
            session.close()
        os._exit(0)
