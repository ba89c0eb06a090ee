"""The float64 reference and its error bound computed where the data is: on the target's
CUDA device, in torch float64, for the inputs too large to judge quickly on the host.

At production sizes a check's time on a GPU is the host's: the input past 2^31 elements is
2.2e9 elements whose float64 reference, bound and comparison numpy works through a chunk
at a time (minutes), where the device does each chunk in milliseconds. What stays on the
host is all that defines the reference: the frequencies (``Convention.theta``), the angles
m theta_i and their cos and sin (``reference.angles``: one row per token of the chunk, not
per element), and the angle allowance of the error model (``declared_angle_error``); the
device does the elementwise rest (the rotation of each pair, exactly as
``reference.apply_rope`` writes it, the bound of ``ErrorModel.element_bound`` and the
comparison of ``assertions.Tally``), one torch operation per numpy one, in float64.

The host reference stays the judge: on the first chunk of every input it is also computed
on the host, and the device's reference and bound must agree with it within float64
rounding (a few units in the last place), or the check stops with ropecheck's own error.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

import ropecheck.reference as reference

# Inputs of more elements than this, made for a CUDA device, are judged there.
DEVICE_ELEMENTS = 2**22
# The device's float64 reference and bound against the host's: relative disagreement allowed
# (float64 rounding: hypot, a product's order; 2^-50 is a few units in the last place).
AGREEMENT = 2.0**-50
# Tests set this to a device ("cpu") to take the device path with any input.
FORCED: Optional[str] = None


def device_for(target, x: torch.Tensor) -> Optional[torch.device]:
    """The device a comparison of ``x`` is made on, or None for the host (numpy)."""
    if FORCED is not None:
        return torch.device(FORCED)
    device = str(getattr(target, "device", "cpu") or "cpu")
    if device.startswith("cuda") and x.numel() > DEVICE_ELEMENTS and torch.cuda.is_available():
        return torch.device(device)
    return None


def reference_and_bound(ctx, x: torch.Tensor, at: np.ndarray, *, inverse: bool, seq_len, device) -> tuple:
    """(x in float64, R_m x (R_m^T x when ``inverse``), the element bound) on ``device``
    for a chunk x (batch, seq, heads, head_dim) at positions ``at`` (batch, seq)."""
    conv, model = ctx.convention, ctx.model
    head_dim = x.shape[-1]
    r = conv.rotary_dim_for(head_dim)
    i, j = reference.pair_slices(r, conv.layout)
    theta = conv.theta(head_dim, at, seq_len)
    phi = reference.angles(-at if inverse else at, theta)[:, :, None, :]  # (batch, seq, 1, r/2)

    def put(a):
        return torch.from_numpy(np.array(a, dtype=np.float64)).to(device)

    cos, sin = put(np.cos(phi)), put(np.sin(phi))
    x64 = x.to(device=device, dtype=torch.float64)
    a, b = x64[..., i], x64[..., j]
    expected = x64.clone()
    expected[..., i] = a * cos - b * sin
    expected[..., j] = a * sin + b * cos
    # ErrorModel.element_bound, term by term
    dphi = model.declared_angle_error(at, conv, head_dim, seq_len)[:, :, None, :]
    relative = put(np.broadcast_to(model.relative_bound(dphi, False), dphi.shape))
    pair = torch.hypot(a, b) * relative + model.floor
    bound = x64.abs() * model.output_unit + model.floor
    still = put(theta == 0.0).bool()  # pairs of frequency zero: one output rounding, as passed-through features
    bound[..., i] = torch.where(still, bound[..., i], pair)
    bound[..., j] = torch.where(still, bound[..., j], pair)
    if model.quantized:
        bound = bound + model.quantization_floor_unit * torch.sqrt(torch.mean(x64 * x64, dim=-1, keepdim=True))
    return x64, expected, bound


def unscaled(ctx, y: torch.Tensor, device) -> torch.Tensor:
    """``Context.unscale`` of an output chunk, on ``device``."""
    y64 = y.to(device=device, dtype=torch.float64)
    conv = ctx.convention
    if conv is not None and conv.amplitude != 1.0:
        r = conv.rotary_dim_for(y64.shape[-1])
        y64 = y64.clone()
        y64[..., :r] /= conv.amplitude
    return y64


def judge(ctx, x: torch.Tensor, at: np.ndarray, expected, bound, *, inverse: bool, seq_len) -> None:
    """The host's float64 reference and bound of the chunk against the device's: they
    agree within float64 rounding, or this is ropecheck's own error (RuntimeError)."""
    x64 = x.to(torch.float64).numpy()
    host = (
        ctx.convention.apply(x64, at, inverse=inverse, seq_len=seq_len),
        ctx.model.element_bound(x64, at, ctx.convention, seq_len=seq_len),
    )
    for what, on_host, on_device in zip(("reference", "error bound"), host, (expected, bound)):
        on_device = on_device.cpu().numpy()
        apart = np.abs(on_device - on_host)
        allowed = AGREEMENT * np.maximum(np.abs(on_host), np.finfo(np.float64).tiny)
        if not (apart <= allowed).all():
            worst = float(np.max(apart / allowed))
            raise RuntimeError(
                f"the float64 {what} computed on {expected.device} disagrees with the host's by "
                f"{worst:.3g} x float64 rounding: ropecheck's own error"
            )
