"""One Property record for every family, and the Family record that makes a family data.

A Family (1-D RoPE, N-D / M-RoPE, xPos) says how a check's context is made for a target and
a dtype (the Caller, the error model, the family's float64 reference), how inputs are drawn,
which fixed inputs every run tries, and what else a property of the family needs of a
target. A Property is one check, written once against its family's context and cases; it
declares the call forms and capabilities it needs. ``properties.runner.run_property`` runs
any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from hypothesis import strategies as st

from ropecheck.properties.core.contract import CALL_FORMS, TENSOR_FORMS, CallError, Subject, TargetHung
from ropecheck.properties.core.sizes import TOY, Sizes
from ropecheck.properties.registry import property_registry
from ropecheck.properties.tolerance import ErrorModel

NORM_HEAD_DIM = 576  # the widest head a norm before the rotation is judged at when no input says (MLA's)


@dataclass
class FamilyContext:
    """What a check works with, in every family: the target (``interface.Subject``) and the
    callable that calls it under the contract (``rope``: its call form, time limit and
    contract, from ``target.caller``) and the dtype's error model (``model``). A family's
    context adds its own helpers (the 1-D convention, the N-D per-axis bound)."""

    target: Subject
    dtype: str
    timeout: Optional[float] = 20.0
    sizes: Sizes = TOY  # the sizes its inputs are drawn at (properties.core.sizes)
    rope: Any = field(init=False)
    # (fp8 format ("" none), a norm's head size (0 none)) -> its ErrorModel
    models: dict = field(init=False, default_factory=dict)

    def __post_init__(self):
        self.rope = self.target.caller(self.timeout)

    @property
    def model(self) -> ErrorModel:
        """The error model of the input being checked: the dtype's, with the table an
        interface is fed and the fp8 format it quantizes this input's outputs to (its
        ``quantize_dtype`` choice: ``interface.Interface.output_format``)."""
        interface = getattr(self.target, "interface", None)
        case = getattr(self.rope, "case", None)
        choices = getattr(case, "choices", ()) or ()
        quantized = interface.output_format(choices) if interface is not None else ""
        # a norm before the rotation reduces over the head: its error grows with the head size
        # (the largest a run draws where no input is being checked)
        norm = (getattr(case, "head_dim", 0) or NORM_HEAD_DIM) if getattr(interface, "norm", "") else 0
        if (quantized, norm) not in self.models:
            table = getattr(interface, "table", None)
            self.models[quantized, norm] = ErrorModel(
                self.dtype,
                extra_ops=self.extra_ops(),
                table_kind=table.kind if table is not None else "",
                table_dtype=table.dtype_for(self.dtype) if table is not None else "",
                quantized=quantized,
                norm_features=norm,
            )
        return self.models[quantized, norm]

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
class Declaration:
    """What a family's parameters say a target computes and takes (``Family.declare``):
    its convention, position axes, the head sizes to draw, the rotated features, the
    largest position the family's checks use, and the dtypes checked by default (None:
    the target's own)."""

    convention: Any = None
    n_axes: int = 1
    head_dims: tuple = ()
    rotary_dim: Optional[int] = None
    max_position: Optional[int] = None
    dtypes: Optional[tuple] = None
    coordinates: Any = None  # N-D: the positions' kind, ranges, scale and offset (None: token indices)


RANGE_PROBE = "position-range"  # the probe a 1-D run starts with (properties.position_range)


class FamilyError(ValueError):
    """Parameters a family cannot make a convention of (a usage error)."""


@dataclass(frozen=True)
class Family:
    """A family of targets (``--family``): how its checks are run, which properties it has,
    and what its parameters declare. Several families may share one set of properties
    (axial, mrope and nd: the N-D checks) with their own ``declare``."""

    name: str
    context: Callable  # (target, dtype, timeout, sizes) -> a context with .rope
    cases: Callable  # (prop, ctx) -> hypothesis strategy of cases
    fixed: Callable = lambda prop, ctx: []  # (prop, ctx) -> [(case, extras)] every run tries
    # (prop, target) -> (applies, why not): what the family adds to the common needs
    applies: Callable = lambda prop, target: (True, "")
    smoke_inputs: Callable = lambda target, dtype: ()  # (target, dtype) -> [SmokeInput]
    # what a smoke call may fail with, on every input, for the target to be unusable
    unusable: tuple = ("raised",)
    properties: dict = field(default_factory=dict)  # its properties by name (filled by its registry)
    calls: tuple = TENSOR_FORMS  # the call forms its targets may take, the first the default
    # (parameters: dict, own convention or None) -> Declaration; raises FamilyError
    declare: Callable = lambda parameters, own: Declaration(own)
    # (prop, ctx) -> (the inputs that cross a kernel's size switches, what of them the run
    # leaves out, in words: properties.size_switches)
    size_inputs: Callable = lambda prop, ctx: ([], "")
    range_probe: bool = False  # a run starts with the position-range probe (1-D RoPE)
    description: str = ""  # the contract of its targets, one line

    def variant(self, name: str, declare: Callable, description: str = "", **changes) -> "Family":
        """A family with this one's checks and properties, another name and declaration."""
        return replace(self, name=name, declare=declare, description=description or self.description, **changes)

    def selected(self, names=()) -> list:
        """Its properties named (all of them without names; the position-range probe is
        not one of them: ``probes_range``); FamilyError for an unknown one."""
        probe = (RANGE_PROBE,) if self.range_probe else ()
        unknown = [n for n in names or () if n not in self.properties and n not in probe]
        if unknown:
            raise FamilyError(f"unknown properties {unknown}; known here: {', '.join([*probe, *self.properties])}")
        if not names:
            return list(self.properties.values())
        return [self.properties[n] for n in names if n not in probe]

    def probes_range(self, names=()) -> bool:
        """Whether a run of the properties ``names`` starts with the position-range probe."""
        return self.range_probe and (not names or RANGE_PROBE in names)


def smoke_call(family: Family, target, dtype: str, timeout: Optional[float], launches=None) -> Optional[str]:
    """Call the target on its family's small ordinary inputs. None as soon as one call
    returns (right or wrong: the checks judge that), else why none could. A call that
    hangs raises TargetHung, one that crashes the process CallError ("crashed"), each with
    the input in its message. ``launches`` (a ``calling.launches.Recorded``) gets the
    Triton kernels the calls launched."""
    rope = family.context(target, dtype, timeout).rope
    problems = []
    for item in family.smoke_inputs(target, dtype):
        try:
            item.call(rope)
            if launches is not None and getattr(rope, "launches", None):
                launches.add(rope.launches)
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
    # tries its family's inputs that cross the size switch points, a failure searched down to its boundary
    size_switches: bool = False
    # needs a table-fed library interface (--api with a table: ropecheck makes the table)
    needs_table: bool = False
    # needs an interface that quantizes its outputs (Interface.quantized; with needs_table)
    needs_quantized: bool = False

    def context(self, target: Subject, dtype: str, timeout: Optional[float], sizes: Sizes = TOY):
        return self.family.context(target, dtype, timeout, sizes)

    def case_strategy(self, ctx):
        return self.family.cases(self, ctx)

    def fixed(self, ctx) -> list:
        return self.family.fixed(self, ctx)

    def size_inputs(self, ctx) -> tuple:
        return self.family.size_inputs(self, ctx) if self.size_switches else ([], "")

    def applies_to(self, target: Subject) -> tuple[bool, str]:
        call = target.call
        if call not in self.calls:
            return False, f"not defined for call form {call}: {self.calls_why}"
        if self.per_token_positions and target.row_offsets:
            return False, "needs positions chosen per token; the target takes per-row offsets"
        if self.needs_convention and target.convention is None:
            return False, "needs a declared convention (--layout)"
        if self.needs_backward and not target.backward:
            return False, "target declares no backward"
        if not self.offered_to(target):
            if self.needs_quantized:
                return False, "needs a library interface that quantizes its outputs to fp8 (--api)"
            return False, "needs a table-fed library interface (--api with a table)"
        return self.family.applies(self, target)

    def offered_to(self, target: Subject) -> bool:
        """Whether a run lists this property for ``target`` at all: a table-fed library
        interface's property (``needs_table``) is not listed, as a skipped row in every
        table, for a target called without such an interface (asked for by name, it is
        listed and skipped with the reason); likewise a quantizing interface's property
        (``needs_quantized``) for a target called through one that does not quantize."""
        interface = getattr(target, "interface", None)
        if self.needs_quantized and not getattr(interface, "quantized", ()):
            return False
        return not self.needs_table or getattr(interface, "table", None) is not None


def family_registry(family: Family) -> tuple[dict, Callable]:
    """(registry, register) of one family's properties: the registry is the family's own
    ``properties``."""
    return property_registry(lambda **fields: Property(family=family, **fields), family.properties)
