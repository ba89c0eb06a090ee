"""A RoPE kernel with a realistic bug, for the README's sample of a failing run.

It follows the contract (x (batch, seq, heads, head_dim), positions int64 (batch, seq),
half layout, base 10000) but forms the angles m * theta_i in x's own dtype: right in
float32, wrong in bfloat16, where a position such as 1001 rounds to 1000.

    ropecheck check docs/examples/broken_rope.py:rope --layout half --profile ci --dtype float32,bfloat16
"""

import torch


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv_freq = 1.0 / 10000.0 ** (torch.arange(half, dtype=torch.float32) / half)
    angles = positions.to(x.dtype)[..., None] * inv_freq.to(x.dtype)  # the bug: use float32
    cos, sin = angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
