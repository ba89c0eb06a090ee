"""One Property record for every family, and the Family record that makes a family data.

A Family (1-D RoPE, N-D / M-RoPE, xPos) says how a check's context is made for a target and
a dtype (the Caller, the error model, the family's float64 reference), how inputs are drawn,
which fixed inputs every run tries, and what else a property of the family needs of a
target. A Property is one check, written once against its family's context and cases; it
declares the call forms and capabilities it needs. ``properties.runner.run_property`` runs
any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hypothesis import strategies as st

from ropecheck.properties.registry import property_registry
from ropecheck.properties.sizes import TOY, Sizes
from ropecheck.call_forms import CALL_FORMS
from ropecheck.calling import Caller, CallError, TargetHung
from ropecheck.tolerance import ErrorModel


@dataclass
class FamilyContext:
    """What a check works with, in every family: the target behind its Caller (``rope``:
    the calling layer, its call form, time limit and contract) and the dtype's error model.
    A family's context adds its own helpers (the 1-D convention, the N-D per-axis bound)."""

    target: Any
    dtype: str
    timeout: Optional[float] = 20.0
    sizes: Sizes = TOY  # the sizes its inputs are drawn at (properties.sizes)
    rope: Any = field(init=False)
    model: ErrorModel = field(init=False)
    caller = Caller  # the family's Caller type

    def __post_init__(self):
        self.rope = self.caller(self.target, self.timeout)
        self.model = ErrorModel(self.dtype, extra_ops=self.extra_ops())

    def extra_ops(self) -> int:
        """Operations of the compute dtype the family's outputs take beyond a rotation."""
        return 0


@dataclass(frozen=True)
class SmokeInput:
    """A small ordinary input a run calls the target on before any check."""

    short: str  # "x (1, 4, 2, 8)"
    shown: str  # the whole input, for a crash message
    call: Callable  # call(rope): one call on it through the family's Caller


@dataclass(frozen=True)
class Family:
    name: str
    context: Callable  # (target, dtype, timeout) -> a context with .rope, its Caller
    cases: Callable  # (prop, ctx) -> hypothesis strategy of cases
    fixed: Callable = lambda prop, ctx: []  # (prop, ctx) -> [(case, extras)] every run tries
    # (prop, target) -> (applies, why not): what the family adds to the common needs
    applies: Callable = lambda prop, target: (True, "")
    smoke_inputs: Callable = lambda target, dtype: ()  # (target, dtype) -> [SmokeInput]
    # what a smoke call may fail with, on every input, for the target to be unusable
    unusable: tuple = ("raised",)


def smoke_call(family: Family, target, dtype: str, timeout: Optional[float]) -> Optional[str]:
    """Call the target on its family's small ordinary inputs. None as soon as one call
    returns (right or wrong: the checks judge that), else why none could. A call that
    hangs raises TargetHung, one that crashes the process CallError ("crashed"), each with
    the input in its message."""
    rope = family.context(target, dtype, timeout).rope
    problems = []
    for item in family.smoke_inputs(target, dtype):
        try:
            item.call(rope)
            return None
        except CallError as exc:
            if exc.kind in ("crashed", "exited"):
                raise CallError(exc.kind, f"{exc}\n  on the first, smallest input: {item.shown}") from None
            if exc.kind not in family.unusable:
                return None
            problems.append(f"on {item.short} {dtype}: {exc}")
        except TargetHung as exc:
            raise TargetHung(exc.seconds, f"on {item.short} {dtype}: {exc}") from None
    if not problems:
        return None
    return problems[0] + (f" (and on {len(problems) - 1} other small inputs)" if len(problems) > 1 else "")


@dataclass(frozen=True)
class Property:
    name: str
    formula: str
    check: Callable  # check(ctx, case, **extras) -> float (error in tolerance units)
    family: Any = None  # its Family
    extras: Callable = lambda ctx, case: st.just({})  # strategy of keyword extras
    example_extras: Callable = lambda ctx, case: {}  # extras for the family's fixed inputs
    needs_convention: bool = False
    needs_backward: bool = False
    # compares calls made at different position sets, so it needs theta to be the same
    # in every call: a dynamic scaling (theta from the call's largest position) breaks it
    # by design
    same_theta_across_calls: bool = False
    case_options: dict = field(default_factory=dict)  # what the family's case strategy takes
    # fixed exotic inputs tried after the drawn ones: a refusal is a support note
    probes: Callable = lambda ctx: ()
    # the call forms (ropecheck.call_forms) it is defined for, and why not for the others
    calls: tuple = tuple(CALL_FORMS)
    calls_why: str = ""
    # how many of the fixed large inputs it tries too (strategies.large_cases; at
    # production sizes as many of strategies.production_cases too)
    large: int = 0
    # tries the input past 2^31 elements where the sizes and the device allow it
    # (strategies.huge_case): a check that compares in chunks (bounded memory)
    huge: bool = False
    # needs positions chosen per token (not offset + arange per row, all a target taking
    # per-row offsets accepts)
    per_token_positions: bool = False
    sweeps: bool = False  # the reference agreement: the accuracy sweep and the diagnosis follow it

    def context(self, target, dtype: str, timeout: Optional[float], sizes: Sizes = TOY):
        return self.family.context(target, dtype, timeout, sizes)

    def case_strategy(self, ctx):
        return self.family.cases(self, ctx)

    def fixed(self, ctx) -> list:
        return self.family.fixed(self, ctx)

    def applies_to(self, target) -> tuple[bool, str]:
        call = getattr(target, "call", "x")
        if call not in self.calls:
            return False, f"not defined for call form {call}: {self.calls_why}"
        if self.per_token_positions and getattr(target, "row_offsets", False):
            return False, "needs positions chosen per token; the target takes per-row offsets"
        if self.needs_convention and target.convention is None:
            return False, "needs a declared convention (--layout)"
        if self.needs_backward and not getattr(target, "backward", True):
            return False, "target declares no backward"
        return self.family.applies(self, target)


def family_registry(family: Family) -> tuple[dict, Callable]:
    """(registry, register) of one family's properties."""
    return property_registry(lambda **fields: Property(family=family, **fields))
