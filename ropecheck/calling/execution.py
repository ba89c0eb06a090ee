"""One call of a target, in the process that runs it (ropecheck's worker, or ropecheck
itself with ``--in-process``), recorded as an :class:`Outcome` that can cross a process
boundary.

What happens around the call is the same in both places:
- the target gets private copies of its tensor arguments, with their strides and storage
  offsets (a view stays a view), and of the positions, made on the call's device
  (``ropecheck.devices``); afterwards the copies are compared with the originals (an input
  written in place is a contract finding), and only values come back to the host;
- process-wide torch state (default dtype, grad mode, default device, random generator)
  is snapshotted before and restored after; a change is recorded, never left in place;
- an exception (``SystemExit`` included) becomes the outcome's error: the target's
  failure, not ropecheck's;
- tensors the target returned earlier are watched: one that changes during a later call
  is a view of the target's internal buffer;
- for a vector-Jacobian product, the incoming gradient is a private copy too, and a
  backward that writes into it is a finding of its own.
Nothing here judges values against a reference: that is the parent's job.
"""

from __future__ import annotations

import sys
import traceback
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.overrides import has_torch_function

from ropecheck.calling import api_call, context_parallel, launches, modes, opcheck, timed
from ropecheck.calling.devices import Placement, to_host
from ropecheck.calling.forms import Form, ReturnedWrong, Stages, drive

# the engine call behind torch.autograd.grad (a torch without it: the front door, always)
_engine_run_backward: Optional[Callable[..., tuple]] = getattr(torch.autograd.graph, "_engine_run_backward", None)


@dataclass(frozen=True)
class Request:
    """One call of a target, as a caller asks for it and an executor runs it (in this
    process, or sent to the worker as it is).

    ``op``: "call" (y = f(*args, positions)), "vjp" (y and the gradient of x for ``grads``),
    "plain" (f(*args) for a target that takes no tensors) or "opcheck" (``torch.library.opcheck``
    on the custom ops a call or, with ``grads``, a VJP on these inputs makes:
    ``ropecheck.calling.opcheck``); ``form`` the target's call
    form (None: x); ``inplace`` whether it declares writing its output into x; ``device``
    where its tensor inputs are made; ``mode`` how it is run (``ropecheck.calling.modes``);
    ``timeout`` the seconds the call may take (the executor enforces it)."""

    op: str
    args: tuple
    positions: Any = None
    grads: Optional[tuple] = None
    inplace: bool = False
    form: Optional[Form] = None
    device: str = "cpu"
    mode: str = "eager"
    timeout: Optional[float] = None


@dataclass
class Outcome:
    """What one call did. ``outputs``: a Tensor, a tuple of Tensors (or None), or None with
    ``returned`` naming what came back instead; ``error``: (kind, message) when the call
    raised or could not run; ``violations``: (kind, message) contract breaches noticed
    around an otherwise finished call; ``state_changes``: process-wide state the target
    changed (already restored); ``notes``: the warnings a compiling mode caught."""

    outputs: Any = None
    returned: str = ""
    error: Optional[tuple] = None
    violations: list = field(default_factory=list)
    state_changes: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # (message, count): what torch.compile warned of
    classes: dict = field(default_factory=dict)  # a call through an interface: factor -> the class it had
    launches: Optional[launches.Recorded] = None  # the Triton specializations it launched (``launches``)
    opcheck: Optional[opcheck.Called] = None  # an "opcheck" request: what opcheck said of its custom ops


def describe_exception(exc: BaseException) -> str:
    """'Type: message (at file:line)', the line being the innermost frame of the traceback."""
    return f"{type(exc).__name__}: {exc}{_where(exc)}"


def _unchanged(now: torch.Tensor, then: torch.Tensor) -> bool:
    """Equal values, a NaN where there was a NaN (an output may hold NaN: non-finite
    input, or a wrong kernel; it has not changed for that)."""
    if torch.equal(now, then):
        return True
    return (now.is_floating_point() or now.is_complex()) and bool(
        torch.isclose(now, then, rtol=0, atol=0, equal_nan=True).all()
    )


def _first_change(before: torch.Tensor, after: torch.Tensor) -> str:
    changed = torch.nonzero(before != after)
    if len(changed) == 0:  # equal values, unequal bits (NaN, -0.0): name no index
        return "its bits changed"
    return f"{len(changed)} elements changed, first at {tuple(changed[0].tolist())}"


def _storage_values(t: torch.Tensor) -> torch.Tensor:
    """The whole storage under t, as a flat tensor of t's dtype (on the host)."""
    count = t.untyped_storage().nbytes() // t.element_size()
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (count,), (1,))
    return to_host(flat)


def _written_outside(original: torch.Tensor, copy: torch.Tensor) -> Optional[str]:
    """What changed in the copy's storage outside the view the target was given (the
    padding of a padded row, the other parts of a fused qkv projection, the features
    around an MLA slice), or None. The target owns its input's view, never what is
    around it."""
    if copy.device.type == "meta" or original.untyped_storage().nbytes() == original.numel() * original.element_size():
        return None  # the view is its whole storage
    before, after = _storage_values(original), _storage_values(copy)
    inside = torch.zeros(before.numel(), dtype=torch.bool, device=before.device)
    index = torch.arange(before.numel(), device=before.device)
    index = index.as_strided(original.shape, original.stride(), original.storage_offset())
    inside[index.reshape(-1)] = True
    changed = ~inside & ~((before == after) | (before.isnan() & after.isnan()))
    if not bool(changed.any()):
        return None
    first = int(torch.nonzero(changed)[0])
    return (
        f"the target wrote outside the tensors it was given, into the storage around them (padding, the other "
        f"parts of a fused projection): {int(changed.sum())} elements changed, first at storage element {first} "
        f"({before[first].item():g} -> {after[first].item():g})"
    )


# --- process-wide state ---------------------------------------------------------------


def _default_device() -> str:
    getter = getattr(torch, "get_default_device", None)
    return str(getter()) if getter else "cpu"


_STATE: dict[str, tuple[Callable, Callable, str]] = {
    # name: (read, restore, how a target changes it)
    "default dtype": (torch.get_default_dtype, torch.set_default_dtype, "torch.set_default_dtype"),
    "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled, "torch.set_grad_enabled"),
    "default device": (
        _default_device,
        lambda d: torch.set_default_device(None if d == "cpu" else d),
        "torch.set_default_device",
    ),
    "random generator state": (
        torch.random.get_rng_state,
        torch.random.set_rng_state,
        "drawing random numbers or seeding torch's generator",
    ),
}


def _same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


@contextmanager
def state_guard(changes: list):
    """Snapshot process-wide torch state; afterwards restore it and append a message to
    ``changes`` for each part the body left changed."""
    before = {name: read() for name, (read, _, _) in _STATE.items()}
    try:
        yield
    finally:
        for name, (read, restore, how) in _STATE.items():
            now = read()
            if not _same(now, before[name]):
                restore(before[name])
                shown = "" if isinstance(now, torch.Tensor) else f" from {before[name]} to {now}"
                changes.append(
                    f"the target changed torch's {name}{shown} ({how}) and left it "
                    "so; ropecheck restored it after the call"
                )


# --- the call -------------------------------------------------------------------------


class _Watch:
    """The tensors returned by the previous call and a snapshot of them."""

    def __init__(self):
        self.returned: tuple = ()
        self.snapshot: tuple = ()

    def changed(self) -> Optional[str]:
        for now, then in zip(self.returned, self.snapshot):
            if not _unchanged(now, then):
                return _first_change(then, now)
        return None

    def keep(self, outputs):
        tensors = tuple(
            t for t in (outputs if isinstance(outputs, tuple) else (outputs,)) if isinstance(t, torch.Tensor)
        )
        self.returned, self.snapshot = tensors, tuple(t.clone() for t in tensors)


def _normalise(out) -> tuple[Any, str]:
    """(outputs, what came back): a Tensor, or a tuple/list of Tensors (None allowed
    inside), detached; anything else is not sent on (None) and only described."""
    if isinstance(out, torch.Tensor):
        return out.detach(), "a Tensor"
    if isinstance(out, (tuple, list)):
        kinds = ", ".join(dict.fromkeys(type(o).__name__ for o in out))
        what = f"a {type(out).__name__} of {len(out)} ({kinds})"
        if all(o is None or isinstance(o, torch.Tensor) for o in out):
            return tuple(None if o is None else o.detach() for o in out), what
        return None, what
    return None, type(out).__name__


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _raised(exc: BaseException) -> tuple:
    if isinstance(exc, SystemExit):
        return ("exited", f"the target called sys.exit({exc.code!r}){_where(exc)}")
    return ("raised", f"the target raised {describe_exception(exc)}")


def _stages(args: tuple, positions, form: Optional[Form], seen: Optional[dict] = None) -> Stages:
    """The staged call (``forms.drive``) on the canonical x (``args``: (x,)) in the target's
    call form (``ropecheck.calling.forms``): (canonical y, what the target returned);
    through an interface, ``seen`` gets the classes of its argument values the call had."""
    (x,) = args
    if form is not None and form.api:
        return (context_parallel if form.cp_size > 1 else api_call).stages(form, x, positions, seen)
    return (form or Form()).stages(x, positions)


def _invoke(fn: Callable, args: tuple, positions, form: Optional[Form], seen: Optional[dict] = None):
    """(canonical y, what the target returned): fn called on the canonical x in its call form."""
    return drive(_stages(args, positions, form, seen), fn)


# fn -> {mode: fn run in it}: made once per process, so that every Execution of one target
# in this process (the in-process executor makes one per property) calls one compiled
# artefact, as the worker's one Execution does
_IN_MODES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Execution:
    """Runs calls of ``fn`` (any callable taking tensors then positions) in this process."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.watch = _Watch()
        self.timing = timed.Timing(_stages, self.in_mode)  # what ``time`` keeps prepared
        self.opchecked: set = set()  # the classes of custom-op calls opcheck has checked here
        try:
            self.in_modes: dict = _IN_MODES.setdefault(fn, {})  # mode -> fn run in it (ropecheck.modes)
        except TypeError:  # not weakly referenceable (a builtin function): this Execution's own
            self.in_modes = {}

    def in_mode(self, mode: str) -> Callable:
        if mode not in self.in_modes:
            self.in_modes[mode] = modes.wrap(self.fn, mode)
        return self.in_modes[mode]

    def _inputs_violations(self, outcome, originals, copies, positions, pos, inplace, output, form=None):
        if not torch.equal(to_host(pos), positions):
            outcome.violations.append(("mutated", "the target modified its positions argument"))
        (original,), (copy,) = originals, copies
        if inplace:
            if not (isinstance(output, torch.Tensor) and torch.equal(copy, output)):
                outcome.violations.append(("inplace", "declared in-place, but the input does not hold the output"))
        elif not torch.equal(held := to_host(copy), original):
            outcome.violations.append(
                ("mutated", f"the target modified its input x in place ({_first_change(original, held)})")
            )
        # a library interface's tensors are views into wider storage (fused qkv, padded
        # heads, MLA's slices): what is around them is not the target's to write. Read from
        # the tensor the target had: a view copied off a device is its elements alone
        outside = _written_outside(original, copy) if form is not None and form.api else None
        if outside:
            outcome.violations.append(("outside-view", outside))

    def call(
        self,
        args: tuple,
        positions: torch.Tensor,
        inplace: bool = False,
        form: Optional[Form] = None,
        device: str = "cpu",
        mode: str = "eager",
    ) -> Outcome:
        """y = fn(*args, positions) on private copies made on ``device``, in the target's
        call form, run in ``mode``."""
        outcome = Outcome()
        place = Placement(device)
        copies = tuple(place(a) for a in args)
        pos = place(positions)
        with state_guard(outcome.state_changes):
            try:
                with launches.recording() as outcome.launches:
                    out, returned = _invoke(self.in_mode(mode), copies, pos, form, outcome.classes)
            except ReturnedWrong as wrong:
                outcome.error = (wrong.kind, str(wrong))
                return outcome
            except (Exception, SystemExit) as exc:
                outcome.error = _raised(exc)
                return outcome
        aliased = self.watch.changed()
        if aliased:
            outcome.violations.append(
                (
                    "aliased",
                    f"a tensor returned by the previous call changed "
                    f"during this call ({aliased}): it is a view of "
                    "the target's internal buffer",
                )
            )
        outcome.outputs, outcome.returned = _normalise(out)
        # the tensors the target returned (its own, for a call form that assembles y)
        self.watch.keep(outcome.outputs if returned is out else _normalise(returned)[0])
        self._inputs_violations(outcome, args, copies, positions, pos, inplace, outcome.outputs, form)
        outcome.outputs = to_host(outcome.outputs)
        return outcome

    def run(self, request: Request) -> Outcome:
        """One call (the time limit is the executor's): :meth:`call`, :meth:`vjp` or
        :meth:`plain` as ``request.op`` says."""
        r = request
        if r.op == "vjp":
            outcome = self.vjp(r.args, r.positions, r.grads or (), r.inplace, r.form, r.device, r.mode)
        elif r.op == "plain":
            outcome = self.plain(r.args)
        elif r.op == "opcheck":
            outcome = self.opcheck(r)
        else:
            outcome = self.call(r.args, r.positions, r.inplace, r.form, r.device, r.mode)
        outcome.notes = modes.take_notes()
        return outcome

    def time(self, request: timed.TimeRequest) -> timed.Timed:
        """A block of timed samples (``ropecheck.calling.timed``), process-wide torch state
        guarded as around a call."""
        changes: list = []
        with state_guard(changes):
            result = self.timing.run(request)
        if changes:
            result.info["state_changes"] = changes
        return result

    def opcheck(self, r: Request) -> Outcome:
        """``torch.library.opcheck`` on the custom-op calls of one call on ``r``'s inputs
        (a VJP's, x requiring grad, with ``r.grads``), made eagerly on fresh copies (a
        compiling mode's artefact is not traced into; autocast stays on); in compile mode
        also the call compiled with fullgraph=True (``ropecheck.calling.opcheck``)."""
        outcome = Outcome()
        grad = r.grads is not None
        eager = self.fn if r.mode in ("compile", "cudagraph") else self.in_mode(r.mode)

        def call(fn: Callable):
            place = Placement(r.device)
            x = place(r.args[0])
            if grad:
                x = x.detach().requires_grad_(True)
                x = x.clone() if r.inplace else x
            with torch.set_grad_enabled(grad):
                return _invoke(fn, (x,), place(r.positions), r.form)

        with state_guard([]):  # restored, not reported: opcheck's own runs are not the target's calls
            outcome.opcheck = opcheck.check_calls(
                call, eager, opcheck.call_key(r), self.opchecked, fullgraph=r.mode == "compile"
            )
        return outcome

    def plain(self, args: tuple) -> Outcome:
        """fn(*args) for a target that takes no tensors to rotate (a position or table
        builder): its result as it came, tensors detached, for the caller to judge."""
        outcome = Outcome()
        with state_guard(outcome.state_changes):
            try:
                out = self.fn(*args)
            except (Exception, SystemExit) as exc:
                outcome.error = _raised(exc)
                return outcome
        outcome.outputs = _detached(out)
        outcome.returned = type(out).__name__
        return outcome

    def vjp(
        self,
        args: tuple,
        positions: torch.Tensor,
        grads: tuple,
        inplace: bool = False,
        form: Optional[Form] = None,
        device: str = "cpu",
        mode: str = "eager",
    ) -> Outcome:
        """(y, g): y = fn(x, positions) in the target's call form (``args``: (x,)), and
        g = (dy/dx)^T grad through the target's autograd (None where y does not depend on
        x; ``grads``: (grad,)). The incoming gradient is a private copy laid out as the
        caller's (a broadcast, stride-0 gradient stays one)."""
        (x,), (grad,) = args, grads
        outcome = Outcome()
        place = Placement(device)
        leaf = place(x.detach()).requires_grad_(True)
        arg = leaf.clone() if inplace else leaf
        private = place(grad)
        with state_guard(outcome.state_changes):
            torch.set_grad_enabled(True)
            try:
                with launches.recording() as outcome.launches:
                    y, _ = _invoke(self.in_mode(mode), (arg,), place(positions), form, outcome.classes)
            except ReturnedWrong as wrong:
                outcome.error = (wrong.kind, str(wrong))
                return outcome
            except (Exception, SystemExit) as exc:
                outcome.error = _raised(exc)
                return outcome
            grad_mode_left_off = not torch.is_grad_enabled()
            torch.set_grad_enabled(True)
            y_out, outcome.returned = _normalise(y)
            if not isinstance(y, torch.Tensor):
                return outcome  # outputs None: the caller names what came back
            if not y.requires_grad:
                why = (
                    "the target switched grad mode off (torch.set_grad_enabled(False)) and "
                    "left it off, so its output does not require grad"
                    if grad_mode_left_off
                    else "the output does not require grad: autograd does not flow "
                    "through the target (declare --no-backward)"
                )
                outcome.error = ("backward", why)
                return outcome
            try:
                with launches.recording() as backward:
                    (g,) = _grad(y, leaf, private.to(y.dtype) if private.dtype != y.dtype else private)
                outcome.launches.add(backward)
            except (Exception, SystemExit) as exc:
                outcome.error = ("backward", f"backward raised {describe_exception(exc)}")
                return outcome
        if not torch.equal(private := to_host(private), grad):
            outcome.violations.append(
                (
                    "grad-output",
                    f"backward wrote into grad_output "
                    f"({_first_change(grad, private)}): the "
                    "incoming gradient belongs to the caller",
                )
            )
        outcome.outputs = to_host((y_out, None if g is None else g.detach()))
        return outcome


def _grad(y: torch.Tensor, leaf: torch.Tensor, grad: torch.Tensor) -> tuple:
    """``torch.autograd.grad(y, leaf, grad, allow_unused=True)``. Its front door checks the
    gradient's shape through torch's symbolic-shapes module, whose first import (sympy) costs
    a second, more than a ci verdict's calls. Where that module is not loaded yet (an eager
    run), the same check is made here and the engine is called as that front door calls it;
    otherwise (compile runs load it anyway, tensor subclasses) the front door itself."""
    if (
        _engine_run_backward is None
        or "torch.fx.experimental.symbolic_shapes" in sys.modules
        or has_torch_function((y, leaf, grad))
    ):
        return torch.autograd.grad(y, leaf, grad, allow_unused=True)
    if y.shape != grad.shape:  # the front door's words
        raise RuntimeError(
            f"Mismatch in shape: grad_output[0] has a shape of {grad.shape} and output[0] has a shape of {y.shape}."
        )
    return _engine_run_backward((y,), (grad,), False, False, (leaf,), True, accumulate_grad=False)


def _detached(out):  # a builder's result, its tensors detached (a tuple's too: a worker sends it back)
    if isinstance(out, (tuple, list)):
        return type(out)(_detached(t) for t in out)
    return out.detach() if isinstance(out, torch.Tensor) else out
