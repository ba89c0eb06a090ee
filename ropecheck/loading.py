"""Resolve a target spec: ``path/to/file.py:func``, ``package.module:attr`` or a built-in name."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from ropecheck.adapters import ADAPTERS
from ropecheck.builtins import BUILTINS, builtin
from ropecheck.calling import describe_exception
from ropecheck.target import Target


class TargetLoadError(Exception):
    """The target could not be loaded or does not have the canonical signature."""


def _import_file(path: Path):
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


def check_signature(fn) -> None:
    """The target must accept exactly the call fn(x, positions)."""
    if not callable(fn):
        raise TargetLoadError(f"{fn!r} is not callable")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and C extensions: the smoke call will tell
    try:
        signature.bind(object(), object())
    except TypeError as exc:
        raise TargetLoadError(
            f"the target must accept rope(x, positions); its signature is "
            f"{getattr(fn, '__name__', 'target')}{signature}: {exc}") from None


def _build_adapter(adapter) -> Target:
    why = adapter.why_unavailable()
    if why:
        raise TargetLoadError(f"target {adapter.name!r} is not available here: {why}")
    try:
        return adapter.target()
    except BaseException as exc:  # a library's import may raise anything
        raise TargetLoadError(f"building target {adapter.name!r} failed: {_describe(exc)}") from exc


def load(spec: str, **builtin_options) -> Target:
    """Load a target. ``builtin_options`` (base, rotary_dim, layout) configure built-ins."""
    if spec in BUILTINS:
        try:
            return builtin(spec, **builtin_options)
        except ValueError as exc:
            raise TargetLoadError(str(exc)) from None
    if spec in ADAPTERS:
        return _build_adapter(ADAPTERS[spec])
    if ":" not in spec:
        raise TargetLoadError(
            f"cannot resolve target {spec!r}: use path/to/file.py:func, package.module:attr "
            f"or a target name (`ropecheck list` shows them)")
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
    if isinstance(obj, Target):
        return obj
    check_signature(obj)
    return Target(name=spec, fn=obj)
