# my_rope.py
import torch


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x (batch, seq, heads, head_dim) -> y like x: pair (i, i + head_dim/2) turned by m * theta_i."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / 10000.0 ** (torch.arange(half, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (batch, seq, half), float32
    cos, sin = angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).to(x.dtype)
