"""The xPos family's backward check (``properties.xpos_checks``: the contract, the scores and
their error model).

Backward. One VJP of the qk call at x with the gradient g = (gq, gk) on y = cat(q_out,
k_out) gives dx = (dq, dk). f is linear, pair by pair: q_out[m]_i = zeta_i^((m-c)/s) R_m q_i,
so the VJP is dq[m]_i = zeta_i^((m-c)/s) R_m^T gq_i and dk[n]_i = zeta_i^(-(n-c)/s) R_n^T gk_i.
The centre c is unknown, so dq alone cannot be compared with a reference; what can be
checked exactly without it:
- the adjoint identity, for q's heads and k's each: <dq, vq> = <gq, q_out(vq, vk)> and
  <dk, vk> = <gk, k_out(vq, vk)> per head vector (the target's VJP is the transpose of the
  Jacobian its own forward applies, at its own centre; q_out depends on q alone);
- the gradient scores, where c cancels as in the scores (q head h with the k head it
  attends): dq[m] . dk[n] = sum_i zeta_i^((m-n)/s) [R_m^T gq]_i . [R_n^T gk]_i, the float64
  reference (xPos with the roles swapped at positions -m, -n). With the adjoint identity
  this pins the VJP to the reference up to what the scores leave free in the forward too
  (per pair, a factor on q and its inverse on k, as the centre's zeta_i^(-c/s); a rotation
  common to all positions). A key gradient with the query's scale or rotated by +n fails
  the adjoint identity; the VJP of a wrong forward (a key scaled by zeta^(+n/s), no scale, a
  scale in bfloat16) is that forward's exact transpose and fails the gradient scores.

The backward's error model is the forward's: a VJP pair is zeta_i^((m-c)/s) R_m^T g_i times
(1 + e), |e| <= eps_i(m) (the same rotation by m theta_i, transposed, and the same scale).
The gradient scores therefore take the score bound above with (gq, gk) for (q, k) and (dq,
dk) for the outputs. The adjoint identity: both sides are exactly equal, and each pair term
is off by at most eps_i times its exact size, which is unknown (it carries zeta^((m-c)/s))
but at most the computed size / (1 - eps_i); so, per head vector of q,

    |<dq, vq> - <gq, q_out(vq)>| <= sum_i eps_i/(1 - eps_i) (|dq_i| |vq_i| + |gq_i| |q_out_i|)
                                    + floor (|vq|_1 + |gq|_1),

|.|_i the computed pair norms; likewise per head vector of k. A wrong VJP gains little from
the computed sizes in this bound: a factor t on dq_i raises its allowance to eps_i t |dq_i|
|vq_i| and moves the left side by (t - 1) <dq_i, vq_i>, of the order |t - 1| |dq_i| |vq_i| for
a random vq.
"""

from __future__ import annotations

import numpy as np
import torch

from ropecheck.properties.assertions import assert_close
from ropecheck.properties.convention import scores
from ropecheck.properties.inputs.cases import Case, as_float64
from ropecheck.properties.inputs.strategies import example_grad_layout, grad_layouts
from ropecheck.properties.xpos_checks import SCORE_AXES, XposContext, attends, split_qk, xpos_register
from ropecheck.reference.rope import pair_indices


def _adjoint_bound(eps, grad, vector, vjp, forward, floor) -> np.ndarray:
    """The backward's adjoint bound of the module docstring, per head vector (batch, seq,
    heads): eps (batch, seq, d/2); grad, vector, vjp, forward (batch, seq, heads, d) in
    float64, the pairs in their layout's order (the same for all four)."""
    relative = (eps / (1.0 - eps))[:, :, None, :]

    def pairs(t):
        return np.hypot(t[..., 0::2], t[..., 1::2])

    terms = pairs(vjp) * pairs(vector) + pairs(grad) * pairs(forward)
    return np.sum(relative * terms, -1) + floor * (np.abs(vector).sum(-1) + np.abs(grad).sum(-1))


@xpos_register(
    name="backward",
    needs_backward=True,
    formula="VJP at (q, k): adjoint <dq, vq> = <gq, q_out(vq)> and <dk, vk> = <gk, k_out(vk)> per head; "
    "dq[m] . dk[n] = sum_i zeta_i^((m-n)/s) [R_m^T gq]_i . [R_n^T gk]_i (float64 reference, "
    "centre-free)",
    extras=grad_layouts,
    example_extras=example_grad_layout,
)
def xpos_backward(ctx: XposContext, case: Case, grad_layout: str) -> float:
    """The target's VJP at x = (q, k) with the incoming gradient g = (gq, gk): the adjoint
    identity for each of q and k against the target's own forward, then the gradient scores
    against the float64 reference (module docstring: what c leaves checkable, and the error
    model). The incoming gradient comes in one of the layouts autograd hands a backward
    (``strategies.grad_layouts``), broadcast (stride 0) ones included."""
    x, g, v, p = case.tensor(0), case.tensor(1, memory=grad_layout), case.tensor(2), case.positions_array()
    positions = torch.from_numpy(p)
    dx = as_float64(ctx.rope.vjp(x, positions, g))  # (dq, dk)
    fv = as_float64(ctx.rope(v, positions, case))  # (q_out(vq), k_out(vk))
    g64, v64 = as_float64(g), as_float64(v)
    conv = ctx.target.convention
    first, second = pair_indices(case.shape[-1], conv.layout)
    order = np.stack([first, second], -1).reshape(-1)  # pair i at features 2i, 2i + 1
    eps = ctx.pair_error(p, case.shape[-1])
    worst = 0.0
    for name, heads in (("q", slice(None, case.heads)), ("k", slice(case.heads, None))):
        vjp, g_, v_, forward = (t[:, :, heads] for t in (dx, g64, v64, fv))
        bound = _adjoint_bound(
            eps, g_[..., order], v_[..., order], vjp[..., order], forward[..., order], ctx.model.floor
        )
        worst = max(
            worst,
            assert_close(
                np.sum(vjp * v_, -1),
                np.sum(g_ * forward, -1),
                bound,
                axes=("batch", "seq", f"{name} head"),
                what=f"adjoint identity for {name}: <d{name}, v{name}> = <g{name}, {name}_out(v{name})> per head",
            ),
        )
    (gq, gk), (dq, dk) = split_qk(g64, case.heads), split_qk(dx, case.heads)
    gradient = assert_close(
        scores(dq, dk),
        conv.gradient_scores(gq, gk, p),
        ctx.score_bound(gq, gk, p, dq, dk),
        axes=SCORE_AXES,
        what=f"gradient scores dq[m] . dk[n] vs the float64 reference ({conv.description}{attends(case)})",
    )
    return max(worst, gradient)
