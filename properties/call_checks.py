"""The 1-D properties of a target's calls beyond one map (the ``ONE_D`` family; the whole
table is ``properties.checks``): inverse (its own VJP undoes it), statelessness, batch
independence, and the two that need a declared convention, reference agreement and
backward (elementwise against the float64 reference); then the properties of table-fed
library interfaces (``properties.interface_checks``) and of those that quantize their
outputs to fp8 (``properties.quantized_checks``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np
import torch
from hypothesis import strategies as st

from ropecheck.properties.assertions import AXES_3D, CheckFailure, assert_close
from ropecheck.properties.core import normalization
from ropecheck.properties.core.contract import CallError
from ropecheck.properties.core.sizes import TOY, pool_shapes
from ropecheck.properties.inputs.cases import Case, as_float64
from ropecheck.properties.inputs.strategies import (
    FREE_HEAD_DIMS,
    cases,
    example_grad_layout,
    grad_layouts,
    scales,
)
from ropecheck.properties.interface_checks import TABLE_CHECKS
from ropecheck.properties.one_d import (
    Context,
    Probe,
    against_reference,
    eps,
    f64,
    for_interface,
    interface_cases,
    ops,
    register,
    vector_norms,
    vjp_of,
    where_pairs,
)
from ropecheck.properties.quantized_checks import QUANTIZED_CHECKS


@register(
    name="inverse",
    formula="f(f^T(g, m), m) = g, with f^T the target's own VJP",
    needs_backward=True,
    extras=grad_layouts,
    example_extras=example_grad_layout,
)
def inverse(ctx: Context, case: Case, grad_layout: str) -> float:
    p = case.positions_array()
    g = case.tensor(1, memory=grad_layout)
    back = vjp_of(ctx, case.tensor(0), p, g)
    forth = ctx.unscale(f64(ctx, back, p))  # VJP = A R_m^T g carries the amplitude too
    e = eps(ctx, p)
    bound = (2 * e + e * e) * vector_norms(as_float64(g)) + 2 * ctx.model.floor
    return assert_close(
        vector_norms(forth - as_float64(g)),
        0.0,
        bound,
        positions=p,
        axes=AXES_3D,
        what="|f(VJP(g), m) - g| per head vector",
    )


@st.composite
def _distractor(draw, ctx, case):
    # another dtype, as a multi-dtype process calls it; one model (a compiled one) has one
    dtypes = [d for d in ctx.target.dtypes if d != case.dtype and not ctx.sizes.model] or [case.dtype]
    dtype = draw(st.sampled_from(dtypes))
    if getattr(ctx.target, "interface", None) is not None:  # any call its interface takes
        other = draw(interface_cases(ctx, dtype, {}, sizes=ctx.sizes if ctx.sizes.model else TOY))
    else:
        other = draw(
            cases(
                dtype,
                ctx.target.rotary_dim,
                max_position=ctx.max_position,
                call=ctx.target.call,
                k_optional=ctx.target.k_optional,
                row_offsets=ctx.target.row_offsets,
                sizes=ctx.sizes if ctx.sizes.model else TOY,  # one model's shapes in a one-model run
            )
        )
    # the decode calls, one per token after the split: DECODE_CALLS at most
    return {"other": other, "split": draw(st.integers(max(0, case.seq - DECODE_CALLS), case.seq - 1))}


DECODE_CALLS = 64


def _example_distractor(ctx, case):
    """The call a multi-dtype process makes next: the same shape in another dtype, at
    positions past the case's (a cache grown then, in that dtype, is what the case meets)."""
    dtypes = [d for d in ctx.target.dtypes if d != case.dtype and not ctx.sizes.model] or [case.dtype]
    p = case.positions_array()
    later = np.minimum(p + int(p.max()) + 1, ctx.limit(case.head_dim))
    scale = min(case.scale, max(scales(dtypes[0])))  # magnitudes that dtype holds
    other = replace(case, dtype=dtypes[0], scale=scale).with_positions(later)
    return {"other": other, "split": case.seq // 2}


@register(
    name="statelessness",
    formula="f(x, m) is the same before and after other calls, which leave the "
    "tensors it returned untouched; a prefill of tokens [0, s) then one "
    "decode call per later token equals one call",
    extras=_distractor,
    example_extras=_example_distractor,
)
def statelessness(ctx: Context, case: Case, other: Case, split: int) -> float:
    p, x = case.positions_array(), case.tensor()
    returned = ctx.rope(x, torch.from_numpy(p))
    first = as_float64(returned)  # a snapshot
    ctx.rope(case.tensor(5), torch.from_numpy(p))  # same shape, other values
    if not np.array_equal(as_float64(returned), first):
        raise CheckFailure(
            "the tensor returned by a call changed when the target was called "
            "again on an input of the same shape: it is a view of the target's "
            "internal buffer"
        )
    try:  # the other call only changes the target's state; its own result is not judged here
        ctx.rope(other.tensor(), other.positions_tensor(), case=other)
    except CallError:
        pass
    again, first = f64(ctx, x, p), ctx.unscale(first)
    norms = vector_norms(as_float64(x))
    # The same call repeated: the angles are computed the same way, only arithmetic may
    # differ (thread scheduling, vectorised vs scalar tails).
    repeat = assert_close(
        vector_norms(again - first),
        0.0,
        2 * ops(ctx) * norms + ctx.model.floor,
        positions=p,
        axes=AXES_3D,
        what=f"f(x, m) changed after a call on {other.describe()}",
    )
    if ctx.convention is not None and ctx.convention.dynamic:
        return repeat  # decode calls see shorter sequences: other theta, by design

    def piece(x, p):  # views of x; one model's calls get tensors of their own, as a compiled model is handed
        return (x.clone(memory_format=torch.contiguous_format), p.copy()) if ctx.sizes.model else (x, p)

    pieces = [f64(ctx, *piece(x[:, :split], p[:, :split]))] if split else []
    pieces += [f64(ctx, *piece(x[:, t : t + 1], p[:, t : t + 1])) for t in range(split, case.seq)]
    stepwise = np.concatenate(pieces, axis=1)
    # A split may take another path (a decode kernel), so it gets the full allowance.
    bound = 2 * eps(ctx, p) * norms + ctx.model.floor
    split_error = assert_close(
        vector_norms(stepwise - first),
        0.0,
        bound,
        positions=p,
        axes=AXES_3D,
        what=f"prefill of {split} tokens then one-token decode calls against one call",
    )
    return max(repeat, split_error)


@register(
    name="batch-independence",
    formula="f(x, m)[b] = f(x[b], m[b]) for every batch row b (in a pooled run, x[b] repeated over the batch)",
    case_options={"min_batch": 2},
    same_theta_across_calls=True,
    calls=("x", "qk"),
    calls_why="a packed batch has one row (its sequences are checked by reference)",
)
def batch_independence(ctx: Context, case: Case) -> float:
    p, x = case.positions_array(), case.tensor()
    whole = f64(ctx, x, p)
    rows = np.concatenate([_alone(ctx, x, p, b) for b in range(case.batch)], axis=0)
    bound = 2 * eps(ctx, p) * vector_norms(as_float64(x)) + ctx.model.floor
    return assert_close(
        vector_norms(whole - rows), 0.0, bound, positions=p, axes=AXES_3D, what="a batch call against one call per row"
    )


def _alone(ctx: Context, x: torch.Tensor, p: np.ndarray, b: int) -> np.ndarray:
    """Row b called without the others: alone, at batch 1; in a pooled run (``Sizes.pool``:
    a kernel compiled per shape, its batch in the shape) in the batch's own shape, the row
    repeated over it (its first row kept), so that the check adds no compile."""
    if not pool_shapes(ctx.sizes):
        return f64(ctx, x[b : b + 1], p[b : b + 1])
    n = x.shape[0]
    return f64(ctx, x[b : b + 1].repeat(n, *([1] * (x.dim() - 1))), np.repeat(p[b : b + 1], n, axis=0))[:1]


# --- with a declared convention ------------------------------------------------------


def _norm_probes(ctx: Context) -> list:
    """A fused QK-norm interface's packed qkv as a view of a wider buffer (its row stride past
    the heads' width): its kernel may refuse it, a value it returns must be right."""
    interface = getattr(ctx.target, "interface", None)
    if getattr(interface, "norm", "") == "" or ctx.sizes.model:
        return []
    r = ctx.target.rotary_dim
    p = np.minimum(np.array([[0, 1, 2], [4097, 4098, 4099]]), ctx.max_position)
    case = Case(ctx.dtype, 2, 3, 2, r or FREE_HEAD_DIMS[0], tuple(map(tuple, p.tolist())), seed=13, call="qk",
                k_heads=1)  # fmt: skip
    case = for_interface(case, ctx.target)
    case = case.with_choices(**{normalization.STRIDED_QKV[0]: normalization.STRIDED_QKV[1]})
    what = f"a packed qkv whose rows are a view of a wider buffer (row stride + {normalization.ROW_PAD})"
    return [Probe(case, reference_agreement, what)]


@register(
    name="reference",
    formula="f(x, m) = R_m x, the float64 reference of the declared convention, within the error model",
    needs_convention=True,
    large=4,
    huge=True,
    sweeps=True,
    size_switches=True,
    probes=lambda ctx: _norm_probes(ctx),
)
def reference_agreement(ctx: Context, case: Case, windows: Optional[tuple] = None) -> float:
    p, x = case.positions_array(), case.tensor()
    y = ctx.rope(x, torch.from_numpy(np.ascontiguousarray(p)))
    compared = "" if windows is None else f", tokens {', '.join(f'{a}..{b - 1}' for a, b in windows)}"
    return against_reference(
        ctx,
        y,
        x,
        p,
        what=f"f(x, m) against the float64 reference ({where_pairs(ctx, case.head_dim)}{compared})",
        windows=windows,
    )


@register(
    name="backward",
    formula="VJP of f at m: g -> R_m^T g = f(g, -m); adjoint <VJP(g), v> = <g, f(v, m)>",
    needs_backward=True,
    extras=grad_layouts,
    example_extras=example_grad_layout,
    large=1,
)  # the 2^14 token x head input: autograd on all four would cost a third of a run
def backward(ctx: Context, case: Case, grad_layout: str) -> float:
    p = case.positions_array()
    g, v = case.tensor(1, memory=grad_layout), case.tensor(2)
    vjp_returned = vjp_of(ctx, case.tensor(0), p, g)
    vjp = ctx.unscale(as_float64(vjp_returned))
    g64, v64 = as_float64(g), as_float64(v)
    e = eps(ctx, p)
    adjoint = assert_close(
        np.sum(vjp * v64, -1),
        np.sum(g64 * f64(ctx, v, p), -1),
        2 * e * vector_norms(g64) * vector_norms(v64) + ctx.model.floor,
        positions=p,
        axes=AXES_3D,
        what="adjoint identity <VJP(g), v> = <g, f(v, m)> per head",
    )
    if ctx.convention is None:
        return adjoint
    exact = against_reference(ctx, vjp_returned, g, p, inverse=True, what="VJP(g) against R_m^T g = f_ref(g, -m)")
    return max(adjoint, exact)


# the properties of table-fed library interfaces (and of those that quantize), in the same table
for _name, (_fields, _check) in {**TABLE_CHECKS, **QUANTIZED_CHECKS}.items():
    register(name=_name, **_fields)(_check)
