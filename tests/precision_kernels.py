"""Half-layout RoPE kernels (base 10000) that all pass every check and differ only in
precision, for tests/test_baseline.py: what a baseline comparison must tell apart.
The file imports torch only: ropecheck loads it in its worker process."""

import torch


def _rotate(x, angles, gain=0.0):
    """y = R(angles) x in float64, times (1 + gain u) (u: x's unit roundoff), rounded to x's dtype."""
    emb = torch.cat((angles, angles), dim=-1)[:, :, None, :].double()
    half = x.shape[-1] // 2
    x64 = x.double()
    y = x64 * emb.cos() + torch.cat((-x64[..., half:], x64[..., :half]), dim=-1) * emb.sin()
    u = torch.finfo(x.dtype).eps / 2
    return (y * (1.0 + gain * u)).to(x.dtype)


def _inv_freq(d, dtype):
    return 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=dtype) / d)


def angles64(x, positions):
    """m * theta_i formed in float64: exact angles (accuracy horizon 2^24)."""
    return _rotate(x, positions.double()[..., None] * _inv_freq(x.shape[-1], torch.float64))


def angles32(x, positions):
    """The same kernel after an edit that forms m * theta_i in float32 (as HF does): within
    the error model, but its accuracy horizon falls to 64 in float32."""
    return _rotate(x, positions.float()[..., None] * _inv_freq(x.shape[-1], torch.float32))


def gain1(x, positions):
    """Exact angles, every output off by one unit roundoff (a scale of 1 + u)."""
    return _rotate(x, positions.double()[..., None] * _inv_freq(x.shape[-1], torch.float64), gain=1.0)


def gain4(x, positions):
    """The same off by four unit roundoffs: its errors about three times gain1's, all still
    within the error model (6 u)."""
    return _rotate(x, positions.double()[..., None] * _inv_freq(x.shape[-1], torch.float64), gain=4.0)
