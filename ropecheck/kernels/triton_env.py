"""Import Triton the way ropecheck's kernels (and adapters of Triton-based libraries) need it.

On a machine without CUDA, Triton kernels run only under its interpreter, which is chosen
when ``TRITON_INTERPRET=1`` is in the environment when a kernel is defined (Triton 3.x reads
it at each ``@triton.jit``; kernels defined after that run on CPU torch tensors, one
Python program at a time). ``import_triton()`` sets it in that case, so every importer of
a Triton kernel goes through this one function; it works even when another library
(transformers, say) imported triton first, as long as the kernels are defined afterwards.
Under the interpreter it also makes bfloat16 arithmetic compute on values
(``triton_interpreter``), as a GPU does.
"""

from __future__ import annotations

import os
import weakref

INSTALL_HINT = "pip install triton==3.9.0"


def import_triton():
    """Return the ``triton`` module, under the interpreter when CUDA is unavailable.

    Raises ImportError with the install hint when triton is missing, and when an already
    imported triton does not follow the variable on a machine without CUDA (its kernels
    could not run)."""
    choose_interpreter()
    try:
        import triton
    except ImportError as exc:
        raise ImportError(f"triton is not installed ({INSTALL_HINT}): {exc}") from exc
    if interpreted() and not _follows_environment(triton):
        raise ImportError(
            "triton was imported before ropecheck could set TRITON_INTERPRET=1, "
            "and there is no CUDA device: set TRITON_INTERPRET=1 in the "
            "environment to run Triton kernels on CPU"
        )
    if interpreted():
        from ropecheck.kernels import triton_interpreter

        triton_interpreter.install()
    return triton


def choose_interpreter() -> None:
    """Set ``TRITON_INTERPRET=1`` when there is no CUDA device and the variable is unset,
    so that Triton kernels defined from now on (ropecheck's, an adapter's, a user's file
    loaded as a target) run on CPU tensors instead of failing for want of a driver."""
    import torch

    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"


def _follows_environment(triton) -> bool:
    """Whether kernels defined now run under the interpreter (Triton >= 3.4 reads the
    variable at definition time; older versions only at import)."""
    knobs = getattr(triton, "knobs", None)
    return bool(knobs is not None and knobs.runtime.interpret)


def interpreted() -> bool:
    """Whether Triton kernels run under the interpreter (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_missing() -> str | None:
    """Why triton cannot be imported (None when it can), without importing it."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return f"triton is not installed ({INSTALL_HINT})"
    return None


_binders: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def bind_for_cuda(kernel, args: tuple, kwargs: dict, capability: int = 90) -> tuple:
    """What a launch of ``kernel`` (a JITFunction, or under the interpreter an
    InterpretedFunction) with these arguments compiles on a CUDA device of ``capability``:
    Triton's own binder (``create_function_from_signature``, the one ``JITFunction.run``
    calls) made for that target -> (the arguments by name, the specialization list, the
    launch options, the backend). The binder is made once per kernel and capability."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    made = _binders.setdefault(kernel, {})
    if capability not in made:
        jit = kernel
        if not isinstance(kernel, JITFunction):  # an InterpretedFunction: the JITFunction of its fn
            options = {k: v for k, v in getattr(kernel, "kwargs", {}).items() if v is not None}
            jit = JITFunction(kernel.fn, **options)
        backend = make_backend(GPUTarget("cuda", capability, 32))
        made[capability] = (create_function_from_signature(jit.signature, jit.params, backend), backend)
    binder, backend = made[capability]
    kwargs = dict(kwargs)
    kwargs.setdefault("debug", bool(getattr(kernel, "debug", False)))
    bound, specialization, options = binder(*args, **kwargs)
    return bound, specialization, options, backend
