"""Property checks of xPos targets (``ropecheck check TARGET --family xpos``).

Contract: ``xpos(q, k, positions) -> (q_out, k_out)``, called in the qk form of the one
calling layer (``ropecheck.call_forms``): each input is one canonical x (batch, seq, q_heads
+ k_heads, head_dim) whose heads [0, q_heads) are q and the others k, k_heads dividing
q_heads (as many most of the time; fewer for GQA / MQA, where q head h attends k head
h // (q_heads / k_heads)), q and k slices of one tensor or tensors of their own; positions
int64 (batch, seq), the same for queries and keys (self-attention). q_out and k_out have q's
and k's shapes and their dtype, are finite, and q, k, positions are left untouched; the
checks read y = cat(q_out, k_out) along heads. xPos (Sun et al. 2022) maps, per pair i
(``reference.relatives.apply_xpos``),

    q_m -> zeta_i^((m - c)/s) R_m q,   k_n -> zeta_i^(-(n - c)/s) R_n k,
    zeta_i = (2i/d + gamma)/(1 + gamma),

for any centre c that is the same for q and k within one call (rotary-embedding-torch centres
on seq_len // 2, x-transformers on (max position + 1) // 2; the paper's form has c = 0). Single
outputs therefore are not comparable between implementations; the scores are, and they are
what xPos promises (relativity of the scaled product, not of norms): for q head h and the k
head it attends,

    s(m, n) = q_out[m] . k_out[n] = sum_i zeta_i^((m - n)/s) [R_m q]_i . [R_n k]_i.

Checks: contract; reference-scores (every s(m, n), computed in float64 from the outputs, vs
the float64 reference); relativity (all positions shifted by c: scores unchanged);
position-used (moving one token by 1009 changes its scores with the others: the relative
distance is used); backward (targets that declare it: the VJP for q and k, see below).
Besides the drawn inputs every run tries one with q 4 heads and k 2 (``_xpos_fixed``).

Backward: ``properties.xpos_backward`` (the VJP, checked without knowing the centre).

Error model (per score, written with relative errors so that c cancels from the prefactor).
Pair i of the query output is zeta_i^((m-c)/s) R_m q_i times (1 + e_q), |e_q| <= eps_i(m), and
likewise for the key at n, so

    |s_hat(m, n) - s(m, n)| <= sum_i |q_i| |k_i| zeta_i^((m-n)/s) (eps_i(m) + eps_i(n) + eps_i(m) eps_i(n))
                               + floor (|q_out[m]|_1 + |k_out[n]|_1),

where |q_i| and |k_i| are the pair's norms in the q head and in the k head it attends, and
the scores are summed in float64 (no accumulation term).
eps_i(m), the relative error of one output pair, has three parts:

1. the rotation, the 1-D model of ``ropecheck.tolerance`` for a whole pair vector:
   sqrt(2) (K_OPS u + dphi_i(m)), dphi_i(m) = 2^-24 |m| theta_i (2 e_i ln(base) + 6), the
   float32 angle (the rotation uses the uncentred m);
2. XPOS_OPS u = 3u, u the compute unit (output dtype, never finer than float32): the scale
   rounded to the compute dtype, its reciprocal for the key, and the extra product by it;
3. the scale zeta_i^p, p = (m - c)/s, formed in float32 (u32 = 2^-24):
   pow and the reciprocal 5 u32 (2 ulp + 1); the exponent p rounded once, |ln zeta_i| |p| u32;
   zeta_i formed from 2i + gamma d and (1 + gamma) d with four roundings, 4 |p| u32. So
   u32 (5 + |p| (|ln zeta_i| + 4)). The centre is unknown; assuming 0 <= c <= M, M the
   largest position the run draws (true of both libraries; an implementation caching its
   scales may centre on an earlier, longer call), |m - c| <= max(|m|, M - |m|).

Buggy targets land far outside: a scale formed or stored in bfloat16/float16 errs by 2^-9 /
2^-11 relative (100 to 500 times the float32 allowance); a wrong gamma, a key scaled by
zeta^(+n/s) or no scale at all change scores by a factor zeta^(+-1/s) - 1 >= 2.4e-3 per unit
of distance on pair 0; a wrong layout or ignored positions by O(1).

Positions: 0 .. M with M = XPOS_MAX_POSITION = 4096 (an adapter may declare less), so
|exponent| <= M/s = 8 and zeta_0^(+-8) <= 3.5^8 ~ 2.3e4 even uncentred: finite in every dtype
(float16 included), while the uncentred paper form overflows float32 past m ~ 36000 (s = 512)
and a centred one past twice that. Distances range over 0 .. M as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from ropecheck.properties.assertions import assert_close, assert_distinct
from ropecheck.properties.convention import XposConvention, scores
from ropecheck.properties.core.contract import Subject
from ropecheck.properties.core.dtypes import torch_dtype
from ropecheck.properties.core.sizes import TOY, Sizes
from ropecheck.properties.inputs.cases import Case, as_float64, nested
from ropecheck.properties.inputs.strategies import (
    SCORES_MAX_SEQ,
    fitted_seq,
    grouped_heads,
    k_heads,
    prime_step,
    seq_lengths,
    small_offsets,
)
from ropecheck.properties.property import (
    Declaration,
    Family,
    FamilyContext,
    FamilyError,
    Property,
    SmokeInput,
    family_registry,
)
from ropecheck.properties.tolerance import U32
from ropecheck.reference.relatives import xpos_zeta
from ropecheck.reference.rope import DEFAULT_BASE, inv_freq, pair_indices

XPOS_MAX_POSITION = 4096
XPOS_OPS = 3.0  # the scale: rounded to the compute dtype, its reciprocal, the extra product
SCALE_POW_CONST = 5.0  # pow (2 ulp) and the key's reciprocal (1 rounding), in u32
ZETA_CONST = 4.0  # roundings forming zeta_i in float32
POSITION_STEP = 1009  # position-used: a prime step, so no pair's rotation comes back to itself
SCORE_AXES = ("batch", "q head", "query", "key")


def max_position(target: Subject) -> int:
    """The largest position an xPos check uses: the target's, at most XPOS_MAX_POSITION."""
    return min(target.max_position or XPOS_MAX_POSITION, XPOS_MAX_POSITION)


def position_step(target: Subject) -> int:
    """position-used moves a token by POSITION_STEP, or by the largest prime that leaves
    half the declared range for the inputs."""
    return prime_step(POSITION_STEP, max_position(target) // 2)


def xpos_cases(target: Subject, dtype: str, min_seq: int = 1, headroom: int = 0, sizes: Sizes = TOY):
    """One (q, k) input in the qk form: q's heads (1, 2 or 4), then k's: as many most of the
    time, else a divisor of q's (GQA; one head, MQA, the likeliest), in one tensor or in
    storages of their own; positions in 0 .. max_position - headroom: a tight cluster or
    spread over the range. At production ``sizes``: their heads and q/k ratios, sequences
    up to SCORES_MAX_SEQ (every xPos check compares scores)."""
    top = max_position(target) - headroom
    longest = min(sizes.max_seq, SCORES_MAX_SEQ)

    @st.composite
    def draw(d):
        b, s = d(st.integers(1, 2)), d(seq_lengths(st.integers(min_seq, 5), min_seq, longest))
        # (q heads, k heads) at sizes with q/k ratios; else k's drawn last
        h, kv = d(grouped_heads(sizes.ratios, False)) if sizes.ratios else (d(st.sampled_from((1, 2, 4))), None)
        spread = min(d(st.sampled_from((8, 64, top))), top)
        start = d(st.sampled_from((0, 0, 7, 1000, top - spread)))
        start = max(0, min(start, top - spread))
        s = fitted_seq(s, min_seq, b * (h + (h if kv is None else kv)) * max(target.head_dims), sizes)
        p = (small_offsets(d, b * s, spread) + start).reshape(b, s)
        head_dim, seed = d(st.sampled_from(target.head_dims)), d(st.integers(0, 2**16))
        kv = d(st.one_of(st.just(h), k_heads(h, False))) if kv is None else kv
        return Case(dtype, b, s, h, head_dim, nested(p), seed=seed, call="qk", k_heads=kv, separate=d(st.booleans()))

    return draw()


def split_qk(x64: np.ndarray, heads: int) -> tuple:
    """(q, k) of a canonical (batch, seq, q_heads + k_heads, head_dim) array, k's heads
    repeated to q's: q head h meets k head h // (q_heads / k_heads), the one it attends."""
    q, k = x64[:, :, :heads], x64[:, :, heads:]
    return q, np.repeat(k, heads // k.shape[2], axis=2)


def attends(case: Case) -> str:
    """Which k head a q head's scores use, for a failure message (GQA / MQA only)."""
    group = case.heads // case.k_heads
    return "" if group == 1 else f"; q head h with k head h // {group}"


@dataclass
class XposContext(FamilyContext):
    """The xPos family's context: scores of (q_out, k_out) and their error model."""

    def scores(self, case: Case, x: torch.Tensor, positions: np.ndarray) -> tuple:
        """(scores, allowed error) of the qk call on x (the case's q and k), each (batch,
        q heads, query, key), in float64."""
        y = as_float64(self.rope(x, torch.from_numpy(np.array(positions, dtype=np.int64)), case))
        (q, k), (q_out, k_out) = split_qk(as_float64(x), case.heads), split_qk(y, case.heads)
        return scores(q_out, k_out), self.score_bound(q, k, positions, q_out, k_out)

    def pair_error(self, positions: np.ndarray, head_dim: int) -> np.ndarray:
        """eps_i(m) of the module docstring: (batch, seq, head_dim/2)."""
        conv, model = self.target.convention, self.model
        m = np.abs(positions).astype(np.float64)
        rotation = math.sqrt(2.0) * model.relative_bound(model.angle_error(m, inv_freq(head_dim, conv.base)))
        power = np.maximum(m, max_position(self.target) - m)[..., None] / conv.scale_base
        ln_zeta = np.abs(np.log(xpos_zeta(head_dim, conv.gamma)))
        scale = U32 * (SCALE_POW_CONST + power * (ln_zeta + ZETA_CONST))
        return rotation + XPOS_OPS * model.unit + scale

    def score_bound(self, q64, k64, positions, q_out, k_out) -> np.ndarray:
        """The score bound of the module docstring; k64 and k_out have q's heads (``split_qk``)."""
        conv = self.target.convention
        head_dim = q64.shape[-1]
        i, j = pair_indices(head_dim, conv.layout)
        nq, nk = np.hypot(q64[..., i], q64[..., j]), np.hypot(k64[..., i], k64[..., j])  # (b, s, h, d/2)
        distance = (positions[:, :, None] - positions[:, None, :]) / conv.scale_base  # (b, query, key)
        decay = xpos_zeta(head_dim, conv.gamma) ** distance[..., None]  # (b, query, key, d/2)
        eps = self.pair_error(positions, head_dim)
        eq, ek = eps[:, :, None, :], eps[:, None, :, :]
        bound = np.einsum("bihp,bjhp,bijp->bhij", nq, nk, decay * (eq + ek + eq * ek))
        l1q, l1k = np.abs(q_out).sum(-1), np.abs(k_out).sum(-1)  # (b, s, h)
        floor = self.model.floor * (l1q.transpose(0, 2, 1)[..., :, None] + l1k.transpose(0, 2, 1)[..., None, :])
        return bound + floor


def _headroom(prop, target: Subject) -> int:
    """How far below max_position a property's inputs stay (position-used moves a token up)."""
    return min(prop.case_options.get("headroom", 0), position_step(target))


def _xpos_cases(prop, ctx: XposContext):
    return xpos_cases(
        ctx.target, ctx.dtype, prop.case_options.get("min_seq", 1), _headroom(prop, ctx.target), ctx.sizes
    )


def _xpos_fixed(prop, ctx: XposContext) -> list:
    """The input every run tries: GQA with more than one key head (q 4 heads, k 2: k head j
    serves q heads 2j and 2j + 1, in storages of their own), where a kernel that gives a q
    group the wrong k head shows; the draws have it rarely. Positions 0, 1, top / 4, top / 2,
    top the largest the property draws."""
    top = max_position(ctx.target) - _headroom(prop, ctx.target)
    case = Case(
        ctx.dtype,
        1,
        4,
        4,
        ctx.target.head_dims[-1],
        nested([[0, 1, top // 4, top // 2]]),
        seed=1,
        call="qk",
        k_heads=2,
        separate=True,
    )
    return [(case, prop.example_extras(ctx, case))]


def _xpos_smoke_inputs(target: Subject, dtype: str):
    for head_dim in target.head_dims:
        q = torch.randn(1, 3, 1, head_dim, generator=torch.Generator().manual_seed(0)).to(torch_dtype(dtype))
        x = torch.cat((q, q.flip(1)), dim=2)  # the qk form's default split: q head 0, k head 1
        yield SmokeInput(
            f"q, k {tuple(q.shape)}",
            f"q, k: shape {tuple(q.shape)} each (heads 0 and 1 of x "
            f"{tuple(x.shape)}) {dtype}, standard normal (seed 0), k = q reversed in seq; "
            "positions 0, 1, 2",
            lambda rope, x=x: rope(x, torch.arange(3).reshape(1, 3)),
        )


# xPos: xpos(q, k, positions) -> (q_out, k_out) in the qk call form, a q/k family with a scale
# model; a target that returns no pair of tensors cannot be judged as xPos at all
def _declare(parameters: dict, own) -> Declaration:
    """The xPos convention (defaults: the paper's, interleaved as its code); positions
    drawn up to XPOS_MAX_POSITION (or the target's own, less)."""
    base = parameters.get("base")
    if isinstance(base, (list, tuple)):
        if len(base) != 1:
            raise FamilyError("--family xpos takes one --base")
        base = base[0]
    given = {k: float(parameters[k]) for k in ("gamma", "scale_base") if parameters.get(k) is not None}
    try:
        conv = XposConvention(
            parameters.get("layout") or "interleaved", DEFAULT_BASE if base is None else float(base), **given
        )
    except ValueError as exc:
        raise FamilyError(str(exc)) from None
    return Declaration(conv, head_dims=(8, 64), max_position=XPOS_MAX_POSITION, dtypes=("float32", "bfloat16"))


XPOS = Family(
    "xpos",
    XposContext,
    _xpos_cases,
    _xpos_fixed,
    smoke_inputs=_xpos_smoke_inputs,
    unusable=("raised", "type"),
    calls=("qk",),
    declare=_declare,
    description="xpos(q, k, positions) -> (q_out, k_out), the qk call form (k may have fewer "
    "heads), positions int64 (batch, seq)",
)


XPOS_PROPERTIES: dict[str, Property]
XPOS_PROPERTIES, xpos_register = family_registry(XPOS)


@xpos_register(
    name="contract",
    formula="(q_out, k_out) = xpos(q, k, P): a pair with q's and k's shapes and dtype, finite, q, k and P untouched",
)
def xpos_contract(ctx: XposContext, case: Case) -> float:
    ctx.rope(case.tensor(), case.positions_tensor(), case)  # the Caller checks all of it
    return 0.0


@xpos_register(
    name="reference-scores",
    formula="q_out[m] . k_out[n] = sum_i zeta_i^((m-n)/s) [R_m q]_i . [R_n k]_i (float64 reference)",
)
def xpos_reference_scores(ctx: XposContext, case: Case) -> float:
    x, p = case.tensor(), case.positions_array()
    got, bound = ctx.scores(case, x, p)
    expected = ctx.target.convention.scores(*split_qk(as_float64(x), case.heads), p)
    return assert_close(
        got,
        expected,
        bound,
        axes=SCORE_AXES,
        what=f"scores vs the float64 reference ({ctx.target.convention.description}{attends(case)})",
    )


@xpos_register(
    name="relativity",
    formula="scores at P + c = scores at P (all positions shifted by c)",
    extras=lambda ctx, case: st.fixed_dictionaries(
        {
            "c": st.integers(
                -int(case.positions_array().min()), max_position(ctx.target) - int(case.positions_array().max())
            )
        }
    ),
    example_extras=lambda ctx, case: {"c": int(case.positions_array().max())},
)
def xpos_relativity(ctx: XposContext, case: Case, c: int) -> float:
    x, p = case.tensor(), case.positions_array()
    s0, b0 = ctx.scores(case, x, p)
    s1, b1 = ctx.scores(case, x, p + c)
    return assert_close(
        s1, s0, b0 + b1, axes=SCORE_AXES, what=f"scores after shifting every position by {c}{attends(case)}"
    )


@xpos_register(
    name="position-used",
    case_options={"min_seq": 2, "headroom": POSITION_STEP},
    formula="moving the last token by c = 1009 (less in a smaller declared range) changes its scores with "
    "the others (distance is used); q = k = u, the unit vector of pair 0",
)
def xpos_position_used(ctx: XposContext, case: Case) -> float:
    """With q = k = u on pair 0 alone, s(m, n) = zeta_0^((m-n)/s) cos((m-n) theta_0): one term, so
    the noise cannot cancel against other pairs. Moving the key by c = 1009 multiplies it by
    zeta_0^(-c/s) ~ 11.8 (gamma 0.4) and turns it by c theta_0; moving the query divides it.
    Per (batch, q head) the most-changed of those scores must move beyond its noise."""
    p = case.positions_array()
    u = torch.zeros(case.shape, dtype=torch_dtype(case.dtype))  # every head of q and k
    u[..., int(pair_indices(case.shape[-1], ctx.target.convention.layout)[0][0])] = 1.0
    moved = p.copy()
    step = position_step(ctx.target)
    moved[:, -1] += step
    s0, b0 = ctx.scores(case, u, p)
    s1, b1 = ctx.scores(case, u, moved)

    def affected(s):  # scores between the last token and the others: (batch, head, 2 (seq - 1))
        return np.concatenate([s[..., :-1, -1], s[..., -1, :-1]], axis=-1)

    change, noise = np.abs(affected(s1) - affected(s0)), affected(b0) + affected(b1)
    best = np.argmax(change / np.maximum(noise, np.finfo(np.float64).tiny), axis=-1)[..., None]
    return assert_distinct(
        np.take_along_axis(change, best, -1)[..., 0],
        0.0,
        np.take_along_axis(noise, best, -1)[..., 0],
        axes=SCORE_AXES[:2],
        what=f"moving the last token by {step} leaves its scores unchanged: the position is not used",
    )
