"""N-D kernels for tests/test_identify_nd.py that the other N-D kernel files lack: per-axis
bases, and maps that ``ropecheck identify --family nd`` must refuse."""

import torch


def _half(block, angles):
    a, b = block.float().chunk(2, dim=-1)
    cos, sin = angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def axial_two_bases(x, positions):
    """Two half-layout blocks of head_dim / 2, base 10000 for rows and 100 for columns (as
    rotary-embedding-torch's pixel and language frequencies differ)."""
    d = x.shape[-1] // 2
    out = []
    for k, base in enumerate((10000.0, 100.0)):
        inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        out.append(_half(x[..., k * d : (k + 1) * d], positions[..., k].float()[..., None] * inv))
    return torch.cat(out, dim=-1).to(x.dtype)


def additive(x, positions):
    """A sinusoidal encoding added per axis: not a rotation (f(0, x) != 0)."""
    d = x.shape[-1]
    angles = positions.float().sum(-1)[..., None] / 100.0 ** (torch.arange(d, dtype=torch.float32) / d)
    return (x.float() + angles.sin()[:, :, None, :]).to(x.dtype)


def clockwise(x, positions):
    """axial_two_bases turned the other way (each pair by -theta x): no family's
    orientation, a pair table's (its pairs listed second feature first)."""
    return axial_two_bases(x, -positions)


def interpolated(x, positions):
    """An axial interleaved 2-D RoPE on positions interpolated to a grid 2 / 3 as fine (EVA-02's
    t = arange(ft) / ft * pt), from a crop at rows and columns 3: angles theta (2 (x + 3) / 3)."""
    d = x.shape[-1] // 2
    inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.cat([((positions[..., k].double() + 3) * 2 / 3)[..., None] * inv for k in range(2)], -1)
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    rot = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)[:, :, None, :]
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)
