"""A run's checks shared between two processes: ropecheck and a helper that runs the same
session (``ropecheck.session.helper``). Each check (a property in a dtype and a mode) is a
numbered row; each process takes the next row nobody has taken, through a small file both
lock (``SharedRows``), so that the two stay busy to the end whatever each check costs.

``Share`` is what ``Session.run`` is given: the rows, and how results cross between the
two processes. The leading process (ropecheck's own) records the position-range probes,
gathers the helper's results as they arrive and, if the helper dies, runs the rows it took
and did not finish.
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterable, Optional

from ropecheck.properties.runner import Result


class SharedRows:
    """Rows 0 .. count - 1 handed out once each, to whichever process asks first; and why
    the run stopped (a hang: no row is handed out after it), if it did. The file holds a
    byte per row (1: taken) and then the reason."""

    def __init__(self, path: str, count: int):
        self.path, self.count = path, count
        self.fd = os.open(path, os.O_RDWR)

    @classmethod
    def create(cls, count: int) -> "SharedRows":
        handle, path = tempfile.mkstemp(prefix="ropecheck-rows-")
        os.write(handle, bytes(count))
        os.close(handle)
        return cls(path, count)

    def _locked(self, change=None) -> tuple[bytearray, str]:
        import fcntl  # Unix, as the zygote a helper is forked from: never imported without one

        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            data = os.pread(self.fd, self.count + 4096, 0)
            taken, stopped = bytearray(data[: self.count]), data[self.count :].decode()
            if change is not None:
                taken, stopped = change(taken, stopped)
                os.pwrite(self.fd, bytes(taken) + stopped.encode(), 0)
            return taken, stopped
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def claim(self, order: Iterable[int]) -> Optional[int]:
        """The first row of ``order`` nobody has taken (now this process's), or None: all
        taken, or the run stopped."""
        claimed: list = []

        def take(taken: bytearray, stopped: str) -> tuple[bytearray, str]:
            if not stopped:
                free = next((i for i in order if not taken[i]), None)
                if free is not None:
                    taken[free] = 1
                    claimed.append(free)
            return taken, stopped

        self._locked(take)
        return claimed[0] if claimed else None

    def stop(self, why: str) -> None:
        """No more rows for anyone: ``why`` (the first reason given stays)."""
        self._locked(lambda taken, stopped: (taken, stopped or why))

    @property
    def taken(self) -> list[int]:
        """The rows taken so far, by either process."""
        return [i for i, flag in enumerate(self._locked()[0]) if flag]

    @property
    def stopped(self) -> str:
        return self._locked()[1]

    def close(self, remove: bool = False) -> None:
        os.close(self.fd)
        if remove:
            os.unlink(self.path)


class Share:
    """The rows of a run, as ``Session.run`` shares them; this base is the helper's side
    with nowhere to send results (a subclass sends them, or gathers them)."""

    leads = False  # the leading process records the probes and finishes what the helper left

    def __init__(self, rows: SharedRows, order: list[int]):
        self.rows = rows
        self.order = order  # the rows this process takes, in the order it takes them

    def finished(self, index: int, result: Result) -> None:
        """Row ``index`` ran here, with this result."""

    def arrived(self) -> list:
        """(index, Result) of the rows finished in the other process since the last look."""
        return []

    def close(self) -> None:
        """After the run (or an early end): the rows let go of (the leader's file removed)."""
        self.rows.close(remove=self.leads)

    def end(self) -> list:
        """Wait for the other process to finish; (index, Result) of what arrived since the
        last look. Afterwards, the rows taken and not finished are the leader's."""
        return []
