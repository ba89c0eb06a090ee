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

ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the ropecheck package
COMMANDS_WITH_A_WORKER = ("check", "identify")


class Started(NamedTuple):
    proc: subprocess.Popen
    conn: Connection
    crash_log: str  # where faulthandler writes the Python stack of a crash


def start(preload: tuple = ()) -> Started:
    """A fresh interpreter serving calls (``worker.serve``) on one end of a socket pair;
    it imports the modules ``preload`` names and waits for its target."""
    ours, theirs = socket.socketpair()
    handle, crash_log = tempfile.mkstemp(prefix="ropecheck-worker-", suffix=".log")
    os.close(handle)
    code = (
        f"import sys; sys.path.insert(0, {ROOT!r}); from ropecheck.calling.worker import serve; "
        f"serve({theirs.fileno()}, {crash_log!r}, {tuple(preload)!r})"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
    theirs.close()
    return Started(proc, Connection(ours.detach()), crash_log)


_spare: Optional[Started] = None


def prestart(argv: list, preload: tuple = ()) -> None:
    """Start the first worker now if this command line will want one (``check`` or
    ``identify`` without ``--in-process`` or ``--help``), importing ``preload`` (the
    loaders) while ropecheck starts up."""
    global _spare
    words = [word for word in argv if not word.startswith("-")]
    if words and words[0] in COMMANDS_WITH_A_WORKER and "--in-process" not in argv and not {"-h", "--help"} & set(argv):
        try:
            _spare = start(preload)
        except OSError:  # no process to spare now: the run starts its worker when it needs it
            _spare = None


def take() -> Started:
    """The started worker if there is one, else a new one."""
    global _spare
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
