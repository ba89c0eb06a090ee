"""Resolve a target spec: ``path/to/file.py:func``, ``package.module:attr``, a built-in name,
or (from the Python API) the Python object itself: a function, a callable, a ``Target``.

A file or module is imported with the current directory on ``sys.path`` (as
``python -m`` would), so a target file in a project can import that project's own
package when ropecheck runs from its root, whichever script started ropecheck.

``load`` builds the target here, or in a worker process (``ropecheck.calling.worker``)
and returns a target whose calls run there: one loader for every family and call form.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Optional

from ropecheck.adapters import ADAPTERS
from ropecheck.calling import quiet
from ropecheck.calling.execution import describe_exception
from ropecheck.calling.presets import PRESETS
from ropecheck.calling.worker import Worker, WorkerError
from ropecheck.kernels.triton_env import choose_interpreter, triton_missing
from ropecheck.properties.core.contract import ARITY, CALL_FORMS, check_call
from ropecheck.properties.families import FAMILIES
from ropecheck.targets.builtins import BUILTINS, builtin
from ropecheck.targets.target import Target


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
    if triton_missing() is None:  # its Triton kernels, if any, run under the interpreter without CUDA
        choose_interpreter()
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
        hint = (
            ""
            if call != "x"
            else "; a kernel called as rope(q, k, positions) or rope(x, cu_seqlens, positions) "
            "needs --call qk or --call packed"
        )
        raise TargetLoadError(
            f"the target must accept {CALL_FORMS[call]} (call form {call}); its signature is "
            f"{getattr(fn, '__name__', 'target')}{signature}: {exc}{hint}"
        ) from None


def _build_adapter(adapter) -> Target:
    why = adapter.why_unavailable()
    if why:
        raise TargetLoadError(f"target {adapter.name!r} is not available here: {why}")
    try:
        return adapter.target()
    except BaseException as exc:  # a library's import may raise anything
        raise TargetLoadError(f"building target {adapter.name!r} failed: {_describe(exc)}") from exc


def target_name(spec) -> Optional[str]:
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
            f"or a target name (`ropecheck list` shows them)"
        )
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
            raise TargetLoadError(
                f"{where} has no attribute {attr!r} (it has: {', '.join(public[:12]) or 'nothing public'})"
            )
        obj = getattr(obj, part)
    return obj


def check_interface(fn, api: str) -> None:
    """The target must accept the call its preset makes (``Preset.check_signature``)."""
    if not callable(fn):
        raise TargetLoadError(f"{fn!r} is not callable")
    problem = PRESETS[api].check_signature(fn)
    if problem:
        raise TargetLoadError(problem)


def _declared(obj, name: str, call: Optional[str], family: Optional[str], api: Optional[str] = None) -> Target:
    """The Target a resolved object declares: a Target itself; an object with ``fn`` and
    Target fields as attributes (``max_position``, ``backward``, ``call``, ...); or a plain
    callable in the call form given (else its family's first), its signature checked."""
    if isinstance(obj, Target):
        return obj
    if hasattr(obj, "fn") and not callable(obj):
        fields = {
            f: getattr(obj, f)
            for f in Target.__dataclass_fields__
            if f not in ("name", "fn", "executor") and hasattr(obj, f)
        }
        if not callable(obj.fn):
            raise TargetLoadError(f"{name} is not callable")
        return Target(name=name, fn=obj.fn, **fields)
    if api is not None:  # a library interface: its signature, its call form
        check_interface(obj, api)
        preset = PRESETS[api]
        return Target(
            name=name,
            fn=obj,
            call=call or preset.calls[0],
            family=family or "rope",
            api=api,
            optional_params=preset.optional_taken(obj),
        )
    form = call or (FAMILIES[family].calls[0] if family in FAMILIES else "x")
    check_signature(obj, form)
    return Target(name=name, fn=obj, call=form, family=family or "rope")


def load_here(
    spec, call: Optional[str] = None, family: Optional[str] = None, builtin_options=None, api: Optional[str] = None
) -> Target:
    """The target ``spec`` names, built in this process: a built-in (configured by
    ``builtin_options``: base, rotary_dim, layout, scaling), an adapter, or a file's or
    module's attribute (or the Python object itself). ``call`` and ``family``: what the
    user declares (a plain callable takes them; a declared target's call form is changed
    to ``call``). ``api``: the library interface it has (``--api``), whose signature it
    must accept."""
    if call is not None:
        try:
            check_call(call)
        except ValueError as exc:
            raise TargetLoadError(str(exc)) from None
    if api is not None and api not in PRESETS:
        raise TargetLoadError(f"unknown --api {api!r}; known: {', '.join(PRESETS)}")
    if is_named(spec) and spec in BUILTINS:
        try:
            target = builtin(spec, **(builtin_options or {}))
        except ValueError as exc:
            raise TargetLoadError(str(exc)) from None
    elif is_named(spec) and spec in ADAPTERS:
        target = _build_adapter(ADAPTERS[spec])
    else:
        return _declared(resolve(spec), target_name(spec) or "target", call, family, api)
    if api is not None and api != target.api:
        check_interface(target.fn, api)
        preset = PRESETS[api]
        return target.with_(api=api, call=call or preset.calls[0], optional_params=preset.optional_taken(target.fn))
    if call is not None and call != target.call and target.api is None:
        check_signature(target.fn, call)
        target = target.with_(call=call)
    return target


def _target_parts(spec: str, call, family, builtin_options: dict, api=None) -> tuple:
    """Run in the worker: (the callable, the target's description without it)."""
    target = load_here(spec, call, family, builtin_options, api)
    return target.fn, target.with_(fn=None)


def load(
    spec,
    *,
    worker: bool = False,
    call: Optional[str] = None,
    family: Optional[str] = None,
    builtin_options=None,
    api: Optional[str] = None,
    sanitize: Optional[str] = None,
) -> Target:
    """The target ``spec`` names (``load_here``), built here, or with ``worker`` in a worker
    process whose calls it makes, under compute-sanitizer's ``sanitize`` tool if given (a
    Python object is always built here: a worker cannot receive it). What the target's
    import prints is captured (``ropecheck.calling.quiet``). Raises TargetLoadError."""
    if not worker or not is_named(spec):
        with quiet.captured():
            return load_here(spec, call, family, builtin_options, api)
    loader = "ropecheck.session.loading:_target_parts"
    process = Worker(loader, (spec, call, family, builtin_options or {}, api), sanitize=sanitize)
    try:
        target = process.start()
    except WorkerError as exc:
        raise TargetLoadError(str(exc)) from None
    return target.with_(fn=process.function, executor=process)
