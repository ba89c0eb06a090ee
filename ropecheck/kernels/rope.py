"""``apply_rope``: the fused Triton RoPE as a plain function, with autograd.

    q_out, k_out = apply_rope(q, k, positions)                  # per-token positions
    q_out, k_out = apply_rope(q, k, offsets=cache_lengths)      # m = offset[b] + s
    q_out = apply_rope(q_packed, positions=None, cu_seqlens=cu) # m = index within sequence

q, k: (batch, seq, heads, head_dim) (any strides; k may have other heads), or packed
(total, heads, head_dim) with ``cu_seqlens``. positions: integer (batch, seq), (seq,)
shared by every row, or (total,) when packed. bf16 / fp16 / fp32 (and fp64) tensors,
float32 arithmetic. The backward pass is the rotation by -m (R_m^T), by the same kernel.
See ``rope_triton`` for the angle error model.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Union

import torch

from ropecheck.kernels import rope_triton
from ropecheck.kernels.angle_table import angle_tables
from ropecheck.reference import check_layout, check_rotary_dim


class _Plan:
    """Everything but the tensors rotated: positions, layout, tables."""

    def __init__(self, q, positions, offsets, cu_seqlens, max_seqlen, layout, base, rotary_dim):
        packed = cu_seqlens is not None
        if q.dim() != (3 if packed else 4):
            raise ValueError(
                "q must be "
                + ("(total, heads, head_dim) with cu_seqlens" if packed else "(batch, seq, heads, head_dim)")
                + f", got shape {tuple(q.shape)}"
            )
        head_dim = q.shape[-1]
        r = check_rotary_dim(head_dim if rotary_dim is None else rotary_dim, head_dim)
        self.interleaved = check_layout(layout) == "interleaved"
        self.n_pairs = r // 2
        self.theta, self.consts = angle_tables(r, float(base), str(q.device))
        self.cu_seqlens = cu_seqlens
        self.offsets = offsets
        self.max_seqlen = max_seqlen
        if packed and max_seqlen is None:
            self.max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if cu_seqlens.numel() > 1 else 0
        self.positions = self._positions(q, positions, packed)

    @staticmethod
    def _positions(q, positions, packed):
        if positions is None:
            return None
        if positions.dtype.is_floating_point or positions.dtype == torch.bool:
            raise TypeError(f"positions must be integers, got {positions.dtype}")
        if positions.device != q.device:
            raise ValueError(f"positions are on {positions.device}, q on {q.device}")
        tokens = q.shape[0] if packed else q.shape[1]
        if packed or positions.dim() == 1:
            if positions.shape != (tokens,):
                raise ValueError(f"positions must have shape ({tokens},), got {tuple(positions.shape)}")
            return positions[None, :].expand(1 if packed else q.shape[0], tokens)
        if positions.shape != q.shape[:2]:
            raise ValueError(f"positions must have shape {tuple(q.shape[:2])}, got {tuple(positions.shape)}")
        return positions

    def run(self, q, k, q_out, k_out, sign):
        view = (lambda t: t[None]) if self.cu_seqlens is not None else (lambda t: t)
        with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
            rope_triton.launch(
                view(q),
                None if k is None else view(k),
                view(q_out),
                None if k_out is None else view(k_out),
                positions=self.positions,
                offsets=self.offsets,
                cu_seqlens=self.cu_seqlens,
                max_seqlen=self.max_seqlen,
                theta=self.theta,
                consts=self.consts,
                n_pairs=self.n_pairs,
                interleaved=self.interleaved,
                sign=sign,
            )


def _check_k(q, k, packed):
    if k is None:
        return
    lead = 1 if packed else 2
    if k.shape[:lead] != q.shape[:lead] or k.shape[-1] != q.shape[-1] or k.dim() != q.dim():
        raise ValueError(f"k {tuple(k.shape)} must match q {tuple(q.shape)} except in heads")
    if k.dtype != q.dtype or k.device != q.device:
        raise ValueError("q and k must share dtype and device")


class _RopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, inplace, q, k):
        if inplace:
            q_out, k_out = q, k
        else:
            q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            k_out = None if k is None else torch.empty(k.shape, dtype=k.dtype, device=k.device)
        plan.run(q, k, q_out, k_out, sign=1)
        ctx.plan = plan
        if inplace:
            ctx.mark_dirty(*(t for t in (q, k) if t is not None))
        return q_out, k_out

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        """VJP of y = R_m x is R_m^T g = R_{-m} g: the same kernel with the sine negated."""
        grads = [None if g is None else torch.empty(g.shape, dtype=g.dtype, device=g.device) for g in (grad_q, grad_k)]
        if grad_q is None:  # only k's output was used: rotate k's gradient alone
            ctx.plan.run(grad_k, None, grads[1], None, sign=-1)
        else:
            ctx.plan.run(grad_q, grad_k, grads[0], grads[1], sign=-1)
        return None, None, grads[0], grads[1]


def apply_rope(
    q: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    positions: Optional[torch.Tensor] = None,
    *,
    offsets: Union[int, torch.Tensor] = 0,
    layout: str = "half",
    base: float = 10000.0,
    rotary_dim: Optional[int] = None,
    inplace: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    max_seqlen: Optional[int] = None,
):
    """Rotate q (and k) by m * theta_i, theta_i = base^(-2i/r), r = rotary_dim or head_dim.

    Positions m: ``positions`` when given; else ``offsets`` (int or (batch,) tensor) plus
    the index of the token in its sequence (its row, or its place after cu_seqlens[b]).
    ``inplace`` writes into q and k and returns them. Returns q_out, or (q_out, k_out)
    when k is given."""
    packed = cu_seqlens is not None
    _check_k(q, k, packed)
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"unsupported dtype {q.dtype}")
    if isinstance(offsets, torch.Tensor):
        sequences = cu_seqlens.numel() - 1 if cu_seqlens is not None else q.shape[0]
        if offsets.shape != (sequences,):
            raise ValueError(f"offsets must have shape ({sequences},), got {tuple(offsets.shape)}")
    plan = _Plan(q, positions, offsets, cu_seqlens, max_seqlen, layout, base, rotary_dim)
    q_out, k_out = _RopeFunction.apply(plan, inplace, q, k)
    return q_out if k is None else (q_out, k_out)
