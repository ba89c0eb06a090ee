"""Kernels for the bench tests (``rope(x, positions)``, interleaved pairs, base 10000): a
lean one (one complex multiply: x read once, the output written once), the same with
one extra pass over x (a scaled copy first: the regression a speed gate must catch), and
a fast wrong one (positions off by one)."""

import torch


def _table(positions: torch.Tensor, pairs: int) -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, 2 * pairs, 2, dtype=torch.float32, device=positions.device) / (2 * pairs)))
    angles = positions.to(torch.float32)[..., None] * inv
    return torch.polar(torch.ones_like(angles), angles)[:, :, None, :]  # (batch, seq, 1, pairs)


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    pairs = x.shape[-1] // 2
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], pairs, 2))
    return torch.view_as_real(xc * _table(positions, pairs)).reshape(x.shape).to(x.dtype)


def rope_extra_pass(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return rope(x * 1.0, positions)  # x read and written once more


def rope_wrong(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return rope(x, positions + 1)
