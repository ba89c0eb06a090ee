"""Property checks of N-D rotary embeddings: ``rope(x, positions)`` with x (batch, seq,
heads, head_dim) and positions int64 (batch, seq, n_axes). 1-D RoPE is the case n_axes = 1,
whose targets take positions (batch, seq): ``--family axial --axes 1`` checks any 1-D
target with these checks and the N-D reference (``reference.nd.axial`` with one axis is
``reference.rope``).

The N-D map is R_x = expm(sum_k x_k B_k); what makes it RoPE (seed, 2-D section):
- relativity per axis and jointly: <f(q, P), f(k, P)> unchanged when P -> P + c e_k, or
  P -> P + c (all axes at once): needs skew-symmetric, commuting generators;
- commutation (group law): f(f(x, P), Q) = f(x, P + Q), i.e. R_P R_Q = R_{P+Q}: fails for
  non-commuting generators;
- invertibility: P is recoverable, so f(x, P + e_k) != f(x, P) and f(x, P + e_j - e_k) !=
  f(x, P): the seed's R_{x+y} (eq. 14) fails the second;
- identity, orthogonality; and with a declared ``PairRotation`` the float64 reference;
- backward (targets that declare it): the VJP of f at P is R_P^T g (adjoint identity
  spec-free; against the reference's inverse rotation with a declared convention).

Tolerances are the 1-D model applied per axis (``ropecheck.tolerance``): pair p, driven by
axis k, may err by rho (K_OPS u + dphi_p), dphi_p = 2^-24 |x_k| theta_p (2 e_p ln b + 6)
with e_p ln b = -ln theta_p; spec-free checks use the generic 6 * 2^-24 max_k |x_k|.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
import torch
from hypothesis import strategies as st

from ropecheck.properties.assertions import AXES_3D, assert_close, assert_distinct
from ropecheck.properties.cases import Case, as_float64, nested
from ropecheck.properties.dtypes import torch_dtype
from ropecheck.properties.interface import Subject
from ropecheck.properties.property import Declaration, Family, FamilyContext, FamilyError, Property, family_registry
from ropecheck.properties.sizes import TOY, Sizes
from ropecheck.properties.strategies import (
    SCORES_MAX_SEQ,
    cut_lengths,
    example_grad_layout,
    fitted_seq,
    grad_layouts,
    grouped_heads,
    head_counts,
    k_heads,
    packed_lengths,
    prime_step,
    seq_lengths,
    small_offsets,
)
from ropecheck.properties.tolerance import ANGLE_CONST, U32, ErrorModel
from ropecheck.reference import nd as ndref
from ropecheck.reference.nd import PairRotation

ND_MAX_POSITION = 2**16
INVERTIBILITY_STEP = 1009  # a step every axis resolves: c theta_p moves even its low-frequency pairs (prime: no period)


def limit(target: Subject) -> int:
    """Largest position per axis any check uses: inputs are drawn up to half of it, shifts
    fill the rest (the target's own largest position, else 2 ND_MAX_POSITION)."""
    return 2 * ND_MAX_POSITION if target.max_position is None else target.max_position


def room(target: Subject, positions: np.ndarray) -> int:
    """How far positions may still be shifted up."""
    return max(limit(target) - int(positions.max()), 1)


def convention_for(target: Subject, head_dim: int) -> Optional[PairRotation]:
    """The declared rotation of a head of ``head_dim`` features (a convention may be one
    PairRotation, or one per head size the target accepts)."""
    if isinstance(target.convention, dict):
        return target.convention[head_dim]
    return target.convention


def nd_cases(target: Subject, dtype: str, sizes: Sizes = TOY, max_seq: Optional[int] = None):
    """N-D inputs at ``sizes`` (the target's own head sizes; ``max_seq``: a property's cap)."""
    longest = min(sizes.max_seq, max_seq or sizes.max_seq)

    @st.composite
    def draw(d):
        b = d(st.integers(1, 2))
        s = d(seq_lengths(st.integers(1, 4), 1, longest))
        h = d(head_counts(sizes, st.integers(1, 2)))
        # (q heads, k heads) at sizes with q/k ratios; else drawn below (toy: 4 + 4 at most)
        grouped = d(grouped_heads(sizes.ratios, False)) if target.call == "qk" and sizes.ratios else None
        lengths = ()
        if target.call == "packed":  # one row of sequences of different lengths, empty ones too
            lengths = tuple(d(packed_lengths(1, longest)))
            b, s = 1, sum(lengths)
        head_dim = d(st.sampled_from(target.head_dims))
        wide = (sum(grouped) if grouped else 8) if target.call == "qk" else h
        if target.call == "packed":
            lengths = tuple(cut_lengths(lengths, 1, wide * head_dim, sizes))
            s = sum(lengths)
        else:
            s = fitted_seq(s, 1, b * wide * head_dim, sizes)
        top = limit(target) // 2 - 64  # inputs stay below half the limit
        base = d(st.sampled_from(tuple(min(b, top) for b in (0, 0, 7, 1000, ND_MAX_POSITION // 2))))
        p = (small_offsets(d, b * s * target.n_axes, 64) + base).reshape(b, s, target.n_axes)
        case = Case(dtype, b, s, h, head_dim, nested(p), seed=d(st.integers(0, 2**16)), n_axes=target.n_axes)
        if target.call == "qk":  # q's heads, then GQA / MQA k's (1 < k_heads < q_heads with 4)
            q_heads = grouped[0] if grouped else d(st.sampled_from((1, 2, 4)))
            kv = grouped[1] if grouped else d(k_heads(q_heads, False))
            case = replace(case, heads=q_heads, call="qk", k_heads=kv, separate=d(st.booleans()))
        if target.call == "packed":
            case = replace(case, call="packed", lengths=lengths)
        return case

    return draw()


@dataclass
class NDContext(FamilyContext):
    """The N-D family's context: f in float64 and the generic per-unit-norm bound."""

    def positions(self, positions: np.ndarray) -> torch.Tensor:
        """Positions (batch, seq, n_axes) as the target takes them: one axis (1-D RoPE, the
        N-D case with one axis) as (batch, seq)."""
        p = np.array(positions, dtype=np.int64)
        return torch.from_numpy(p[..., 0].copy() if self.target.n_axes == 1 else p)

    def f(self, x: torch.Tensor, positions: np.ndarray) -> np.ndarray:
        return as_float64(self.rope(x, self.positions(positions)))

    def eps(self, positions: np.ndarray) -> np.ndarray:
        """Allowed error per unit head-vector norm, generic angle term: (b, s, 1)."""
        return self.model.vector_unit_bound(np.abs(positions).max(-1))


def _norms(v):
    return np.linalg.norm(v, axis=-1)


# N-D RoPE (axial, M-RoPE, spec-free N-D): rope(x, positions) with positions (batch, seq, n_axes)
ND = Family(
    "N-D", NDContext, lambda prop, ctx: nd_cases(ctx.target, ctx.dtype, ctx.sizes, prop.case_options.get("max_seq"))
)


ND_PROPERTIES: dict[str, Property]
ND_PROPERTIES, nd_register = family_registry(ND)


@nd_register(name="contract", formula="y = f(x, P) has x's shape and dtype, is finite, leaves x and P untouched")
def nd_contract(ctx: NDContext, case: Case) -> float:
    ctx.rope(case.tensor(), ctx.positions(case.axes_array()))  # the Caller checks all of it
    return 0.0


@nd_register(name="identity", formula="f(x, 0) = x")
def nd_identity(ctx: NDContext, case: Case) -> float:
    x = case.tensor()
    x64, p = as_float64(x), np.zeros_like(case.axes_array())
    bound = ctx.model.vector_bound(_norms(x64), p[..., 0])
    return assert_close(
        _norms(ctx.f(x, p) - x64), 0.0, bound, positions=p[..., 0], axes=AXES_3D, what="|f(x, 0) - x| per head vector"
    )


@nd_register(name="orthogonality", formula="|f(x, P)| = |x|")
def nd_orthogonality(ctx: NDContext, case: Case) -> float:
    x, p = case.tensor(), case.axes_array()
    x64 = as_float64(x)
    return assert_close(
        _norms(ctx.f(x, p)),
        _norms(x64),
        ctx.model.norm_bound(_norms(x64)),
        axes=AXES_3D,
        what="|f(x, P)| = |x| per head vector",
    )


def _scores(ctx, q, k, p):
    fq, fk = ctx.f(q, p), ctx.f(k, p)
    s = np.einsum("bihd,bjhd->bhij", fq, fk)
    e = ctx.eps(p)[..., 0]  # (b, s)
    nq, nk = _norms(as_float64(q)), _norms(as_float64(k))  # (b, s, h)
    bound = np.einsum("bih,bjh->bhij", nq, nk) * (e[:, None, :, None] + e[:, None, None, :])
    return s, bound


def _relativity(ctx: NDContext, case: Case, shift: np.ndarray, what: str) -> float:
    q, k, p = case.tensor(0), case.tensor(1), case.axes_array()
    s0, b0 = _scores(ctx, q, k, p)
    s1, b1 = _scores(ctx, q, k, p + shift)
    return assert_close(s1, s0, b0 + b1 + 2 * ctx.model.floor, axes=("batch", "head", "query", "key"), what=what)


def _shift_extra(ctx, case):
    return st.fixed_dictionaries(
        {"axis": st.integers(0, ctx.target.n_axes - 1), "c": st.integers(1, room(ctx.target, case.axes_array()))}
    )


@nd_register(
    name="relativity-axis",
    formula="<f(q, P + c e_k), f(k, P' + c e_k)> = <f(q, P), f(k, P')> for each axis k",
    extras=_shift_extra,
    case_options={"max_seq": SCORES_MAX_SEQ},
)
def nd_relativity_axis(ctx: NDContext, case: Case, axis: int, c: int) -> float:
    shift = np.zeros(ctx.target.n_axes, dtype=np.int64)
    shift[axis] = c
    return _relativity(ctx, case, shift, f"scores after shifting axis {axis} by {c}")


@nd_register(
    name="relativity-joint",
    formula="<f(q, P + c), f(k, P' + c)> = <f(q, P), f(k, P')>, c a vector",
    extras=lambda ctx, case: st.fixed_dictionaries(
        {
            "c": st.lists(
                st.integers(-int(case.axes_array().min()), min(4096, room(ctx.target, case.axes_array()))),
                min_size=ctx.target.n_axes,
                max_size=ctx.target.n_axes,
            )
        }
    ),
    case_options={"max_seq": SCORES_MAX_SEQ},
)
def nd_relativity_joint(ctx: NDContext, case: Case, c: list) -> float:
    return _relativity(ctx, case, np.asarray(c, dtype=np.int64), f"scores after shifting all axes by {c}")


@nd_register(
    name="commutation",
    formula="f(f(x, P), Q) = f(x, P + Q)  (R_P R_Q = R_{P+Q}: commuting generators)",
    extras=lambda ctx, case: st.fixed_dictionaries(
        {
            "q": st.lists(
                st.integers(0, min(4096, room(ctx.target, case.axes_array()))),
                min_size=ctx.target.n_axes,
                max_size=ctx.target.n_axes,
            )
        }
    ),
)
def nd_commutation(ctx: NDContext, case: Case, q: list) -> float:
    x, p = case.tensor(), case.axes_array()
    steps = np.broadcast_to(np.asarray(q, dtype=np.int64), p.shape).copy()
    once = ctx.rope(x, ctx.positions(p))
    twice = ctx.f(once, steps)
    direct = ctx.f(x, p + steps)
    n = _norms(as_float64(x))
    bound = n * (ctx.eps(p) + ctx.eps(steps) + ctx.eps(p + steps))[..., 0][..., None] + 3 * ctx.model.floor
    return assert_close(
        _norms(twice - direct),
        0.0,
        bound,
        positions=None,
        axes=AXES_3D,
        what="|f(f(x, P), Q) - f(x, P + Q)| per head vector",
    )


@nd_register(
    name="invertibility",
    formula="P is recoverable: f(u, P + c e_k) != f(u, P) and f(u, P + c (e_j - e_k)) != f(u, P), "
    "u = (1, .., 1), c = 1009 (or the largest prime <= max_position / 4)",
)
def nd_invertibility(ctx: NDContext, case: Case) -> float:
    c = prime_step(INVERTIBILITY_STEP, limit(ctx.target) // 4)  # inputs <= limit / 2, plus two steps
    p = case.axes_array() + c  # keeps P + c (e_j - e_k) >= 0
    x = torch.ones(case.shape, dtype=torch_dtype(case.dtype))  # every pair has rho = sqrt(2)
    n_axes = ctx.target.n_axes
    base = ctx.f(x, p)
    noise = 2 * (ctx.eps(p + c)[..., 0][..., None] * _norms(as_float64(x))) + 2 * ctx.model.floor
    eye = np.eye(n_axes, dtype=np.int64) * c
    steps = [eye[k] for k in range(n_axes)] + [eye[j] - eye[k] for j in range(n_axes) for k in range(j + 1, n_axes)]
    worst = 0.0
    for step in steps:
        moved = ctx.f(x, p + step)
        worst = max(
            worst,
            assert_distinct(
                _norms(moved - base),
                0.0,
                noise,
                axes=AXES_3D,
                what=f"f(u, P + {step.tolist()}) equals f(u, P): the position is lost",
            ),
        )
    return worst


@nd_register(
    name="reference",
    formula="f(x, P) = R_P x, the float64 N-D reference (per-axis tolerance model)",
    needs_convention=True,
)
def nd_reference(ctx: NDContext, case: Case) -> float:
    conv = convention_for(ctx.target, case.head_dim)
    assert conv is not None  # needs_convention
    x, p = case.tensor(), case.axes_array()
    x64 = as_float64(x)
    expected = conv.apply(x64, p)
    bound = element_bound(ctx.model, conv, x64, p)
    return assert_close(
        ctx.f(x, p),
        expected,
        bound,
        axes=("batch", "seq", "head", "feature"),
        what=f"f(x, P) vs the float64 reference ({conv.description})",
    )


@nd_register(
    name="backward",
    formula="VJP of f at P: adjoint <VJP(g), v> = <g, f(v, P)> per head; with a declared convention "
    "VJP(g) = R_P^T g = R_{-P} g (float64 reference, per-axis tolerance model)",
    needs_backward=True,
    extras=grad_layouts,
    example_extras=example_grad_layout,
)
def nd_backward(ctx: NDContext, case: Case, grad_layout: str) -> float:
    """The target's own VJP at (x, P) applied to g. Adjoint identity, spec-free: VJP(g) = A^T g
    for the Jacobian A = R_P that f applies, so <VJP(g), v> = <g, f(v, P)> per head vector
    (tokens do not mix). Error model: each side is a computed head vector (|VJP(g)| = |g|,
    |f(v, P)| = |v|) off by at most eps |.| + floor (the generic model of ``NDContext.eps``:
    the VJP rotates by the same float32 angles), so the two inner products differ by at
    most 2 eps |g| |v| + floor (|g| + |v|). With a declared PairRotation the VJP is compared
    elementwise with R_P^T g = R_{-P} g, the reference's inverse rotation, under the same
    per-axis element bound as ``reference`` (a transposed rotation has g's pair norms).
    g comes in one of the layouts autograd hands a backward (``strategies.grad_layouts``),
    broadcast (stride 0) ones included."""
    x, p = case.tensor(0), case.axes_array()
    g, v = case.tensor(1, memory=grad_layout), case.tensor(2)
    vjp = as_float64(ctx.rope.vjp(x, ctx.positions(p), g))
    g64, v64 = as_float64(g), as_float64(v)
    ng, nv = _norms(g64), _norms(v64)
    adjoint = assert_close(
        np.sum(vjp * v64, -1),
        np.sum(g64 * ctx.f(v, p), -1),
        2 * ctx.eps(p) * ng * nv + ctx.model.floor * (ng + nv),
        axes=AXES_3D,
        what="adjoint identity <VJP(g), v> = <g, f(v, P)> per head",
    )
    conv = convention_for(ctx.target, case.head_dim)
    if conv is None:
        return adjoint
    exact = assert_close(
        vjp,
        conv.apply(g64, p, inverse=True),
        element_bound(ctx.model, conv, g64, p),
        axes=("batch", "seq", "head", "feature"),
        what=f"VJP(g) vs R_P^T g = R_(-P) g, the float64 reference ({conv.description})",
    )
    return max(adjoint, exact)


def element_bound(model: ErrorModel, conv: PairRotation, x64: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The 1-D tolerance per axis: rho (K_OPS u + dphi_p) + floor on rotated pairs, one output
    rounding on pass-through features."""
    i, j, _, theta = conv.arrays
    m = np.abs(conv.pair_positions(p)).astype(np.float64)[:, :, None, :]  # (b, s, 1, pairs)
    dphi = U32 * m * theta * (2.0 * np.maximum(-np.log(theta), 0.0) + ANGLE_CONST)
    pair = model.pair_bound(conv.pair_norms(x64), dphi)
    bound = np.abs(x64) * model.output_unit + model.floor
    bound[..., i] = pair
    bound[..., j] = pair
    return bound


# --- the N-D families: what their parameters declare ---------------------------------

ND_DTYPES = ("float32", "bfloat16")  # the dtypes an N-D run checks unless told otherwise


def _bases(parameters: dict):
    """One frequency base, or one per axis (``nd_base``, or a list ``base``); default 10000."""
    value = parameters.get("nd_base") or parameters.get("base")
    if value is None:
        return 10000.0
    values = [float(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    if any(not v > 1 for v in values):
        raise FamilyError(f"--base must be > 1, got {','.join(f'{v:g}' for v in values)}")
    return values[0] if len(values) == 1 else values


def _axes(parameters: dict) -> int:
    n_axes = parameters.get("axes") or 2
    if not 1 <= n_axes <= 8:
        raise FamilyError(f"--axes must be 1 .. 8, got {n_axes}")
    return n_axes


def _head_dims(parameters: dict, n_axes: int) -> tuple:
    """The head sizes drawn: the split's sum, else 4 and 32 features per axis."""
    split = parameters.get("split")
    return (sum(split),) if split else (4 * n_axes, 32 * n_axes)


def _declare_axial(parameters: dict, own) -> Declaration:
    n_axes = _axes(parameters)
    head_dims = _head_dims(parameters, n_axes)
    if parameters.get("layout") is None:
        raise FamilyError(
            "--family axial needs --layout (half or interleaved); --family nd runs the spec-free checks only"
        )
    try:
        conventions = {
            d: ndref.axial(
                d, n_axes, layout=parameters["layout"], base=_bases(parameters), split=parameters.get("split")
            )
            for d in head_dims
        }
    except (ValueError, TypeError) as exc:
        raise FamilyError(str(exc)) from None
    return Declaration(conventions, n_axes=n_axes, head_dims=head_dims, dtypes=ND_DTYPES)


def _declare_mrope(parameters: dict, own) -> Declaration:
    sections = parameters.get("sections")
    if not sections:
        raise FamilyError("--family mrope needs --sections (pairs per axis, e.g. 16,24,24)")
    base = _bases(parameters)
    if isinstance(base, list):
        raise FamilyError("--family mrope takes one --base")
    try:
        conv = ndref.mrope(
            list(sections),
            layout=parameters.get("layout") or "half",
            base=base,
            interleaved=bool(parameters.get("mrope_interleaved")),
        )
    except (ValueError, TypeError) as exc:
        raise FamilyError(str(exc)) from None
    return Declaration(conv, n_axes=len(sections), head_dims=(conv.head_dim,), dtypes=ND_DTYPES)


def _declare_nd(parameters: dict, own) -> Declaration:
    n_axes = _axes(parameters)
    return Declaration(None, n_axes=n_axes, head_dims=_head_dims(parameters, n_axes), dtypes=ND_DTYPES)


_CONTRACT = "rope(x, positions), positions int64 (batch, seq, n_axes)"
ND_FAMILIES = (
    ND.variant("axial", _declare_axial, f"{_CONTRACT}: features split into per-axis blocks, a 1-D RoPE in each"),
    ND.variant(
        "mrope",
        _declare_mrope,
        f"{_CONTRACT}: one 1-D RoPE whose pairs are driven by the axis their section assigns (Qwen2-VL, Qwen3-VL)",
    ),
    ND.variant("nd", _declare_nd, f"{_CONTRACT}: the spec-free N-D checks only"),
)
