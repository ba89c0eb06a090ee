"""What a target's code prints stays out of ropecheck's output.

Libraries print and warn when they are imported or called (torchao's "Skipping import of
cpp extensions ..." when torchtune is imported, deprecation warnings, a kernel's debug
prints); in ropecheck's table or messages that is noise. So the target's output is
captured where it runs:

- a worker process (``ropecheck.calling.spawn``) writes its stdout and stderr, file
  descriptors included (what C code prints), to a log file of its own; when the process
  dies, the last lines of that log are part of the crash's message (``tail``);
- in ropecheck's own process (``--in-process``, Python objects), loading the target and
  each call run under ``captured()``: sys.stdout and sys.stderr (logging's handlers
  included) go to a buffer and warnings are recorded, then dropped.

``--debug`` shows them (``show(True)``): the worker writes to ropecheck's terminal and
nothing is captured here.
"""

from __future__ import annotations

import io
import sys
import warnings
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

_show = False
_terminal: list = []  # the stderr in use when a capture began (innermost last)


def show(on: bool) -> None:
    """Whether the target's output reaches ropecheck's terminal (``--debug``)."""
    global _show
    _show = bool(on)


def showing() -> bool:
    return _show


@contextmanager
def captured():
    """Run the target's code with its Python-level output and warnings captured (unless
    ``show``)."""
    if _show:
        yield
        return
    buffer = io.StringIO()
    _terminal.append(sys.stderr)
    try:
        with warnings.catch_warnings(record=True), redirect_stdout(buffer), redirect_stderr(buffer):
            warnings.simplefilter("always")
            yield
    finally:
        _terminal.pop()


def terminal_stderr():
    """The stderr ropecheck's own messages go to, even while a call's output is captured."""
    return _terminal[0] if _terminal else sys.stderr


def tail(log: str | None, lines: int = 3, width: int = 300) -> str:
    """The last ``lines`` non-empty lines a worker wrote to its log ("" if none)."""
    if log is None:
        return ""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return ""
    last = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(line[:width] for line in last)
