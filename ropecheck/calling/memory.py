"""How the processes ropecheck owns (the ``ropecheck`` command and its workers) get their
memory: freed memory is kept for the next allocation instead of handed back to the kernel.

glibc's malloc serves an allocation above its mmap threshold (at most 32 MiB) with a fresh
``mmap`` and unmaps it when freed, so every large tensor of a call (the inputs of the
production profile are hundreds of MiB in float64) costs page faults on each touch:
``--profile production --dtype float32`` spent 36.8 s of its 60.5 s in the kernel. With
mmap off for malloc and no trimming, the heap keeps what was freed and the next call
reuses it (the same run: 8.1 s of system time, 33.7 s wall). Peak memory is unchanged;
the process keeps its peak until it ends. Only glibc has ``mallopt``: elsewhere nothing
changes. A user's own process (``ropecheck.check`` in-process, the pytest plugin) is left
as it is.

The same processes keep the garbage collector off while they import (``importing``):
torch and the modules make few cycles, and the collector's passes over every object they
create cost the ci verdict 0.15 s of its 2.8 s. What was imported is then frozen (left out
of every later pass: a full pass over torch's objects took about 0.04 s, five of them in a
verdict) and the collector runs again for the calls, which do make garbage.
"""

from __future__ import annotations

import ctypes
import gc
from contextlib import contextmanager
from typing import Iterator

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # bytes of free memory at the heap's top before it is given back (an int)


def keep_freed_memory() -> bool:
    """Whether malloc now keeps freed memory in this process (False: not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))


@contextmanager
def importing() -> Iterator[None]:
    """No garbage collection inside; at its end, everything that exists is frozen (never
    collected, never scanned again) and collection is on."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
