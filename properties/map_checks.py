"""Contract and the spec-free laws of the map, for 1-D RoPE (the ``ONE_D`` family,
``properties.one_d``; the whole table is ``properties.checks``): identity, linearity,
orthogonality, relativity, translation, the group law, invertibility. Each reads like its
formula; the spec-free ones need no convention and compare whole head vectors (the pairing
is unknown), invertibility elementwise on u = (1, .., 1).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
from hypothesis import strategies as st

from ropecheck.properties.assertions import AXES_3D, assert_close, assert_moved
from ropecheck.properties.core.contract import CallError
from ropecheck.properties.inputs.cases import EXOTIC_LAYOUTS, LAYOUTS, MEMORY_LAYOUTS, Case, as_float64
from ropecheck.properties.inputs.fixed_cases import in_form, onto_pool, within
from ropecheck.properties.inputs.strategies import (
    FREE_HEAD_DIMS,
    SCORES_MAX_SEQ,
    position_grids,
)
from ropecheck.properties.one_d import (
    Context,
    Probe,
    eps,
    f64,
    for_interface,
    ops,
    register,
    shift_range,
    vector_norms,
)

# --- contract ----------------------------------------------------------------------


def _state_unchanged(ctx: Context) -> None:
    if ctx.rope.state_changes:
        raise CallError("state", "; ".join(ctx.rope.state_changes))


@register(
    name="contract",
    formula="y = f(x, m) has x's shape and dtype, is finite, leaves x, m and torch's "
    "process-wide state untouched, and f(view) = f(view.contiguous()) for the "
    "memory layouts models produce; exotic views are probed",
    case_options={"memory": tuple(m for m in MEMORY_LAYOUTS if m != "contiguous")},
    probes=lambda ctx: _layouts_probe(ctx),
)
def contract(ctx: Context, case: Case) -> float:
    x, p = case.tensor(), case.positions_array()
    fresh = x.clone(memory_format=torch.contiguous_format)  # new storage, offset 0
    strided, compact = f64(ctx, x, p), f64(ctx, fresh, p)
    _state_unchanged(ctx)
    bound = 2 * eps(ctx, p) * vector_norms(as_float64(x)) + ctx.model.floor
    return assert_close(
        vector_norms(strided - compact),
        0.0,
        bound,
        positions=p,
        axes=AXES_3D,
        what=f"f(x, m) on a {case.memory} view differs from f on its contiguous copy",
    )


def _odd_head_agrees(ctx: Context, case: Case) -> float:
    """An odd head size the target accepted: its rotated block is f of that block alone
    (head_dim = rotary_dim) and the odd tail passes through unchanged."""
    r = ctx.target.rotary_dim
    x, p = case.tensor(), case.positions_array()
    whole, block = f64(ctx, x, p), f64(ctx, x[..., :r].contiguous(), p)
    x64 = as_float64(x)
    bound = 2 * eps(ctx, p) * vector_norms(x64[..., :r]) + ctx.model.floor
    rotated = assert_close(
        vector_norms(whole[..., :r] - block),
        0.0,
        bound,
        positions=p,
        axes=AXES_3D,
        what=f"f(x, m) on head_dim {case.head_dim} against f on its first {r} features",
    )
    tail = assert_close(
        whole[..., r:],
        x64[..., r:],
        ctx.model.pass_through_bound(x64)[..., r:],
        positions=p,
        what=f"the features past --rotary-dim {r} (must pass through)",
    )
    return max(rotated, tail)


def _layouts_probe(ctx: Context) -> list:
    """One small input per exotic memory layout, and an odd head size when the rotary
    dimension is partial (every head size a model uses is even). None in a one-model run
    (``Sizes.one_model``): a compiled or captured model is handed one layout and one head
    size; the eager run probes the others."""
    if ctx.sizes.model:
        return []
    r = ctx.target.rotary_dim
    p = np.minimum(np.array([[0, 1, 2], [4097, 4098, 4099]]), ctx.max_position)
    base = Case(ctx.dtype, 2, 3, 2, r or FREE_HEAD_DIMS[0], tuple(map(tuple, p.tolist())), seed=11)
    probes = [Probe(replace(base, memory=m), contract, LAYOUTS[m].what) for m in EXOTIC_LAYOUTS]
    if r:
        probes.append(
            Probe(
                replace(base, head_dim=r + 1), _odd_head_agrees, f"an odd head_dim ({r + 1}) around a rotary dim of {r}"
            )
        )

    def shaped(case: Case) -> Case:  # a pooled run's shapes (``Sizes.pool``), the odd head size kept
        in_call = in_form(case, ctx.target.call)
        return in_call if case.head_dim != base.head_dim else onto_pool(in_call, ctx.sizes, r)

    return [
        replace(probe, case=for_interface(replace(shaped(probe.case), memory=probe.case.memory), ctx.target))
        for probe in probes
    ]


# --- spec-free properties ----------------------------------------------------------


@register(name="identity", formula="f(x, 0) = x", case_options={"positions": False}, per_token_positions=True)
def identity(ctx: Context, case: Case) -> float:
    x = case.tensor()
    x64, p = as_float64(x), case.positions_array()
    bound = ctx.model.vector_bound(vector_norms(x64), p)
    return assert_close(
        vector_norms(f64(ctx, x, p) - x64), 0.0, bound, positions=p, axes=AXES_3D, what="|f(x, 0) - x| per head vector"
    )


@register(
    name="linearity",
    formula="f(a x + b y, m) = a f(x, m) + b f(y, m)",
    extras=lambda ctx, case: st.fixed_dictionaries(
        {"a": st.sampled_from((1.5, -0.75, 3.0, 0.5)), "b": st.sampled_from((-2.0, 1.25, 0.5))}
    ),
    example_extras=lambda ctx, case: {"a": 1.5, "b": -2.0},
)
def linearity(ctx: Context, case: Case, a: float, b: float) -> float:
    p = case.positions_array()
    x, y = case.values(0), case.values(1)
    xt, yt = case.tensor(values=x), case.tensor(values=y)
    x, y = as_float64(xt), as_float64(yt)
    z_exact = a * x + b * y
    zt = case.tensor(values=z_exact)
    lhs = f64(ctx, zt, p)
    rhs = a * f64(ctx, xt, p) + b * f64(ctx, yt, p)
    rounding = vector_norms(as_float64(zt) - z_exact)  # a rotation keeps this norm
    bound = (
        ops(ctx) * (vector_norms(z_exact) + abs(a) * vector_norms(x) + abs(b) * vector_norms(y))
        + rounding * (1 + ops(ctx))
        + 3 * ctx.model.floor
    )
    return assert_close(
        vector_norms(lhs - rhs),
        0.0,
        bound,
        positions=p,
        axes=AXES_3D,
        what="|f(a x + b y, m) - a f(x, m) - b f(y, m)| per head vector",
    )


@register(name="orthogonality", formula="|f(x, m)| = |x| and <f(x, m), f(y, m)> = <x, y>")
def orthogonality(ctx: Context, case: Case) -> float:
    p = case.positions_array()
    xt, yt = case.tensor(0), case.tensor(1)
    x, y = as_float64(xt), as_float64(yt)
    fx, fy = f64(ctx, xt, p), f64(ctx, yt, p)
    e = ops(ctx)
    norm_error = assert_close(
        vector_norms(fx),
        vector_norms(x),
        e * vector_norms(x) + ctx.model.floor,
        positions=p,
        axes=AXES_3D,
        what="|f(x, m)| = |x| per head vector",
    )
    inner_bound = (2 * e + e * e) * vector_norms(x) * vector_norms(y) + ctx.model.floor
    inner_error = assert_close(
        np.sum(fx * fy, -1),
        np.sum(x * y, -1),
        inner_bound,
        positions=p,
        axes=AXES_3D,
        what="<f(x, m), f(y, m)> = <x, y> per head",
    )
    return max(norm_error, inner_error)


def _shift_extra(ctx, case):
    low, high = shift_range(ctx, case)
    return st.fixed_dictionaries(
        {"shift": st.integers(low, high).filter(lambda c: c != 0) if high > low else st.just(0)}
    )


def _example_shift(ctx, case):
    low, high = shift_range(ctx, case)
    return {"shift": 7 if high >= 7 else low}


def _scores_under_shift(ctx: Context, case: Case, shift: int, unit_scale: bool = False):
    """S[b, h, i, j] = <f(q, m_i), f(k, n_j)> at positions P and P + shift, and the bound
    on |S - S'| from the four calls' error bounds. ``unit_scale`` draws q and k with unit
    variance whatever the case's scale (attention logits of order one)."""
    p = case.positions_array()
    norm = case.scale if unit_scale else 1.0
    q, k = (case.tensor(values=case.values(salt) / norm) for salt in (0, 1))
    scores = []
    for grid in (p, p + shift):
        fq, fk = f64(ctx, q, grid), f64(ctx, k, grid)
        scores.append(np.einsum("bihd,bjhd->bhij", fq, fk))
    e0, e1 = eps(ctx, p)[..., 0], eps(ctx, p + shift)[..., 0]  # (b, s)
    e = e0 + e1
    nq, nk = vector_norms(as_float64(q)), vector_norms(as_float64(k))  # (b, s, h)
    bound = (
        np.einsum("bih,bjh->bhij", nq, nk) * (e[:, None, :, None] + e[:, None, None, :]) * (1 + e.max())
    ) + ctx.model.floor
    return scores[0], scores[1], bound, p


@register(
    name="relativity",
    formula="<f(q, m), f(k, n)> = <f(q, m + c), f(k, n + c)>  (depends on n - m only)",
    extras=_shift_extra,
    example_extras=_example_shift,
    same_theta_across_calls=True,
    case_options={"max_seq": SCORES_MAX_SEQ},
)
def relativity(ctx: Context, case: Case, shift: int) -> float:
    s0, s1, bound, p = _scores_under_shift(ctx, case, shift)
    return assert_close(
        s1,
        s0,
        bound,
        axes=("batch", "head", "query", "key"),
        what=f"scores after shifting every position by c = {shift}",
    )


@register(
    name="translation",
    formula="softmax(f(Q, m) f(K, n)^T / sqrt(d)) is unchanged when m, n shift by c",
    extras=_shift_extra,
    example_extras=_example_shift,
    case_options={"min_seq": 2, "max_seq": SCORES_MAX_SEQ},
    same_theta_across_calls=True,
)
def translation(ctx: Context, case: Case, shift: int) -> float:
    s0, s1, bound, p = _scores_under_shift(ctx, case, shift, unit_scale=True)
    scale = 1.0 / math.sqrt(case.head_dim)

    def softmax(s):
        z = np.exp((s - s.max(-1, keepdims=True)) * scale)
        return z / z.sum(-1, keepdims=True)

    p0, p1 = softmax(s0), softmax(s1)
    # Scores off by at most B move each probability by |dp| <= p (e^{2B} - 1), and by 1 at most.
    spread = np.expm1(np.minimum(2 * scale * bound.max(-1, keepdims=True), 50.0))
    return assert_close(
        p1,
        p0,
        np.minimum(np.maximum(p0, p1) * spread, 1.0) + 1e-300,
        axes=("batch", "head", "query", "key"),
        what=f"attention probabilities after shifting every position by c = {shift}",
    )


@st.composite
def _second_grid(draw, ctx, case):
    p = case.positions_array()
    room = ctx.limit(case.head_dim) - int(p.max())
    return {"steps": draw(position_grids(case.batch, case.seq, max(room, 0)))}


@register(
    name="group-law",
    formula="f(f(x, a), b) = f(x, a + b)",
    extras=_second_grid,
    same_theta_across_calls=True,
    calls=("x", "qk"),
    per_token_positions=True,
    calls_why="its second positions are drawn per token, not as a sequence's offset + index",
    example_extras=lambda ctx, case: {
        "steps": np.minimum(
            np.arange(case.batch * case.seq).reshape(case.batch, case.seq) * 37 + 1,
            ctx.limit(case.head_dim) - case.positions_array(),
        )
    },
)
def group_law(ctx: Context, case: Case, steps: np.ndarray) -> float:
    a, b = case.positions_array(), np.asarray(steps, dtype=np.int64)
    x = case.tensor()
    once = ctx.rope(x, torch.from_numpy(a))
    twice = ctx.unscale(f64(ctx, once, b))  # once carries the amplitude too
    direct = f64(ctx, x, a + b)
    ea, eb, eab = eps(ctx, a), eps(ctx, b), eps(ctx, a + b)
    bound = (ea + eb + eab + ea * eb) * vector_norms(as_float64(x)) + 2 * ctx.model.floor
    return assert_close(
        vector_norms(twice - direct),
        0.0,
        bound,
        positions=a + b,
        axes=AXES_3D,
        what="|f(f(x, a), b) - f(x, a + b)| per head vector (position shown: a + b)",
    )


def _position_steps(ctx: Context, head_dim: int, positions: np.ndarray) -> tuple:
    """The position steps s the check moves by (k s): with a convention, the step that turns
    the fastest declared frequency by about one radian (a position-interpolated target,
    theta / f, moves f times less per step); without one, 1 and 61 (prime), the best of
    which decides: an unknown interpolation factor f turns the fastest pair by 1/f per
    position (Gemma 3's global layers: f = 8), which at step 1 alone may sit within bf16
    rounding noise."""
    if ctx.convention is None:
        return (1, 61)
    fastest = float(ctx.convention.theta(head_dim, positions).max())
    return (max(1, int(round(1.0 / fastest))),)


def _element_noise(ctx: Context, x64: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The error the model allows each element of f(u, m), u = (1, .., 1): under a declared
    convention its element bound; spec-free rho (K_OPS u + 6 u32 |m|) + floor with
    rho = sqrt(2), the magnitude of every pair of u whatever the pairing (and a quantized
    output's floor)."""
    if ctx.convention is not None:
        return ctx.model.element_bound(x64, p, ctx.convention)
    pair = ctx.model.pair_bound(math.sqrt(2.0), ctx.model.angle_error(p))[..., None, None]
    return np.broadcast_to(pair, x64.shape) + ctx.model.quantization_floor(x64)


@register(
    name="invertibility",
    formula="f(u, m) != f(u, m + k s) in some element beyond its rounding noise, k = 1, 2, 3, "
    "u = (1, .., 1), s one radian of the fastest declared frequency (spec-free: the best of s = 1 and 61)",
    extras=lambda ctx, case: st.fixed_dictionaries({"k": st.sampled_from((1, 2, 3))}),
    example_extras=lambda ctx, case: {"k": 1},
    case_options={"max_position": 4096},
)
def invertibility(ctx: Context, case: Case, k: int) -> float:
    """Elementwise: the signal of a step lies in the pairs it turns by a visible angle
    (2 rho |sin(k s theta_i / 2)| on one of each pair's two elements at least), while a
    whole-vector bound adds up the noise of every feature, rotated or passed through. An
    element whose |difference| exceeds both calls' element bounds shows that m moved it;
    each head vector needs one (for one of the steps)."""
    rows = ctx.target.row_offsets  # (packed sequences, and rows where declared, keep counting up)
    p = within(case, 4096, rows).positions_array()
    steps = [k * s for s in _position_steps(ctx, case.head_dim, p)]
    p = within(case.with_positions(p), max(ctx.max_position - max(steps), 0), rows).positions_array()  # m + k in range
    x = case.tensor(values=np.ones(case.shape))
    x64 = as_float64(x)
    moved = [(f64(ctx, x, p + step), _element_noise(ctx, x64, p + step)) for step in steps]
    return assert_moved(
        f64(ctx, x, p),
        _element_noise(ctx, x64, p),
        moved,
        positions=p,
        axes=AXES_3D,
        what=f"f(u, m) against f(u, m + k) for k in {steps}",
    )
