"""The 1-D RoPE family: ``rope(x, positions)`` with positions (batch, seq), in any call form.

Its record (``ONE_D``): the context a check works with (the target behind its caller,
the dtype's error model, the declared convention), how inputs are drawn, the fixed inputs
every run tries, the smoke inputs, and what its parameters declare (the convention);
and the pieces its checks (``properties.checks``) share: f in float64, the error bound
per unit of head-vector norm, the VJP.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np
import torch

from ropecheck.properties import device_reference, size_switches
from ropecheck.properties.assertions import Tally
from ropecheck.properties.convention import Convention
from ropecheck.properties.core.contract import CALL_FORMS, Subject
from ropecheck.properties.core.dtypes import torch_dtype
from ropecheck.properties.core.sizes import huge_fits, pool_shapes
from ropecheck.properties.inputs.cases import MEMORY_LAYOUTS, Case, as_float64
from ropecheck.properties.inputs.fixed_cases import (
    counts_up,
    critical_cases,
    for_model,
    huge_case,
    large_cases,
    onto_pool,
    production_cases,
    switch_cases,
    within,
)
from ropecheck.properties.inputs.strategies import (
    MAX_POSITION,
    PACKED_MEMORY,
    cases,
    head_dim_choices,
    max_position_for,
    model_qk_heads,
    shape_head_dim,
)
from ropecheck.properties.interfaces import draws
from ropecheck.properties.property import Declaration, Family, FamilyContext, FamilyError, SmokeInput, family_registry
from ropecheck.reference.rope import DEFAULT_BASE, rotated_pairs
from ropecheck.reference.scaling import Scaling


@dataclass
class Context(FamilyContext):
    """The 1-D family's context: the declared convention, its amplitude and position range."""

    @property
    def max_position(self) -> int:
        """The largest position drawn: 2^24, or less where the target declares less."""
        return min(MAX_POSITION, self.target.max_position or MAX_POSITION)

    def limit(self, head_dim: int) -> int:
        """The largest position any call on this head size may use, shifts and steps
        included: the declared range, and the memory budget of a target that tabulates
        cos/sin up to the largest position it sees (``strategies.max_position_for``)."""
        return min(self.max_position, max_position_for(head_dim))

    def extra_ops(self) -> int:
        return 0 if self.amplitude == 1.0 else 1  # the amplitude's product

    @property
    def convention(self):
        return self.target.convention

    @property
    def amplitude(self) -> float:
        """A declared attention factor A (f = A R_m x on the rotated block), else 1."""
        return 1.0 if self.convention is None else self.convention.amplitude

    def unscale(self, y64: np.ndarray) -> np.ndarray:
        """An output in float64 with the declared amplitude divided out: every check then
        reads the rotation R_m x itself."""
        return y64 if self.convention is None else self.convention.unscale(y64)


def interface_cases(ctx: Context, dtype: str, options: dict, calls: tuple = (), sizes=None):
    """The inputs of a target called through a library interface: rows of its argument
    space, cut to what a property takes (its call forms, its ``case_options``), then an
    input in each (``interfaces.draws``). ``calls``: the forms it takes (() all);
    ``sizes``: the run's unless given."""
    space = ctx.target.interface.space
    forms = calls or tuple(CALL_FORMS)
    return draws.row_cases(
        draws.property_space(space, forms, options),
        dtype,
        ctx.target.rotary_dim,
        ctx.target.call,
        sizes=sizes or ctx.sizes,
        max_position=min(options.get("max_position", MAX_POSITION), ctx.max_position),
        min_seq=options.get("min_seq", 1),
        max_seq=options.get("max_seq"),
        positions=options.get("positions", True),
        row_offsets=ctx.target.row_offsets,
    )


def for_interface(case: Case, target: Subject) -> Case:
    """A fixed input as the target's interface takes it: a memory layout of its space (else
    its first), the classes of the factors a call passes (a format, a dtype, a flag: those
    that ask nothing of the input) from a row of its plan chosen by the input's seed, and
    k's own layout chosen so too."""
    iface = getattr(target, "interface", None)
    if iface is None or not iface.space.factors:
        return case
    space = iface.space
    layouts = _names(space, "memory", case.call)
    if layouts and case.memory not in layouts:
        case = replace(case, memory="contiguous" if "contiguous" in layouts else layouts[0])
    row = space.plan[case.seed % len(space.plan)]
    passed = tuple((f.name, row[f.name]) for f in space.factors if not any(c.realize for c in f.classes))
    case = replace(case, choices=passed)
    own = [m for m in _names(space, "k_memory", case.call) if m]
    if own and case.call == "qk" and case.separate and case.k_heads:
        case = replace(case, k_memory=own[(case.seed + 1) % len(own)])
    return case


def _names(space, key: str, call: str) -> list:
    """The values of a realization key the space's classes take (memory layouts, k's layouts)
    for a call in ``call``."""
    out = [c.settings[key] for f in space.factors for c in f.classes if key in c.settings]
    return [m for m in dict.fromkeys(out) if call != "packed" or key != "memory" or m in PACKED_MEMORY]


def _case_options(prop, ctx: Context) -> dict:
    """What the property's cases take. In one model's run (``Sizes.one_model``) a call that
    records for backward has a sequence longer than one token, as a training step has: a
    single token is decode's, an inference call, and a compiled backward of it is a graph
    no trainer makes (dynamo specialises a size of 1)."""
    options = dict(prop.case_options)
    if ctx.sizes.model and prop.needs_backward:
        options["min_seq"] = max(options.get("min_seq", 1), 2)
    return options


def _one_d_cases(prop, ctx: Context):
    options = _case_options(prop, ctx)
    if getattr(ctx.target, "interface", None) is not None:
        return interface_cases(ctx, ctx.dtype, options, prop.calls)
    options["max_position"] = min(options.get("max_position", MAX_POSITION), ctx.max_position)
    return cases(
        ctx.dtype,
        ctx.target.rotary_dim,
        call=ctx.target.call,
        sizes=ctx.sizes,
        k_optional=ctx.target.k_optional,
        row_offsets=ctx.target.row_offsets,
        **options,
    )


def _example_fits(options: dict, case) -> bool:
    return (
        case.batch >= options.get("min_batch", 1)
        and options.get("min_seq", 1) <= case.seq <= options.get("max_seq", case.seq)
        and case.memory in options.get("memory", (case.memory,))
    )


def _fixed_inputs(prop, ctx: Context) -> list:
    """The fixed inputs: the critical cases, and the large ones for a property that
    promises to try them; in the target's call form, within its position range."""
    call, r, options = ctx.target.call, ctx.target.rotary_dim, _case_options(prop, ctx)
    fixed = critical_cases(ctx.dtype, r, call)
    if ctx.convention is not None:  # calls of a length just below, at and above each switch
        fixed += switch_cases(ctx.dtype, ctx.convention.scaling.switches(), r, call)
    small = len(fixed)
    if prop.large:
        fixed += large_cases(ctx.dtype, r, call)[: prop.large]
        fixed += production_cases(ctx.dtype, r, call, ctx.sizes)[: prop.large]
    # a pooled run's shapes (``Sizes.pool``: a target that compiles per shape)
    fixed = [onto_pool(case, ctx.sizes, r, large=n >= small) for n, case in enumerate(fixed)]
    if call == "qk" and ctx.target.k_optional and getattr(ctx.target, "interface", None) is not None:
        # an interface that takes key=None (MLA, cross-attention) is given it every run
        fixed += [replace(case, k_heads=0, separate=False) for case in fixed[:2]]
    fixed = [for_interface(case, ctx.target) for case in fixed]
    if ctx.sizes.model:  # one model's shapes (the huge input keeps its own: past 2^31 elements)
        layouts = tuple(options.get("memory", MEMORY_LAYOUTS))
        fixed = [for_model(case, ctx.sizes, r, layouts) for case in fixed]
    interface = getattr(ctx.target, "interface", None)
    if prop.sweeps and interface is not None and interface.space.factors:
        # a row of the interface's plan each: every pair of its argument classes, every run
        fixed += draws.plan_cases(
            interface.space,
            ctx.dtype,
            r,
            call,
            sizes=ctx.sizes,
            max_position=ctx.max_position,
            row_offsets=ctx.target.row_offsets,
        )
    if prop.huge and huge_fits(ctx.sizes, ctx.target.device, ctx.dtype):
        huge = huge_case(ctx.dtype, r, call)
        pooled = onto_pool(huge, ctx.sizes, r, large=True)  # past 2^31 elements in the pool's shape too
        fixed.append(for_interface(pooled if np.prod(pooled.shape) >= np.prod(huge.shape) else huge, ctx.target))
    out = []
    for case in fixed:
        if not _example_fits(options, case) or (ctx.target.row_offsets and not counts_up(case)):
            continue
        p = case.positions_array()
        if options.get("positions", True) is False:
            case = case.with_positions(np.zeros_like(p))
            if call == "packed":  # sequences of one token each
                case = replace(case, lengths=(1,) * case.seq)
        elif p.max() > ctx.max_position:
            case = within(case, ctx.max_position, ctx.target.row_offsets)
        out.append((case, prop.example_extras(ctx, case)))
    return out


def _same_theta(prop, target: Subject) -> tuple[bool, str]:
    if prop.same_theta_across_calls and target.convention is not None and target.convention.dynamic:
        return False, ("not promised: the declared dynamic scaling takes theta from each call's largest position")
    return True, ""


SMOKE_SHAPES = ((1, 4, 2), (2, 3, 3), (1, 1, 1))  # (batch, seq, heads)
SMOKE_HEAD_DIMS = (8, 64, 128)


def _smoke_inputs(target: Subject, dtype: str):
    head_dims = (target.rotary_dim,) if target.rotary_dim else SMOKE_HEAD_DIMS
    for head_dim in head_dims:
        for batch, seq, heads in SMOKE_SHAPES:
            x = torch.randn(batch, seq, heads, head_dim, generator=torch.Generator().manual_seed(0), device="cpu").to(
                torch_dtype(dtype)
            )
            positions = torch.arange(seq, dtype=torch.int64, device="cpu").repeat(batch, 1)
            yield SmokeInput(
                f"x {tuple(x.shape)}",
                f"x: shape {tuple(x.shape)} {dtype}, contiguous, standard normal (seed 0); "
                f"positions 0 .. {seq - 1} in every row",
                lambda rope, x=x, positions=positions: rope(x, positions),
            )


def _declare(parameters: dict, own) -> Declaration:
    """The convention the parameters declare: ``layout`` makes one (with ``base``,
    ``rotary_dim``, ``scaling`` and ``rotated_fraction``); without it the target's own
    convention stands, its base, rotary dim, scaling and rotated fraction overridden by those
    given; a scaling or a rotated fraction needs a convention."""
    layout, base, rotary_dim, scaling, fraction = (
        parameters.get(k) for k in ("layout", "base", "rotary_dim", "scaling", "rotated_fraction")
    )
    if isinstance(base, (list, tuple)):
        raise FamilyError("1-D RoPE takes one --base (one per axis is --family axial's --nd-base)")
    try:
        if layout is not None:
            conv = Convention(
                layout, DEFAULT_BASE if base is None else base, rotary_dim, scaling or Scaling(), fraction or 1.0
            )
        elif own is not None:
            conv = Convention(
                own.layout,
                base or own.base,
                rotary_dim or own.rotary_dim,
                scaling or own.scaling,
                fraction or own.rotated_fraction,
            )
        elif scaling is not None or fraction is not None:
            raise FamilyError(
                f"{'--scaling' if scaling is not None else '--rotated-fraction'} needs a declared convention: "
                "give --layout too"
            )
        else:
            conv = None
    except FamilyError:
        raise
    except ValueError as exc:
        raise FamilyError(str(exc)) from None
    return Declaration(conv, rotary_dim=rotary_dim or (conv.rotary_dim if conv else None))


def _size_inputs(prop, ctx: Context) -> tuple:
    """The inputs that cross the size switch points (``size_switches``), in each call form
    the target takes (an interface's: every form its space calls), as its interface takes
    them; and what of them its position range leaves out."""
    calls: tuple = (ctx.target.call,)
    interface = getattr(ctx.target, "interface", None)
    if interface is not None:
        forms = [c.settings.get("call") for f in interface.space.factors for c in f.classes]
        calls = tuple(dict.fromkeys(f for f in forms if f)) or calls
    model = None
    if ctx.sizes.model:  # one model's heads and head size (a compiled one's)
        head_dim = head_dim_choices(ctx.target.rotary_dim, ctx.sizes)[0]
        q, k = model_qk_heads(ctx.sizes) if ctx.target.call == "qk" else (max(ctx.sizes.heads), 0)
        model = (q, k, head_dim)
    elif pool_shapes(ctx.sizes):  # a pooled run: the pool's shape with the most heads
        qk = ctx.target.call == "qk"
        shape = max(pool_shapes(ctx.sizes), key=lambda s: s.q_heads if qk else s.heads)
        head_dim = shape_head_dim(shape, ctx.target.rotary_dim, ctx.sizes)
        model = (shape.q_heads, shape.k_heads, head_dim) if qk else (shape.heads, 0, head_dim)
    sizes = size_switches.inputs(ctx.dtype, ctx.target.rotary_dim, calls, ctx.max_position, ctx.sizes.production, model)

    def dressed(make):
        return lambda count: for_interface(make(count), ctx.target)

    inputs = [replace(size, case=for_interface(size.case, ctx.target), make=dressed(size.make)) for size in sizes]
    return inputs, size_switches.untried(ctx.max_position)


# 1-D RoPE: rope(x, positions) with positions (batch, seq), in any call form
ONE_D = Family(
    "rope",
    Context,
    _one_d_cases,
    _fixed_inputs,
    _same_theta,
    _smoke_inputs,
    declare=_declare,
    size_inputs=_size_inputs,
    range_probe=True,
    description="rope(x, positions) -> y, positions int64 (batch, seq) (1-D RoPE)",
)
# its properties (``properties.checks``: registered by map_checks, then call_checks)
ONE_D_PROPERTIES: dict
ONE_D_PROPERTIES, register = family_registry(ONE_D)


@dataclass(frozen=True)
class Probe:
    """An exotic input (no model produces it): the target may refuse it, but a value it
    returns must be right. ``what`` names it in a support note."""

    case: Case
    check: Callable  # check(ctx, case) -> float
    what: str


# --- shared pieces -----------------------------------------------------------------


def vector_norms(v: np.ndarray) -> np.ndarray:
    return np.linalg.norm(v, axis=-1)


def eps(ctx: Context, positions: np.ndarray) -> np.ndarray:
    """Allowed error of f(., positions) per unit of head-vector norm, shape (b, s, 1)."""
    return ctx.model.vector_unit_bound(positions)


def ops(ctx: Context) -> float:
    """Allowed error per unit norm from arithmetic alone (angle errors cancel)."""
    return float(ctx.model.norm_bound(1.0))


def f64(ctx: Context, x: torch.Tensor, positions: np.ndarray) -> np.ndarray:
    """f(x, m) in float64, the declared amplitude divided out."""
    return ctx.unscale(as_float64(ctx.rope(x, torch.from_numpy(np.ascontiguousarray(positions)))))


def vjp_of(ctx: Context, x: torch.Tensor, positions: np.ndarray, g: torch.Tensor) -> torch.Tensor:
    """The target's own VJP at (x, m) applied to g (a tensor: it is fed back to f)."""
    return ctx.rope.vjp(x, torch.from_numpy(np.ascontiguousarray(positions)), g)


def shift_range(ctx: Context, case: Case) -> tuple[int, int]:
    """Shifts c that keep every position in 0 .. the case's limit."""
    positions = case.positions_array()
    return -int(positions.min()), ctx.limit(case.head_dim) - int(positions.max())


def where_pairs(ctx: Context, head_dim: int) -> str:
    c = ctx.convention
    out = f"{c.layout} layout, base {c.base:g}, rotary_dim {c.rotary_dim_for(head_dim)}"
    if c.rotated_fraction < 1.0:
        still = rotated_pairs(c.rotary_dim_for(head_dim), c.rotated_fraction)
        out += f", rotated fraction {c.rotated_fraction:g} (pairs {still} on do not turn)"
    if c.scaling.rope_type != "default":
        out += f", {c.scaling.rope_type} scaling"
    return out


# Elements the float64 reference is computed on at a time: a chunk's float64 arrays (x,
# the reference, the bound, the output and numpy's temporaries, about a dozen of 32 MiB)
# stay near 400 MiB whatever the input's size.
REFERENCE_CHUNK = 2**22


def against_reference(
    ctx: Context,
    y: torch.Tensor,
    x: torch.Tensor,
    p: np.ndarray,
    *,
    what: str,
    inverse: bool = False,
    windows: Optional[tuple] = None,
) -> float:
    """y (the target's output, or its VJP, as it returned it) against the float64 reference
    R_m x (``inverse``: R_m^T x), a chunk of the sequence at a time: only y and x are held
    whole, in their dtype. A dynamic scaling's theta comes from the whole call.
    ``windows``: ((start, stop), ...) of the sequence, the only tokens compared (an input
    far larger than what it checks: ``size_switches``)."""
    batch, seq, heads, head_dim = x.shape
    step = max(1, REFERENCE_CHUNK // max(batch * heads * head_dim, 1))
    seq_len = ctx.convention.seq_len(p)
    tally = Tally()
    device = device_reference.device_for(ctx.target, x)  # a large input on a CUDA device: there
    for first, stop in windows or ((0, max(seq, 1)),):
        for start in range(first, stop, step):
            part = slice(start, min(start + step, stop))
            at = p[:, part]
            if device is not None:
                _, expected, bound = device_reference.reference_and_bound(
                    ctx, x[:, part], at, inverse=inverse, seq_len=seq_len, device=device
                )
                if start == first:  # the host's reference judges the device's, on a chunk of each input
                    device_reference.judge(ctx, x[:, part], at, expected, bound, inverse=inverse, seq_len=seq_len)
                actual = device_reference.unscaled(ctx, y[:, part], device)
                tally.add(actual, expected, bound, offset=(0, start))
                continue
            x64 = as_float64(x[:, part])
            expected = ctx.convention.apply(x64, at, inverse=inverse, seq_len=seq_len)
            bound = ctx.model.element_bound(x64, at, ctx.convention, seq_len=seq_len)
            tally.add(ctx.unscale(as_float64(y[:, part])), expected, bound, offset=(0, start))
    return tally.verdict(what=what, positions=p)
