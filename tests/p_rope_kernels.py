"""p-RoPE kernels (transformers' rope_type "proportional"; ``--rotated-fraction``), as
Gemma 4's full-attention layers compute it: head 512, base 1e6, rotated fraction 0.25, so
pairs (i, i + 256) of which the first 64 turn. Written as HF writes its rotary modules
(float32 frequencies and angles, cos/sin cast to the input's dtype), for tests/test_p_rope.py
and tests/test_hf_config.py:

| kernel | what it computes |
|---|---|
| p_rope | p-RoPE, correct |
| p_rope_as_partial_rotary | Megatron-Bridge #4195: pairs (i, i + 64) of the first 128 features, base^(-2i/128) |
| rope_512 | plain RoPE over the same head: every pair turns |
| p_rope_unturned_scaled | p-RoPE whose unturned pairs come back times 1 + 2^-22: 4 float32 roundings off |

The file imports torch and its sibling kernel file only: ropecheck may load its kernels as
targets in a worker process.
"""

from __future__ import annotations

import torch

from tests.real_config_kernels import _angles, _partial, apply_half, default_inv_freq

P_HEAD, P_FRACTION, P_BASE = 512, 0.25, 1000000.0


def p_rope(x, positions):
    """transformers' _compute_proportional_rope_parameters: int(p * head_dim // 2) frequencies
    base^(-2i/head_dim), zeros for the other pairs, rotate_half over the whole head."""
    rotated = int(P_FRACTION * P_HEAD // 2)
    exponents = torch.arange(0, 2 * rotated, 2, dtype=torch.int64).float() / P_HEAD
    inv = torch.cat((1.0 / P_BASE**exponents, torch.zeros(P_HEAD // 2 - rotated)))
    return _partial(x, P_HEAD, lambda r: apply_half(r, _angles(positions, inv)))


def p_rope_as_partial_rotary(x, positions):
    """Megatron-Bridge #4195: p-RoPE at head dim 512, p = 0.25, taken for a partial rotary of
    p * 512 = 128 features: pairs (i, i + 64), theta_i = base^(-2i/128)."""
    r = int(P_FRACTION * P_HEAD)
    inv = default_inv_freq(r, P_BASE)
    return _partial(x, r, lambda part: apply_half(part, _angles(positions, inv)))


def rope_512(x, positions):
    """Plain RoPE over the 512 features: every pair turns (no frequency is zero)."""
    inv = default_inv_freq(P_HEAD, P_BASE)
    return _partial(x, P_HEAD, lambda r: apply_half(r, _angles(positions, inv)))


def p_rope_unturned_scaled(x, positions):
    """p-RoPE whose pairs of frequency zero come back scaled by 1 + 2^-22 (in float32: 4 units
    of rounding, inside a turning pair's 6 but outside the one rounding an unturned pair has)."""
    y = p_rope(x, positions)
    rotated = int(P_FRACTION * P_HEAD // 2)
    still = torch.ones(P_HEAD, dtype=x.dtype)
    still[rotated : P_HEAD // 2] = still[P_HEAD // 2 + rotated :] = 1 + 2.0**-22
    return torch.cat((y[..., :P_HEAD] * still, y[..., P_HEAD:]), dim=-1)
