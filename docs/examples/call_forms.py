"""Kernels in the call forms production RoPE kernels have, checked with no wrapper
(docs/call-forms.md). Both are correct, half layout, base 500000, angles in float32.

    ropecheck check docs/examples/call_forms.py:rope_qk --call qk --layout half --base 500000 --profile ci --dtype float32
    ropecheck check docs/examples/call_forms.py:rope_varlen --call packed --layout half --base 500000 --profile ci --dtype float32
"""

import torch

BASE = 500000.0


def _cos_sin(positions: torch.Tensor, head_dim: int):
    """cos, sin of m * theta_i in float32, repeated over both halves: (..., head_dim)."""
    inv_freq = 1.0 / BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def rope_qk(q, k, positions):
    """q (batch, seq, q_heads, head_dim), k (batch, seq, k_heads, head_dim), k_heads
    dividing q_heads (GQA, MQA); positions int64 (batch, seq)."""
    cos, sin = _cos_sin(positions, q.shape[-1])
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # one row per token, shared by the heads
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def rope_varlen(x, cu_seqlens, positions):
    """x (total, heads, head_dim): sequences packed one after the other, sequence i is
    x[cu_seqlens[i]:cu_seqlens[i + 1]]; positions int64 (total,), each token's own."""
    cos, sin = _cos_sin(positions, x.shape[-1])
    return _rotate(x, cos[:, None, :], sin[:, None, :])
