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

import math
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
import torch
from hypothesis import strategies as st

from ropecheck.properties.assertions import AXES_3D, assert_close, assert_moved
from ropecheck.properties.core.contract import APPLIER_FORMS, ROTATING_FORMS, ROW_FORMS, Subject
from ropecheck.properties.core.dtypes import torch_dtype
from ropecheck.properties.core.sizes import TOY, Sizes
from ropecheck.properties.inputs.cases import Case, as_float64, nested
from ropecheck.properties.inputs.strategies import (
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
from ropecheck.properties.interfaces import draws
from ropecheck.properties.nd.coordinates import TOKEN_INDICES, Coordinates
from ropecheck.properties.property import Family, FamilyContext, Property, family_registry
from ropecheck.reference.multimodal import qwen2vl_positions
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


def coordinates_of(target: Subject) -> Coordinates:
    """The positions the target takes (``nd.coordinates``): token indices unless declared."""
    return getattr(target, "coordinates", None) or TOKEN_INDICES


def conventions_of(target: Subject) -> list:
    """Every declared rotation of the target (one per head size it accepts; none spec-free)."""
    conv = target.convention
    return list(conv.values()) if isinstance(conv, dict) else ([conv] if conv is not None else [])


def convention_for(target: Subject, head_dim: int) -> Optional[PairRotation]:
    """The declared rotation of a head of ``head_dim`` features (a convention may be one
    PairRotation, or one per head size the target accepts)."""
    if isinstance(target.convention, dict):
        return target.convention[head_dim]
    return target.convention


def interface_space(target: Subject):
    """The argument space of the library interface the target is called through (an M-RoPE
    run through a serving preset), None when it is called in its own form."""
    interface = getattr(target, "interface", None)
    return interface.space if interface is not None and interface.space.factors else None


MEDIA_BASES = (0, 7, 1000, ND_MAX_POSITION // 2)  # where a sequence's first token is
# t's step per frame of a video (Qwen2.5-VL: second_per_grid_t * tokens_per_second): 1, 2 at a
# model's fps, 4096 for frames sampled across a long video (t then far past h and w)
FRAME_STEPS = (1, 2, 4096)


def _segments(media: str, seq: int, pick) -> list:
    """A sequence of ``seq`` tokens as Qwen2-VL builds one: text only, or text around an
    image's patches (h x w) or a video's (t x h x w, t >= 2)."""
    if media == "text" or seq < 2:
        return [("text", seq)]
    frames = pick.integer(2, 3) if media == "video" and seq >= 4 else 1
    room = max(seq // frames, 2 if frames == 1 else 1)
    w = pick.integer(2, max(2, min(4, room)))
    h = pick.integer(1, max(1, min(4, room // w)))
    patches = frames * h * w
    if patches > seq:  # a video of the smallest grid (1 x 2 per frame) fits any seq >= 2 frames x 2
        frames, h, w = (2, 1, 2) if media == "video" and seq >= 4 else (1, 1, 2)
        patches = frames * h * w
    before = pick.integer(0, seq - patches)
    medium = ("video", frames, h, w) if frames > 1 else ("image", h, w)
    return [("text", before), medium, ("text", seq - patches - before)]


def interface_case(target: Subject, dtype: str, sizes: Sizes, longest: int, row: dict, pick) -> Case:
    """An N-D input in a row of the target's interface space (``draws.settings``: one or
    several sequences and tokens, its key heads, memory layouts, the M-RoPE media of its
    tokens, scattered or shared rows), the rest chosen by ``pick`` (``draws.Drawn`` or
    ``draws.FixedChoices``); its choices the row's classes, as the call path reads them."""
    space = interface_space(target)
    need = draws.settings(space, row)
    media = need.get("media", "text")
    batch = need.get("batch")
    b = 1 if batch == "one" else pick.integer(2, 3) if batch == "several" else pick.integer(1, 2)
    s = 1 if need.get("seq") == "one" else pick.integer(2 if media == "text" else 4, max(4, min(longest, 16)))
    head_dim = pick.sample(target.head_dims)
    kind = need.get("k", "one")
    q_heads = 4 if kind == "grouped" else pick.sample((1, 2) if kind == "all" else (1, 2, 4))
    kv = {"none": 0, "one": 1, "grouped": 2, "all": q_heads}[kind]
    s = fitted_seq(s, 1, b * (q_heads + kv) * head_dim, sizes)
    half = limit(target) // 2  # inputs stay at or below half the limit: the checks shift them
    rows = []
    for _ in range(b):
        step = pick.sample(FRAME_STEPS) if media == "video" else 1
        own = qwen2vl_positions(_segments(media, s, pick), temporal_scale=step)
        own = np.minimum(own, half)  # a long video's last frame cut to the range
        first = min(pick.sample(MEDIA_BASES), max(half - int(own.max(initial=0)), 0))
        rows.append(first + own)
        if need.get("positions") == "scattered":  # a mixed batch's tokens in no order
            rows[-1] = rows[-1][np.asarray(pick.sample(tuple(_orders(s))))]
    p = np.stack(rows)
    if need.get("rows") == "same":
        p = np.ascontiguousarray(np.broadcast_to(p[:1], p.shape))
    case = Case(
        dtype, b, s, q_heads, head_dim, nested(p, p.dtype), seed=pick.integer(0, 2**16), n_axes=target.n_axes,
        position_dtype=str(p.dtype), call="qk", k_heads=kv,
    )  # fmt: skip
    k_memory = need.get("k_memory")
    case = replace(case, memory=need.get("memory", "contiguous"), separate=bool(k_memory), k_memory=k_memory or "")
    return replace(case, choices=tuple(row.items()))


def _orders(seq: int) -> list:
    """A few orders of a sequence's tokens (reversed, interleaved halves, a rotation)."""
    index = list(range(seq))
    return [index[::-1], index[::2] + index[1::2], index[1:] + index[:1]]


def interface_inputs(prop, ctx) -> list:
    """The N-D reference's fixed inputs through an interface: one per row of its plan, so
    that every pair of its argument classes is called in every run."""
    space = interface_space(ctx.target)
    if space is None or prop.name != "reference":
        return []
    return [
        (interface_case(ctx.target, ctx.dtype, ctx.sizes, ctx.sizes.max_seq, row, draws.FixedChoices(i)), {})
        for i, row in enumerate(space.plan)
    ]


def nd_cases(target: Subject, dtype: str, sizes: Sizes = TOY, max_seq: Optional[int] = None, room: bool = False):
    """N-D inputs at ``sizes`` (the target's own head sizes; ``max_seq``: a property's cap;
    ``room``: declared coordinates drawn in their ranges' lower half, for the checks that
    shift them). Through a library interface (``interface_space``): in a row of its space."""
    longest = min(sizes.max_seq, max_seq or sizes.max_seq)
    space = interface_space(target)
    if space is not None:
        return st.sampled_from(space.plan).flatmap(
            lambda row: st.composite(lambda d: interface_case(target, dtype, sizes, longest, row, draws.Drawn(d)))()
        )

    @st.composite
    def draw(d):
        b = d(st.integers(1, 2))
        s = d(seq_lengths(st.integers(1, 4), 1, longest))
        h = d(head_counts(sizes, st.integers(1, 2))) if not joined_heads(target) else 1  # one joined head
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
        spread = min(64, limit(target) // 2)  # inputs stay at or below half the limit (a small one too)
        top = limit(target) // 2 - spread
        coords = coordinates_of(target)
        if coords.token_indices:
            bases = st.sampled_from(tuple(min(b, top) for b in (0, 0, 7, 1000, ND_MAX_POSITION // 2)))
            base = d(bases)
            p = (small_offsets(d, b * s * target.n_axes, spread) + base).reshape(b, s, target.n_axes)
            if target.n_axes > 1 and d(st.booleans()):  # axes far apart (a video's frames past its rows):
                p = p - base + np.asarray([d(bases) for _ in range(target.n_axes)])  # mixed-up axes' slow pairs differ
        else:  # image / video coordinates: a grid or scattered over the declared ranges
            p = coords.draw(d, b, s, target.n_axes, room=room)
        if target.call in ROW_FORMS:  # an applier's or builder's tables are (seq, head_dim): one row for the batch
            p = np.ascontiguousarray(np.broadcast_to(p[:1], p.shape))
        case = Case(
            dtype,
            b,
            s,
            h,
            head_dim,
            nested(p, p.dtype),
            seed=d(st.integers(0, 2**16)),
            n_axes=target.n_axes,
            position_dtype=str(p.dtype),
        )
        if target.call == "qk":  # q's heads, then GQA / MQA k's (1 < k_heads < q_heads with 4)
            q_heads = grouped[0] if grouped else d(st.sampled_from((1, 2, 4)))
            kv = grouped[1] if grouped else d(k_heads(q_heads, False))
            case = replace(case, heads=q_heads, call="qk", k_heads=kv, separate=d(st.booleans()))
        if target.call == "packed":
            case = replace(case, call="packed", lengths=lengths)
        if target.call in APPLIER_FORMS:  # x as (B, H, S, D) (sequence_dim=2) or (B, S, H, D) (1)
            case = case.with_choices(sequence_dim=d(st.sampled_from(("2", "1"))))
        return case

    return draw()


def joined_heads(target: Subject) -> Optional[int]:
    """H when the declared rotation spans a token's H heads (a pair table with ``heads``)."""
    return getattr(target.convention, "heads", None)


class HeadsJoined:
    """The caller of a target whose rotation spans its H heads: the checks see a token's
    heads as one head of H x D features (batch, seq, 1, H * D), the target is handed them
    split, (batch, seq, H, D), as its model calls it; its outputs are joined again."""

    def __init__(self, caller, heads: int):
        self.caller, self.heads = caller, heads

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(*t.shape[:2], self.heads, t.shape[-1] // self.heads)

    def __call__(self, x, positions, *args, **kwargs):
        y = self.caller(self._split(x), positions, *args, **kwargs)
        return y.reshape(x.shape)

    def vjp(self, x, positions, grad):
        return self.caller.vjp(self._split(x), positions, self._split(grad)).reshape(x.shape)

    def __getattr__(self, name):  # the rest of the caller (its case, its time limits)
        return getattr(self.caller, name)


@dataclass
class NDContext(FamilyContext):
    """The N-D family's context: f in float64 and the generic per-unit-norm bound."""

    def __post_init__(self):
        super().__post_init__()
        heads = joined_heads(self.target)
        if heads:
            self.rope = HeadsJoined(self.rope, heads)

    @property
    def coords(self) -> Coordinates:
        return coordinates_of(self.target)

    def positions(self, positions: np.ndarray) -> torch.Tensor:
        """Positions (batch, seq, n_axes) as the target takes them: int64, or float32
        coordinates; one axis (1-D RoPE, the N-D case with one axis) as (batch, seq)."""
        p = np.array(self.coords.given(positions))
        return torch.from_numpy(p[..., 0].copy() if self.target.n_axes == 1 else p)

    def f(self, x: torch.Tensor, positions: np.ndarray) -> np.ndarray:
        return as_float64(self.rope(x, self.positions(positions)))

    def eps(self, positions: np.ndarray) -> np.ndarray:
        """Allowed error per unit head-vector norm: (b, s, 1). The generic angle term, in
        units of the largest |S_k x_k| + |O_k| (frequencies of at most 1 per unit, as
        theta_0 = 1), or, where larger, the largest angle error of a declared rotation's
        pairs (frequencies far above 1 per unit: image coordinates, pair tables)."""
        generic = self.model.vector_unit_bound(self.coords.magnitudes(positions).max(-1))
        for conv in conventions_of(self.target):
            if conv.turns_fast:
                dphi = self.model.rotation_angle_error(conv, positions).max(-1)
                generic = np.maximum(generic, self.model.vector_unit_bound(None, dphi))
        return generic


def _norms(v):
    return np.linalg.norm(v, axis=-1)


# N-D RoPE (axial, M-RoPE, spec-free N-D): rope(x, positions) with positions (batch, seq, n_axes)
AT_ZERO = ("identity", "commutation")  # the laws of a map that does not turn at x = 0


def _applies(prop: Property, target: Subject) -> tuple[bool, str]:
    """Identity and commutation hold only where no pair turns at x = 0: an offset
    (--coord-offset) or a pair's phase turns every position by a constant angle, so
    f(x, 0) = R_O x and f(f(x, P), Q) = f(x, P + Q + O / S); the reference judges those.
    They also hand the target 0 and small steps as positions: a declared range without 0
    (the target's domain) leaves them to the reference too."""
    if prop.name in AT_ZERO and (
        coordinates_of(target).offsets_angles or any(c.turns_at_zero for c in conventions_of(target))
    ):
        return False, "the declared map turns pairs at x = 0 (an offset or a phase): the reference judges it"
    if prop.name in AT_ZERO and not coordinates_of(target).holds_zero(target.n_axes):
        return False, "position 0 lies outside the declared --coord-range: the reference judges the map"
    return True, ""


ND = Family(
    "N-D",
    NDContext,
    lambda prop, ctx: nd_cases(
        ctx.target, ctx.dtype, ctx.sizes, prop.case_options.get("max_seq"), prop.case_options.get("room", False)
    ),
    interface_inputs,
    applies=_applies,
    calls=ROTATING_FORMS,
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
    s1, b1 = _scores(ctx, q, k, ctx.coords.given(p + shift))
    return assert_close(s1, s0, b0 + b1 + 2 * ctx.model.floor, axes=("batch", "head", "query", "key"), what=what)


def _shift_extra(ctx, case):
    coords, n_axes, p = ctx.coords, ctx.target.n_axes, case.axes_array()
    if coords.token_indices:
        return st.fixed_dictionaries({"axis": st.integers(0, n_axes - 1), "c": st.integers(1, room(ctx.target, p))})
    return st.integers(0, n_axes - 1).flatmap(
        lambda a: st.fixed_dictionaries({"axis": st.just(a), "c": coords.shift(p, a, nonzero=True)})
    )


def _shift_vector(ctx, case, lowest, highest: int = 4096, as_position: bool = False):
    """Shifts c of every axis: token indices from ``lowest`` to ``highest`` (within the
    room left), coordinates as ``Coordinates.shifts`` draws them."""
    coords, n_axes, p = ctx.coords, ctx.target.n_axes, case.axes_array()
    if not coords.token_indices:
        return coords.shifts(p, as_position=as_position).map(list)
    one = st.integers(lowest, min(highest, room(ctx.target, p)))
    return st.lists(one, min_size=n_axes, max_size=n_axes)


@nd_register(
    name="relativity-axis",
    formula="<f(q, P + c e_k), f(k, P' + c e_k)> = <f(q, P), f(k, P')> for each axis k",
    extras=_shift_extra,
    case_options={"max_seq": SCORES_MAX_SEQ, "room": True},
)
def nd_relativity_axis(ctx: NDContext, case: Case, axis: int, c) -> float:
    shift = np.zeros(ctx.target.n_axes, dtype=np.asarray(c).dtype)
    shift[axis] = c
    return _relativity(ctx, case, shift, f"scores after shifting axis {axis} by {c}")


@nd_register(
    name="relativity-joint",
    formula="<f(q, P + c), f(k, P' + c)> = <f(q, P), f(k, P')>, c a vector",
    extras=lambda ctx, case: st.fixed_dictionaries({"c": _shift_vector(ctx, case, -int(case.axes_array().min()))}),
    case_options={"max_seq": SCORES_MAX_SEQ, "room": True},
)
def nd_relativity_joint(ctx: NDContext, case: Case, c: list) -> float:
    return _relativity(ctx, case, np.asarray(c), f"scores after shifting all axes by {c}")


@nd_register(
    name="commutation",
    formula="f(f(x, P), Q) = f(x, P + Q)  (R_P R_Q = R_{P+Q}: commuting generators)",
    extras=lambda ctx, case: st.fixed_dictionaries({"q": _shift_vector(ctx, case, 0, as_position=True)}),
    case_options={"room": True},
)
def nd_commutation(ctx: NDContext, case: Case, q: list) -> float:
    x, p = case.tensor(), case.axes_array()
    steps = ctx.coords.given(np.broadcast_to(np.asarray(q), p.shape))
    once = ctx.rope(x, ctx.positions(p))
    twice = ctx.f(once, steps)
    direct = ctx.f(x, ctx.coords.given(p + steps))
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


def invertibility_shifts(ctx: NDContext, head_dim: int) -> tuple:
    """The shifts c the invertibility check moves an axis by: INVERTIBILITY_STEP (1009) and
    the largest prime <= limit / 4 (inputs stay <= limit / 2, plus two shifts), and with a
    declared convention, per axis, the prime nearest pi / theta_max, which turns the
    fastest pair that axis drives by about half a turn. A small c moves an axis that drives
    only low frequencies (M-RoPE's w at base 1e6: theta <= 1.8e-4) by less than rounding
    noise; a large one can land a single fast pair near a whole turn: with several, one
    of them moves some pair of every axis that has any. Coordinates: ``turning_shifts``
    (their ranges' width, 1, and per axis pi / (theta_max |S|), spec-free theta_max = 1)."""
    coords = ctx.coords
    if not coords.token_indices:
        conv, n_axes = convention_for(ctx.target, head_dim), ctx.target.n_axes
        scales = np.abs(coords.scales(n_axes))
        if conv is None:
            return coords.turning_shifts([math.pi / s for s in scales], n_axes)
        _, _, axis, theta = conv.arrays
        fastest = [float(theta[axis == k].max()) for k in sorted(set(axis.tolist()))]
        return coords.turning_shifts(
            [math.pi / (t * scales[k]) for k, t in zip(sorted(set(axis.tolist())), fastest) if t > 0], n_axes
        )
    cap = limit(ctx.target) // 4
    shifts = {prime_step(INVERTIBILITY_STEP, cap), prime_step(cap, cap)}
    conv = convention_for(ctx.target, head_dim)
    if conv is not None:
        _, _, axis, theta = conv.arrays
        for k in set(axis.tolist()):
            half_turn = int(round(math.pi / float(theta[axis == k].max())))
            shifts.add(prime_step(max(half_turn, 2), cap))
    return tuple(sorted(shifts))


def _element_noise(ctx: NDContext, x64: np.ndarray, p: np.ndarray, head_dim: int) -> np.ndarray:
    """The error the model allows each element of f(x, P), for x = u = (1, .., 1): under a
    declared convention its per-axis element bound; spec-free the per-element bound
    rho (K_OPS u + 6 u32 max_k |P_k|) + floor with rho = sqrt(2), the magnitude of every
    pair of u whatever the pairing (features in no pair err by one rounding, less)."""
    conv = convention_for(ctx.target, head_dim)
    if conv is not None:
        return ctx.model.rotation_bound(conv, x64, p)
    angle = ctx.model.angle_error(ctx.coords.magnitudes(p).max(-1))[..., None, None]  # (b, s, 1, 1)
    return np.broadcast_to(ctx.model.pair_bound(math.sqrt(2.0), angle), x64.shape)


@nd_register(
    name="invertibility",
    formula="P is recoverable: f(u, P + c e_k) != f(u, P) and f(u, P + c (e_j - e_k)) != f(u, P) "
    "in some element beyond its rounding noise, u = (1, .., 1), for one of the shifts c "
    "(1009, the largest prime <= max_position / 4, and with a convention pi / theta_max of the axis)",
    case_options={"room": True},
)
def nd_invertibility(ctx: NDContext, case: Case) -> float:
    """Elementwise, not per head vector: the signal of a shifted axis lies in the few pairs
    it drives (2 rho |sin(c theta_p / 2)| on one of each pair's two elements at least), while
    a whole-vector bound adds up the noise of every feature. A pair moves by its exact
    change plus at most the two calls' element errors, so an element whose |difference|
    exceeds the sum of both calls' element bounds shows that P moved it; the check needs
    one such element per head vector and step (the best of the shifts)."""
    shifts = invertibility_shifts(ctx, case.head_dim)
    p = case.axes_array()
    if ctx.coords.token_indices:
        p = p + max(shifts)  # keeps P + c (e_j - e_k) >= 0
    else:
        p = ctx.coords.invertibility_base(p, max(shifts))
    x = torch.ones(case.shape, dtype=torch_dtype(case.dtype))
    x64 = as_float64(x)
    n_axes = ctx.target.n_axes
    base, base_noise = ctx.f(x, p), _element_noise(ctx, x64, p, case.head_dim)
    eye = np.eye(n_axes, dtype=p.dtype)
    steps = [eye[k] for k in range(n_axes)] + [eye[j] - eye[k] for j in range(n_axes) for k in range(j + 1, n_axes)]
    worst = 0.0
    for step in steps:
        at = [ctx.coords.given(p + c * step) for c in shifts]
        moved = [(ctx.f(x, q), _element_noise(ctx, x64, q, case.head_dim)) for q in at]
        worst = max(
            worst,
            assert_moved(
                base,
                base_noise,
                moved,
                axes=AXES_3D,
                what=f"f(u, P + c {step.tolist()}) equals f(u, P) in every element for c in {list(shifts)}: "
                "the position is lost",
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
    bound = ctx.model.rotation_bound(conv, x64, p)
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
        ctx.model.rotation_bound(conv, g64, p),
        axes=("batch", "seq", "head", "feature"),
        what=f"VJP(g) vs R_P^T g = R_(-P) g, the float64 reference ({conv.description})",
    )
    return max(adjoint, exact)
