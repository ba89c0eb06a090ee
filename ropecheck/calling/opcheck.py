"""``--opcheck``: ``torch.library.opcheck`` on the custom ops a target's calls make, with the
arguments the calls made them with.

Production RoPE kernels are ``torch.library`` custom ops, and a registration can be wrong
while the math is right: a fake (meta) implementation whose output strides differ from the
kernel's, no fake at all, an in-place op without its mutation annotation, an output that
aliases an input the schema does not say it aliases. ``torch.library.opcheck`` finds these,
but only on the samples it is given; the checks' inputs (every memory layout, call form and
interface argument class a run draws) are the samples it lacks.

Under ``--opcheck`` a caller (``ropecheck.calling.caller``) follows each call whose class
of input (``call_key``: its call form and interface classes, its tensors' layout classes,
its mode, its size band) is new to the target's process with a ``Request`` of op
"opcheck" on the same input. The process that runs the target (``execution``) then
- calls the target again, eagerly (a compiling mode's code is not traced into), on fresh
  copies, inside a ``Recorder``: a ``TorchFunctionMode`` (the hook ``torch.library``'s own
  ``generate_opcheck_tests`` uses) that keeps each call of an operator outside the
  namespaces ``aten``, ``prim`` and ``prims``, with copies of its arguments made before it
  ran (an in-place op writes them), their strides and storage offsets kept;
- runs ``torch.library.opcheck`` (``TESTS``) on each recorded call whose op and class of
  arguments (``op_key``) this process has not checked yet, and keeps each test's verdict
  as a ``Checked`` record (message abridged to a line);
- in ``--mode compile``, also compiles the target with ``fullgraph=True`` (dynamo alone:
  the eager backend) on that input: a graph break there is a ``Checked`` of test
  ``fullgraph``, the op it broke at and dynamo's reason in one line.
What comes back is a ``Called`` record (the ops the call made, what was checked): data,
never an exception; the session turns a run's records into its ``opcheck`` row
(``ropecheck.session.opcheck_row``).

What it cannot see: custom ops called from C++ (an extension's function that dispatches to
an op from inside), calls made only on inputs larger than ``MAX_ELEMENTS``, and the
inputs a run does not draw.
"""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import torch
from torch.overrides import TorchFunctionMode

from ropecheck.calling import modes
from ropecheck.calling.devices import Placement

TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
FULLGRAPH = "fullgraph"  # the test name of the fullgraph=True compile (--mode compile)
BUILTIN_NAMESPACES = ("aten", "prim", "prims")  # operators that are torch's own, not custom ops
ALLOWANCE = 120.0  # seconds an opcheck request has beyond the call's time limit (imports, AOT compiles)
MAX_ELEMENTS = 2**24  # a call on a larger input is not followed by opcheck (its layouts are, at drawn sizes)
MESSAGE_WIDTH = 320  # characters of an abridged message


@dataclass(frozen=True)
class Checked:
    """One test's verdict on one custom-op call: the op (``OpOverload.name()``: ``ns::name``,
    ``.overload`` added but for the default; for the fullgraph compile, the op it broke at,
    or the target's code), the test (one of
    ``TESTS``, or ``FULLGRAPH``), ``message`` ("" when it passed; the failure in one line),
    the op's arguments in words, and ``key``: what makes two of its inputs the same to it
    (``op_key``; the call's ``call_key`` for the fullgraph compile)."""

    op: str
    test: str
    message: str
    args: str
    key: tuple

    @property
    def failed(self) -> bool:
        return bool(self.message)


@dataclass(frozen=True)
class Called:
    """What --opcheck saw of one call: the custom ops it made (names, in order), the
    verdicts on those not checked before in its process (``Checked``), and the call itself
    in words (its input, its interface's argument classes: the caller fills it in)."""

    ops: tuple = ()
    checked: tuple = ()
    call: str = ""

    def described(self, call: str) -> "Called":
        return replace(self, call=call)


# --- classes of inputs -------------------------------------------------------------------


def tensor_class(t: torch.Tensor) -> tuple:
    """What a tensor's layout is to a fake implementation and a compiler, sizes aside: its
    dtype, device type, rank, the dims of size 1 and of stride 0, the order of its strides,
    whether it is contiguous and whether it has a storage offset, and requires_grad."""
    shape, stride = tuple(t.shape), tuple(t.stride())
    order = tuple(sorted(range(t.dim()), key=lambda d: (-stride[d], -shape[d])))
    return (
        str(t.dtype),
        t.device.type,
        t.dim(),
        tuple(d for d, n in enumerate(shape) if n == 1),
        tuple(d for d, s in enumerate(stride) if s == 0 and shape[d] > 1),
        order,
        t.is_contiguous(),
        t.storage_offset() > 0,
        t.requires_grad,
    )


def value_class(value) -> Any:
    """An argument's class: a tensor's ``tensor_class``; a flag, None or text itself; a
    number its type (a head size or a scale is one value among many); a sequence its items'."""
    if isinstance(value, torch.Tensor):
        return tensor_class(value)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return type(value).__name__
    if isinstance(value, (tuple, list)):
        return tuple(value_class(v) for v in value)
    return type(value).__name__


def _count_class(n: int):
    return min(n, 2)  # none, one, or more


def form_class(form, x: torch.Tensor) -> tuple:
    """A call form's class, sizes aside: its fields but for sizes and tables (the call form,
    the interface and its argument classes, the layouts), and for (q, k) how many key heads
    (none, one: MQA, more: GQA), for packed sequences whether some are empty, or one token."""
    if form is None:
        return ()
    shown = repr(replace(form, q_heads=None, lengths=(), convention=None, table_rows=0))
    if form.call == "qk" and x.dim() == 4:
        return (shown, _count_class(x.shape[2] - form.split(x.shape[2])))
    if form.call == "packed":
        return (shown, tuple(_count_class(list(form.lengths).count(n)) for n in (0, 1)))
    return (shown,)


def call_key(request) -> tuple:
    """A call's class of input (a ``calling.execution.Request``): a VJP or a call, its mode,
    its call form's class (``form_class``), the classes of x and the positions, and x's size
    band (a factor of 8: a kernel may call another op past a size)."""
    x = request.args[0]
    band = int(math.log2(max(x.numel(), 1))) // 3
    positions = None if request.positions is None else value_class(request.positions)
    return (request.op, request.mode, form_class(request.form, x), value_class(x), positions, band)


def followed(request) -> bool:
    """Whether a call is followed by opcheck at all: a call or VJP on an input of at most
    MAX_ELEMENTS elements."""
    return request.op in ("call", "vjp") and request.args[0].numel() <= MAX_ELEMENTS


def time_limit(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else timeout + ALLOWANCE


# executor -> the classes of calls (``call_key``) already followed by opcheck in its process
_FOLLOWED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def seen_by(executor) -> set:
    """The classes of calls already followed by opcheck where ``executor`` runs them."""
    return _FOLLOWED.setdefault(executor, set())


STOPPED = ("stopped",)  # in a ``seen_by`` set: no more calls followed (an opcheck run ended its process)


def failed_request(error: Optional[tuple], key: tuple, seen: set) -> Called:
    """What an opcheck request that did not come back says: a finding of test "opcheck"
    (opcheck's own run hung, or ended the process: then no later call is followed, each
    would cost a new process), or nothing (no error)."""
    if error is None:
        return Called()
    kind, message = error
    said = f"opcheck's run {'did not finish' if kind == 'hung' else 'failed'}: {message}"
    if kind in ("crashed", "exited", "hung"):
        seen.add(STOPPED)
        said = f"{said[: MESSAGE_WIDTH - 60]} (no later call followed by opcheck)"
    return Called(checked=(Checked("(the target's ops)", "opcheck", said[:MESSAGE_WIDTH], "", key),))


def call_words(x: torch.Tensor, case, classes: dict) -> str:
    """The call a Called record came from, in words: the case (its input, layout and
    interface classes) where x is the case's whole input, else x's layout and the case it
    is part of."""
    if case is not None and tuple(getattr(case, "shape", ())) == tuple(x.shape):
        return case.describe()
    shown = f"x {describe(x)}"
    if classes:
        shown += "; interface classes " + ", ".join(f"{k}={v}" for k, v in classes.items())
    return shown + (f" (a part of the input {case.describe()})" if case is not None else "")


# --- recording the custom-op calls --------------------------------------------------------


def custom_op(func):
    """The custom op ``func`` is (an ``OpOverload``, or an ``OpOverloadPacket`` whose
    overload its arguments pick: ``resolved``), or None: not an operator, or one of torch's
    own namespaces (``BUILTIN_NAMESPACES``)."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        return None if func._qualified_op_name.split("::")[0] in BUILTIN_NAMESPACES else func
    if isinstance(func, torch._ops.OpOverload) and func.namespace not in BUILTIN_NAMESPACES:
        return func
    return None


def checkable(args: tuple, kwargs: dict) -> bool:
    """Whether opcheck has something to check in a call: a tensor among its arguments, and
    no opaque object (a ``torch.ScriptObject``: the profiler's record_function ops, which
    take a name and hand back a handle, are not samples for fake tensors and schemas)."""
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    return any(isinstance(v, torch.Tensor) for v in leaves) and not any(
        isinstance(v, torch.ScriptObject) for v in leaves
    )


def resolved(op, args: tuple, kwargs: dict) -> torch._ops.OpOverload:
    """An OpOverload as it is; a packet's overload that these arguments pick (its only one,
    else the dispatcher's choice)."""
    if isinstance(op, torch._ops.OpOverload):
        return op
    names = op.overloads()
    name = names[0] if len(names) == 1 else torch._C._jit_resolve_packet(op._qualified_op_name, *args, **kwargs)
    return getattr(op, name or "default")


def _mutable(op: torch._ops.OpOverload) -> set:
    """The names of the arguments the op's schema says it writes (``Tensor(a!)``)."""
    return {a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write}


def fresh(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple:
    """Copies of a call's arguments, made before the op runs: each tensor a leaf laid out as
    the original (sizes, strides, offset; views of one storage stay views of one), requiring
    grad where it did, unless the schema says the op writes it (autograd forbids writing a
    leaf that requires grad, whoever the op is)."""
    places: dict = {}  # device -> its Placement (one copy of each storage)
    names = [a.name for a in op._schema.arguments]
    written = _mutable(op)

    def copy(value, name: str):
        if not isinstance(value, torch.Tensor):
            return value
        place = places.setdefault(str(value.device), Placement(str(value.device)))
        out = place(value.detach())
        grad = value.requires_grad and name not in written and (out.is_floating_point() or out.is_complex())
        return out.requires_grad_(True) if grad else out

    copied = tuple(copy(a, names[i] if i < len(names) else "") for i, a in enumerate(args))
    return copied, {k: copy(v, k) for k, v in kwargs.items()}


class Recorder(TorchFunctionMode):
    """Inside it, each call of a custom op (``custom_op``) that opcheck can check
    (``checkable``) is kept as (op, fresh copies of its arguments, of its keyword
    arguments). Operators called inside a custom op's own implementation are not (the mode
    is off while its handler runs)."""

    def __init__(self):
        super().__init__()
        self.calls: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = custom_op(func)
        if op is not None and checkable(tuple(args), kwargs):
            try:
                op = resolved(op, tuple(args), kwargs)
                self.calls.append((op, *fresh(op, tuple(args), kwargs)))
            except Exception:  # an argument that cannot be copied or resolved: the op still runs
                pass
        return func(*args, **kwargs)


def op_key(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple:
    """What makes two calls of an op the same sample to opcheck: the op and its arguments'
    classes (``value_class``)."""
    return (
        op.name(),
        tuple(value_class(a) for a in args),
        tuple(sorted((k, value_class(v)) for k, v in kwargs.items())),
    )


def describe(value) -> str:
    if isinstance(value, torch.Tensor):
        where = "" if value.device.type == "cpu" else f" on {value.device}"
        layout = "contiguous" if value.is_contiguous() else f"strides {tuple(value.stride())}"
        offset = f", offset {value.storage_offset()}" if value.storage_offset() else ""
        grad = ", requires grad" if value.requires_grad else ""
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{tuple(value.shape)} {dtype}{where}, {layout}{offset}{grad}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(describe(v) for v in value) + "]"
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def describe_args(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str:
    """The op's arguments in words, named as its schema names them: ``query (6, 256) float32,
    strides (384, 1); head_size=64; ...``."""
    names = [a.name for a in op._schema.arguments]
    shown = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    return "; ".join(f"{n} {describe(v)}" if isinstance(v, torch.Tensor) else f"{n}={describe(v)}" for n, v in shown)


# --- the checks ---------------------------------------------------------------------------


def abridged(exc: BaseException) -> str:
    """An exception in one line: its type and first non-empty line (and its cause's, when
    the message is a wrapper's), at most MESSAGE_WIDTH characters."""
    text = f"{type(exc).__name__}: {_first_line(exc)}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None and len(text) < 80 and _first_line(cause) not in text:
        text += f" (from {type(cause).__name__}: {_first_line(cause)})"
    return text if len(text) <= MESSAGE_WIDTH else text[: MESSAGE_WIDTH - 3] + "..."


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else ""


def opchecked(op: torch._ops.OpOverload, args: tuple, kwargs: dict, done: set) -> tuple:
    """``torch.library.opcheck`` on one call, each test's verdict a ``Checked``; () when a
    call of this class (``op_key``) is in ``done`` (checked before), which it joins."""
    key = op_key(op, args, kwargs)
    if key in done:
        return ()
    done.add(key)
    shown = describe_args(op, args, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notes about the op are not findings
        try:
            verdicts: dict = torch.library.opcheck(op, args, kwargs, test_utils=TESTS, raise_exception=False)
        except (Exception, SystemExit) as exc:  # opcheck could not run on these arguments (or its run exited)
            verdicts = {test: exc for test in TESTS}
    return tuple(
        Checked(op.name(), test, abridged(verdict) if isinstance(verdict, BaseException) else "", shown, key)
        for test, verdict in verdicts.items()
    )


def check_calls(
    call: Callable[[Callable], Any], fn: Callable, key: tuple, done: set, fullgraph: bool = False
) -> Called:
    """What opcheck says of the custom-op calls ``call(fn)`` makes (``call`` makes fresh
    inputs each time it is called and calls ``fn`` on them in the target's call form), those
    of a class in ``done`` (the op calls checked so far where ``fn`` runs) left out; with
    ``fullgraph``, also whether torch.compile(fn, fullgraph=True) traces that call whole."""
    recorder = Recorder()
    try:
        with recorder:
            call(fn)
    except (Exception, SystemExit):  # the call was judged as it ran; what it called before it raised is checked
        pass
    checked: list = []
    for op, args, kwargs in recorder.calls:
        checked += opchecked(op, args, kwargs, done)
    ops = tuple(dict.fromkeys(op.name() for op, _, _ in recorder.calls))
    if fullgraph:
        checked.append(_fullgraph(call, fn, ops, key))
    return Called(ops, tuple(checked))


def _fullgraph(call: Callable[[Callable], Any], fn: Callable, ops: tuple, key: tuple) -> Checked:
    """The call compiled whole (``fullgraph=True``, dynamo with the eager backend: a graph
    break is dynamo's, whatever compiles the graph), static shapes: a passing ``Checked``,
    or one naming the op it broke at (else the target's code) and dynamo's reason."""
    from torch import _dynamo

    def whole(*args, **kwargs):  # a code object of the trials' own: fn's compiles keep their cache
        return fn(*args, **kwargs)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call(torch.compile(whole, fullgraph=True, backend="eager", dynamic=False))
    except (Exception, SystemExit) as exc:
        if not isinstance(exc, _dynamo.exc.TorchDynamoException):
            return Checked("", FULLGRAPH, "", "", key)  # the target's own error: the checks judge that
        return Checked(at_op(exc, ops), FULLGRAPH, modes.reason_line(str(exc)), "", key)
    finally:  # its cache entries gone: trials never add up to dynamo's recompile limit
        _dynamo.reset_code(whole.__code__)
    return Checked("", FULLGRAPH, "", "", key)


def at_op(exc: BaseException, ops: tuple) -> str:
    """The custom op a compile error names (``ns::name``, ``ns.name`` in its text), else the
    innermost frame of the target's code dynamo was tracing."""
    text = str(exc)
    for name in ops:
        base = name.split(".")[0]  # ns::name
        if base in text or base.replace("::", ".") in text:
            return name
    stack = getattr(exc, "real_stack", None) or []
    if stack:
        frame = stack[-1]
        return f"the target's code at {frame.filename}:{frame.lineno} ({frame.name})"
    return "the target's code"
