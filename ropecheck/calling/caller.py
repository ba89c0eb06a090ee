"""Calling a target under the contract, from ropecheck's side.

A :class:`Caller` hands each call, as a ``Request``, to the target's executor (its worker
process, or this process: ``ropecheck.calling.execution`` runs the call the same way in
both) and checks what comes back: a tensor, x's shape, dtype and device, finite for finite
input, inputs untouched. Any breach is a ``CallError`` (a finding about the target); a call
that does not return in time is ``TargetHung`` (both ``ropecheck.properties.core.contract``).
It is the ``Rope`` the checks call. Under ``--opcheck`` a call whose class of input is new
is followed by an "opcheck" request on the same input (``ropecheck.calling.opcheck``), what
it said kept in ``Caller.opchecks``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Protocol

import torch

from ropecheck.calling import opcheck
from ropecheck.calling.execution import Outcome, Request
from ropecheck.calling.forms import Form, mismatch
from ropecheck.calling.launches import Recorded
from ropecheck.calling.presets import PRESETS
from ropecheck.calling.timed import Timed, TimeRequest
from ropecheck.properties.core.contract import ROW_FORMS, CallError, TargetHung

DEFAULT_TIMEOUT = 20.0
COMPILING_MODES = ("compile", "cudagraph")
COMPILE_ALLOWANCE = 60.0  # seconds added to the first call of each input signature in a compiling mode


class Executor(Protocol):
    """Where a target's calls run: this process (``in_process.InProcess``) or its worker
    process (``worker.Worker``). ``state_changes``: the process-wide state the target
    changed in any call so far (each restored)."""

    state_changes: list

    def run(self, request: Request) -> Outcome: ...

    def time(self, request: TimeRequest) -> Timed: ...

    def close(self) -> None: ...


class PlainCaller:
    """Calls a target that takes no tensors (a position builder) in its executor, within
    the time limit: its result as it came, or CallError when it raised, exited or crashed
    its process."""

    def __init__(self, executor: Executor, timeout: Optional[float] = DEFAULT_TIMEOUT):
        self.executor, self.timeout = executor, timeout
        self.case = None
        self.state_changes = executor.state_changes

    def __call__(self, *args, case=None):
        outcome = self.executor.run(Request("plain", args, timeout=self.timeout))
        if outcome.error is not None:
            raise CallError(*outcome.error)
        return outcome.outputs

    def vjp(self, *args):
        raise CallError("backward", "a target that takes no tensors has no backward")


# --- the contract ------------------------------------------------------------------------


def validate(y, x: torch.Tensor) -> None:
    """y has x's shape, dtype and device and is finite (x is finite)."""
    problem = mismatch(y, x)
    if problem:
        raise CallError(*problem)
    # a finite sum has no inf or nan among its terms (an overflowing sum of finite values
    # takes the element-wise look): one read, 5x quicker than isfinite's mask
    if not bool(torch.isfinite(y.sum())) and not bool(torch.isfinite(y).all()):
        bad = torch.nonzero(~torch.isfinite(y))[0].tolist()
        raise CallError(
            "non-finite", f"non-finite output {y[tuple(bad)].item()} at index {tuple(bad)} for finite input"
        )


def raise_violations(outcome: Outcome) -> None:
    for kind, message in outcome.violations:
        raise CallError(kind, message)


class Caller:
    """Calls ``target(x, positions)`` under the contract, in the target's call form
    (``ropecheck.call_forms``). Every check goes through it. ``case`` is the input being
    checked: its q/k split and sequence lengths shape the calls made on its tensors."""

    def __init__(
        self,
        executor: Executor,
        call: str = "x",
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        inplace: bool = False,
        device: str = "cpu",
        mode: str = "eager",
        api: str = "",
        convention=None,
        table_rows: int = 0,
        cp_size: int = 1,
        mrope=None,
        takes: tuple = (),
        opcheck: bool = False,
    ):
        self.executor = executor
        self.call = call  # its call form
        self.timeout = timeout
        self.inplace = inplace  # it declares writing its output into x
        self.device = device  # where the inputs are made (--device)
        self.mode = mode  # how the target is run (--mode)
        self.api = api  # the library interface (preset) it is called through ("" none)
        self.convention = convention  # what an interface's table is made from
        self.table_rows = table_rows  # rows of an interface's table indexed by position
        self.cp_size = cp_size  # context-parallel ranks an interface's call is split across
        self.mrope = mrope  # an M-RoPE run through its interface (forms.MRope), None: 1-D
        self.takes = takes  # the optional parameters of its interface its signature has
        self.compiled: set = set()  # input signatures already called in a compiling mode
        self.case = None
        self.paths: set = set()  # the classes of its interface's argument values each call had
        self.launches = Recorded()  # the Triton specializations its calls launched
        self.follow_with_opcheck = opcheck  # --opcheck: new classes of calls followed by opcheck
        self.opchecks: list = []  # what opcheck said of the custom ops its calls made (``opcheck.Called``)

    def form(self, x: torch.Tensor, case=None, table_sign: int = 1) -> Optional[Form]:
        """How a call on x goes to the target: the case's split where x is the case's
        whole input, else the form's default (``Form``); through its interface, with the
        case's choices of its argument classes (``table_sign`` -1: the table of -m)."""
        if self.call == "x" and not self.api:
            return None
        case = case or self.case
        call = self.call
        if self.api and case is not None and getattr(case, "call", call) in ("x", "packed") and call != "qk":
            call = case.call  # an interface that takes a batch and packed sequences: the case's form
        whole = case is not None and getattr(case, "call", "x") == call
        interface: dict = {}
        if self.api:
            interface = dict(
                api=self.api,
                choices=getattr(case, "choices", ()) if case is not None else (),
                memory=getattr(case, "memory", "") if case is not None else "",
                convention=self.convention,
                table_rows=self.table_rows,
                table_sign=table_sign,
                inplace=self.inplace,
                cp_size=self.cp_size,
                mrope=self.mrope,
                takes=self.takes,
            )
        if call in ROW_FORMS:  # tables made from (or applied by) the declared rotation, the case's choices
            return Form(
                call, choices=getattr(case, "choices", ()) if case is not None else (), convention=self.convention
            )
        if call == "x":
            return Form("x", **interface)
        if call == "qk":
            fits = whole and case.heads + case.k_heads == x.shape[2]
            separate = bool(whole and case.separate)
            k_memory = case.k_memory if fits and separate and self.api else ""
            return Form("qk", case.heads if fits else None, separate=separate, k_memory=k_memory, **interface)
        fits = whole and x.shape[0] == 1 and sum(case.lengths) == x.shape[1]
        return Form("packed", lengths=case.lengths if fits else (), **interface)

    @property
    def state_changes(self) -> list:
        """Process-wide state the target changed in any call so far (each restored)."""
        return self.executor.state_changes

    def time_limit(self, op: str, args: tuple, positions: torch.Tensor, form) -> Optional[float]:
        """The call's time limit: ``timeout``, plus COMPILE_ALLOWANCE for a call in a mode
        that builds code for each new input signature (``compile``: dynamo and inductor;
        ``cudagraph``: the capture) when this signature is new: compiling is not the
        kernel's time, and under load it alone can pass the limit."""
        if self.timeout is None or self.mode not in COMPILING_MODES:
            return self.timeout
        key = (op, repr(form), str(positions.dtype), tuple(positions.shape)) + tuple(
            (tuple(a.shape), a.stride(), str(a.dtype)) for a in args
        )
        if key in self.compiled:
            return self.timeout
        self.compiled.add(key)
        return self.timeout + COMPILE_ALLOWANCE

    def request(
        self, op: str, args: tuple, positions: torch.Tensor, grads=None, case=None, table_sign: int = 1
    ) -> Request:
        """The Request of one call on ``args`` (the canonical x) in the target's call form."""
        form = self.form(args[0], case, table_sign)
        limit = self.time_limit(op, args, positions, form)
        inplace = self.inplace or (form is not None and bool(form.api) and PRESETS[form.api].writes_x(form.choices))
        return Request(op, args, positions, grads, inplace, form, self.device, self.mode, limit)

    def outcome(
        self, op: str, args: tuple, positions: torch.Tensor, grads=None, case=None, table_sign: int = 1
    ) -> Outcome:
        request = self.request(op, args, positions, grads, case, table_sign)
        outcome = self.executor.run(request)
        if outcome.classes:
            self.paths.add(tuple(outcome.classes.items()))
        if outcome.launches:
            self.launches.add(outcome.launches)
        if outcome.error is not None:
            raise CallError(*outcome.error)
        if self.follow_with_opcheck:
            self._opcheck(request, case or self.case, outcome.classes)
        return outcome

    def _opcheck(self, request: Request, case, classes: dict) -> None:
        """opcheck on the custom ops a call makes, when its class of input is new to the
        target's process (``opcheck.call_key``): an "opcheck" request on the same inputs,
        its time limit ``opcheck.time_limit``; what it said kept in ``opchecks`` with the
        call in words. A request that hangs or crashes is itself what opcheck said."""
        seen = opcheck.seen_by(self.executor)
        key = opcheck.call_key(request)
        if key in seen or opcheck.STOPPED in seen or not opcheck.followed(request):
            return
        seen.add(key)
        asked = replace(request, op="opcheck", timeout=opcheck.time_limit(request.timeout))
        try:
            outcome = self.executor.run(asked)
            called = outcome.opcheck or opcheck.failed_request(outcome.error, key, seen)
        except TargetHung as hung:
            called = opcheck.failed_request(("hung", str(hung)), key, seen)
        self.opchecks.append(called.described(opcheck.call_words(request.args[0], case, classes)))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, case=None, table_sign: int = 1) -> torch.Tensor:
        """y = f(x, positions); the target works on copies, checked afterwards. For a
        table-fed interface, ``table_sign=-1`` feeds it the table of -m."""
        outcome = self.outcome("call", (x,), positions, case=case, table_sign=table_sign)
        if not isinstance(outcome.outputs, torch.Tensor):
            raise CallError("type", f"the target returned {outcome.returned}, expected a torch.Tensor")
        validate(outcome.outputs, x)
        raise_violations(outcome)
        return outcome.outputs

    def vjp(self, x: torch.Tensor, positions: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """The vector-Jacobian product g^T df/dx at x, through the target's autograd; the
        incoming gradient stays the caller's (a backward writing into it is a finding)."""
        outcome = self.outcome("vjp", (x,), positions, (grad,))
        if outcome.outputs is None:
            raise CallError("type", f"the target returned {outcome.returned}, expected a torch.Tensor")
        y, g = outcome.outputs
        validate(y, x)
        if g is None:
            raise CallError("backward", "backward returned no gradient for x")
        validate(g, x)
        raise_violations(outcome)
        return g
