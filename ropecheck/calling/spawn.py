"""Starting worker interpreters (``ropecheck.calling.worker`` runs in them).

Nothing here imports torch: the ``ropecheck`` command starts its first worker before it
imports torch and the checks, so the worker's start-up (an interpreter, torch, the
loaders: about a second) overlaps ropecheck's own instead of following it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import NamedTuple, Optional

from ropecheck.calling import sanitizer

ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the ropecheck package
COMMANDS_WITH_A_WORKER = ("check", "identify")


class Started(NamedTuple):
    proc: subprocess.Popen
    conn: Connection
    crash_log: str  # where faulthandler writes the Python stack of a crash
    sanitizer_log: Optional[str] = None  # where compute-sanitizer writes its reports (--sanitize)


def start(preload: tuple = (), sanitize: Optional[str] = None) -> Started:
    """A fresh interpreter serving calls (``worker.serve``) on one end of a socket pair;
    it imports the modules ``preload`` names and waits for its target. ``sanitize``: a
    compute-sanitizer tool (``ropecheck.calling.sanitizer``) the interpreter runs under,
    in a process group of its own (so that stopping it stops the sanitizer too)."""
    ours, theirs = socket.socketpair()
    handle, crash_log = tempfile.mkstemp(prefix="ropecheck-worker-", suffix=".log")
    os.close(handle)
    code = (
        f"import sys; sys.path.insert(0, {ROOT!r}); from ropecheck.calling.worker import serve; "
        f"serve({theirs.fileno()}, {crash_log!r}, {tuple(preload)!r})"
    )
    argv, env, log = [sys.executable, "-c", code], None, None
    if sanitize is not None:
        handle, log = tempfile.mkstemp(prefix="ropecheck-sanitizer-", suffix=".log")
        os.close(handle)
        argv, env = sanitizer.wrap(argv, sanitize, log_file=log), sanitizer.environment()
    proc = subprocess.Popen(
        argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env, start_new_session=sanitize is not None
    )
    theirs.close()
    return Started(proc, Connection(ours.detach()), crash_log, log)


_spare: Optional[Started] = None


def prestart(argv: list, preload: tuple = ()) -> None:
    """Start the first worker now if this command line will want one (``check`` or
    ``identify`` without ``--in-process`` or ``--help``), importing ``preload`` (the
    loaders) while ropecheck starts up."""
    global _spare
    words = [word for word in argv if not word.startswith("-")]
    wants = words and words[0] in COMMANDS_WITH_A_WORKER and "--in-process" not in argv
    sanitized = any(word == "--sanitize" or word.startswith("--sanitize=") for word in argv)
    if wants and not sanitized and not {"-h", "--help"} & set(argv):  # a sanitized worker starts when asked for
        try:
            _spare = start(preload)
        except OSError:  # no process to spare now: the run starts its worker when it needs it
            _spare = None


def take(sanitize: Optional[str] = None) -> Started:
    """The started worker if there is one (and no sanitizer is asked for), else a new one."""
    global _spare
    if sanitize is not None:
        return start(sanitize=sanitize)
    started, _spare = _spare, None
    return started or start()


def discard() -> None:
    """Stop the started worker nobody took (the run ended before loading a target)."""
    global _spare
    if _spare is not None:
        _spare.proc.kill()
        _spare.proc.wait()
        _spare.conn.close()
        Path(_spare.crash_log).unlink(missing_ok=True)
        _spare = None
