"""The Triton kernels a call launched, each as the specialization a GPU compiles for it.

Triton compiles a ``@triton.jit`` kernel once per *specialization*: the dtypes of its
pointer arguments, whether each pointer's address and each integer are divisible by 16,
which integers equal 1, the value of every ``tl.constexpr`` and the launch options
(``num_warps``, ``enable_fp_fusion`` ...). A new one is a JIT compile, a second or more on
a GPU; a check that draws a new shape, stride or block size at every example pays it at
every example. This module names the specialization of each launch with Triton's own
binder (``create_function_from_signature``, the function ``JITFunction.run`` calls), made
for a CUDA target, so that the count is the same on a CPU running the Triton interpreter
as on the GPU: the tensors a call gets there have the same dtypes, strides and storage
offsets, and host and CUDA allocations are both aligned past 16 bytes.

While a :func:`recording` is open, every ``JITFunction.run`` (a compiled launch) and
``InterpretedFunction.run`` (``TRITON_INTERPRET=1``) in this process also records
``(kernel, key)`` and refuses a grid past CUDA's limits (``GridBeyondLimits``: the
interpreter would run it, a GPU fails it); on a CUDA device it counts the kernels Triton really compiled (its
kernel cache grew) and the seconds those launches took. Launches inside an autotuner or
heuristics wrapper are the kernel's own ``run`` calls and are counted alike. A target that
imports Triton only during its first call has that call's launches unrecorded (the hook
goes in when Triton is loaded).
"""

from __future__ import annotations

import hashlib
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

from ropecheck.kernels import triton_env, triton_interpreter

CAPABILITY = 90  # the binder's target (H100 / H200): a launch's key does not depend on it


@dataclass
class Recorded:
    """What the launches of one or more calls were: ``keys`` kernel name -> the keys of the
    specializations launched, each "dtype:hash" (the dtype of the kernel's first floating
    tensor argument: a specialization has one); ``compiled`` the kernels Triton compiled
    on a device, and ``compile_seconds`` the time of the launches that compiled them;
    ``unkeyed`` launches whose key could not be made (named, with why)."""

    keys: dict = field(default_factory=dict)
    compiled: int = 0
    compile_seconds: float = 0.0
    unkeyed: dict = field(default_factory=dict)

    def add(self, other: "Recorded") -> None:
        for name, keys in other.keys.items():
            self.keys.setdefault(name, set()).update(keys)
        self.compiled += other.compiled
        self.compile_seconds += other.compile_seconds
        self.unkeyed.update(other.unkeyed)

    @property
    def count(self) -> int:
        """Distinct specializations, over every kernel."""
        return sum(len(keys) for keys in self.keys.values())

    def by_dtype(self) -> dict:
        """dtype -> distinct specializations in it, over every kernel."""
        out: dict = {}
        for keys in self.keys.values():
            for key in keys:
                dtype = key.split(":", 1)[0]
                out[dtype] = out.get(dtype, 0) + 1
        return dict(sorted(out.items()))

    def __bool__(self) -> bool:
        return bool(self.keys or self.compiled or self.unkeyed)


_open: list = []  # the recordings open in this process, innermost last
_hooked = False


@contextmanager
def recording():
    """Record the Triton launches made inside the block into the ``Recorded`` it yields
    (nothing, and no cost, for a target that does not use Triton)."""
    record = Recorded()
    if "triton" in sys.modules:
        _hook()
        if triton_env.interpreted():  # a target's own Triton, imported without ropecheck
            triton_interpreter.install()
    _open.append(record)
    try:
        yield record
    finally:
        _open.remove(record)


def kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}"


def key_of(kernel, args: tuple, kwargs: dict) -> str:
    """The specialization ``kernel`` launched with these arguments compiles: Triton's
    binder's specialization list and launch options, as a short hash."""
    return _bind(kernel, args, kwargs)[1]


def _bind(kernel, args: tuple, kwargs: dict) -> tuple:
    """(the launch's arguments by name, its key)."""
    bound, specialization, options, _ = triton_env.bind_for_cuda(kernel, args, kwargs, CAPABILITY)
    text = repr((specialization, sorted((k, repr(v)) for k, v in dict(options).items())))
    return dict(bound), f"{_dtype_of(args, kwargs)}:{hashlib.sha1(text.encode()).hexdigest()[:12]}"


# CUDA's grid limits: 2^31 - 1 blocks on x, 65535 on y and z
GRID_LIMITS = (2**31 - 1, 65535, 65535)


def grid_beyond_limits(grid, bound: dict, kwargs: dict) -> str:
    """Why a launch's grid cannot be launched on a CUDA device ("" when it can): the
    Triton interpreter runs any grid, a GPU refuses one past CUDA's limits ("invalid
    argument"), so a check on CPU says what the GPU would."""
    if callable(grid):
        grid = grid({**bound, **kwargs})
    dims = tuple(int(n) for n in grid)
    for axis, (n, limit) in enumerate(zip(dims, GRID_LIMITS)):
        if n > limit:
            return (
                f"the launch's grid {dims} has {n} programs on axis {axis} ({'xyz'[axis]}), past CUDA's "
                f"limit of {limit}: the launch fails on a GPU (invalid argument)"
            )
    return ""


class GridBeyondLimits(RuntimeError):
    """A Triton launch whose grid a CUDA device refuses (raised under the interpreter)."""


def _dtype_of(args: tuple, kwargs: dict) -> str:
    for value in (*args, *kwargs.values()):
        dtype = getattr(value, "dtype", None)
        if dtype is not None and getattr(dtype, "is_floating_point", False):
            return str(dtype).removeprefix("torch.")
    return "-"


def _cache_size(kernel) -> Optional[int]:
    caches = getattr(kernel, "device_caches", None)
    if not caches:
        return None
    try:
        return sum(len(cache[0]) for cache in caches.values())
    except Exception:  # another Triton's layout: no count of real compiles
        return None


def _hook() -> None:
    """Wrap ``run`` of Triton's JITFunction and InterpretedFunction classes (once)."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    classes = []
    try:
        from triton.runtime.jit import JITFunction

        classes.append(JITFunction)
    except Exception:
        return
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except Exception:
        pass
    for cls in classes:
        cls.run = _recording_run(cls.run)


def _recording_run(original):
    def run(self, *args, grid, warmup=False, **kwargs):
        if not _open or warmup:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        name = kernel_name(self)
        beyond = ""
        try:
            bound, key = _bind(self, args, kwargs)
        except Exception as exc:  # Triton's binder refused: the launch will say why, if it fails
            key = None
            why = f"{type(exc).__name__}: {exc}"
        else:
            try:
                beyond = grid_beyond_limits(grid, bound, kwargs)
            except Exception:  # a grid function this cannot call: the launch itself will
                beyond = ""
        if beyond:
            raise GridBeyondLimits(f"{name}: {beyond}")
        before = _cache_size(self)
        start = time.perf_counter()
        result = original(self, *args, grid=grid, warmup=warmup, **kwargs)
        after = _cache_size(self)
        seconds = time.perf_counter() - start
        for record in _open:
            if key is None:
                record.unkeyed[name] = why[:200]
            else:
                record.keys.setdefault(name, set()).add(key)
            if before is not None and after is not None and after > before:
                record.compiled += after - before
                record.compile_seconds += seconds
        return result

    run.__wrapped__ = original
    return run
