"""Resolve a target spec: ``path/to/file.py:func``, ``package.module:attr``, a built-in name,
or (from the Python API) the Python object itself: a function, a callable, a ``Target``.

A file or module is imported with the current directory on ``sys.path`` (as
``python -m`` would), so a target file in a project can import that project's own
package when ropecheck runs from its root, whichever script started ropecheck.

``load*`` build the target here; ``load*_isolated`` build it in a worker process
(``ropecheck.worker``) and return a target whose calls run there.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import NamedTuple, Optional

from ropecheck.adapters import ADAPTERS
from ropecheck.builtins import BUILTINS, builtin
from ropecheck.call_forms import ARITY, CALL_FORMS, check_call
from ropecheck.execution import describe_exception
from ropecheck.target import Target


class TargetLoadError(Exception):
    """The target could not be loaded or does not have the canonical signature."""


def _import_file(path: Path):
    if path.is_dir():
        raise TargetLoadError(f"{path} is a directory, not a Python file")
    if not path.is_file():
        raise TargetLoadError(f"no such file: {path}")
    module_name = f"ropecheck_target_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TargetLoadError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # a target's import may raise anything, SystemExit included
        sys.modules.pop(module_name, None)
        raise TargetLoadError(f"importing {path} failed: {_describe(exc)}") from exc
    finally:
        sys.path.remove(str(path.parent.resolve()))
    return module


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except BaseException as exc:
        raise TargetLoadError(f"importing module {name!r} failed: {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    """The exception and where it happened (for a SyntaxError: the offending line)."""
    if isinstance(exc, SyntaxError):
        return f"{type(exc).__name__}: {exc.msg} (at {exc.filename}:{exc.lineno})"
    return describe_exception(exc)


def check_signature(fn, call: str = "x") -> None:
    """The target must accept the call of its form: fn(x, positions), fn(q, k, positions)
    or fn(x, cu_seqlens, positions)."""
    if not callable(fn):
        raise TargetLoadError(f"{fn!r} is not callable")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and C extensions: the smoke call will tell
    try:
        signature.bind(*[object()] * ARITY[call])
    except TypeError as exc:
        hint = "" if call != "x" else "; a kernel called as rope(q, k, positions) or rope(x, cu_seqlens, positions) needs --call qk or --call packed"
        raise TargetLoadError(
            f"the target must accept {CALL_FORMS[call]} (call form {call}); its signature is "
            f"{getattr(fn, '__name__', 'target')}{signature}: {exc}{hint}") from None


def _build_adapter(adapter) -> Target:
    why = adapter.why_unavailable()
    if why:
        raise TargetLoadError(f"target {adapter.name!r} is not available here: {why}")
    try:
        return adapter.target()
    except BaseException as exc:  # a library's import may raise anything
        raise TargetLoadError(f"building target {adapter.name!r} failed: {_describe(exc)}") from exc


def target_name(spec) -> str:
    """How a target is named in tables and records: its spec string, or for a Python object
    its ``module:qualified.name`` (a Target: its own name)."""
    if spec is None or isinstance(spec, str):
        return spec
    if isinstance(spec, Target):
        return spec.name
    fn = getattr(spec, "fn", spec)
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}:{qualname}" if module and module != "__main__" else qualname


def is_named(spec) -> bool:
    """Whether ``spec`` is a name (built-in, adapter, file or module path): a worker
    process can load it; a Python object is called where it lives."""
    return isinstance(spec, str)


def resolve(spec):
    """The object ``path/to/file.py:attr`` or ``package.module:attr`` names (a Python
    object: itself)."""
    if not is_named(spec):
        return spec
    if ":" not in spec:
        raise TargetLoadError(
            f"cannot resolve target {spec!r}: use path/to/file.py:func, package.module:attr "
            f"or a target name (`ropecheck list` shows them)")
    if os.getcwd() not in sys.path:  # the project's own packages, as `python -m` finds them
        sys.path.append(os.getcwd())
    where, _, attr = spec.rpartition(":")
    if where.endswith(".py") or "/" in where or Path(where).is_file():
        module = _import_file(Path(where))
    else:
        module = _import_module(where)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))
            raise TargetLoadError(f"{where} has no attribute {attr!r} (it has: "
                                  f"{', '.join(public[:12]) or 'nothing public'})")
        obj = getattr(obj, part)
    return obj


def load(spec: str, call=None, **builtin_options) -> Target:
    """Load a target. ``builtin_options`` (base, rotary_dim, layout) configure built-ins;
    ``call`` is its call form when the user declares it (else the target's own, or x)."""
    if call is not None:
        try:
            check_call(call)
        except ValueError as exc:
            raise TargetLoadError(str(exc)) from None
    if is_named(spec) and spec in BUILTINS:
        try:
            target = builtin(spec, **builtin_options)
        except ValueError as exc:
            raise TargetLoadError(str(exc)) from None
    elif is_named(spec) and spec in ADAPTERS:
        target = _build_adapter(ADAPTERS[spec])
    else:
        obj = resolve(spec)
        if isinstance(obj, Target):
            target = obj
        else:
            check_signature(obj, call or "x")
            return Target(name=target_name(spec), fn=obj, call=call or "x")
    if call is not None and call != target.call:
        check_signature(target.fn, call)
        target = target.with_(call=call)
    return target


class Declared(NamedTuple):
    """What a family target declares besides its callable."""

    max_position: Optional[int] = None  # the largest position (per axis) it accepts
    backward: bool = True  # autograd flows through it
    call: str = "x"  # its call form (ropecheck.call_forms)
    devices: tuple = ("cpu", "cuda")  # device types it runs on


def load_callable(spec: str, rope_signature: bool = True, call=None) -> tuple:
    """(callable, its ``Declared`` range and backward) for the families (N-D, xPos): an
    adapter's or a built-in's function (a 1-D built-in is the N-D case with one axis), or a
    file's / module's attribute, which may be an object with ``fn``, ``max_position`` and
    ``backward`` (a Target)."""
    if is_named(spec) and (spec in ADAPTERS or spec in BUILTINS):
        target = load(spec, call)
        return target.fn, Declared(target.max_position, target.backward, target.call, target.devices)
    obj = resolve(spec)
    declared = Declared(getattr(obj, "max_position", None), bool(getattr(obj, "backward", True)),
                        call or getattr(obj, "call", "x"), tuple(getattr(obj, "devices", ("cpu", "cuda"))))
    obj = getattr(obj, "fn", obj)
    if not callable(obj):
        raise TargetLoadError(f"{target_name(spec)} is not callable")
    if rope_signature:
        check_signature(obj, declared.call)
    return obj, declared


# --- in a worker process --------------------------------------------------------------

def _target_parts(spec: str, builtin_options: dict, call=None) -> tuple:
    """Run in the worker: (the callable, the target's description without it)."""
    target = load(spec, call, **builtin_options)
    return target.fn, target.with_(fn=None)


def _start(loader: str, args: tuple):
    from ropecheck.worker import Worker, WorkerError

    worker = Worker(loader, args)
    try:
        return worker, worker.start()
    except WorkerError as exc:
        raise TargetLoadError(str(exc)) from None


def load_isolated(spec: str, call=None, **builtin_options) -> Target:
    """Like :func:`load`, with the target imported and called in a worker process."""
    worker, target = _start("ropecheck.loading:_target_parts", (spec, builtin_options, call))
    return target.with_(fn=worker.function, executor=worker)


def load_callable_isolated(spec: str, rope_signature: bool = True, call=None) -> tuple:
    """Like :func:`load_callable`: (callable, Declared, the worker it runs in)."""
    worker, declared = _start("ropecheck.loading:load_callable", (spec, rope_signature, call))
    return worker.function, declared, worker
