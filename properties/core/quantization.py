"""Outputs quantized to fp8 with a per-tensor scale (FlashInfer's ``rope_quantize_fp8``):
the formats, the scales ropecheck passes, and what quantizing means.

A quantizing kernel returns ``out = saturate(v * scale)`` rounded to an fp8 format, v the
rotated q or k (or its no-position part unchanged), ``scale`` one float per tensor
(``quant_scale_q`` for q, ``quant_scale_kv`` for k): FlashInfer multiplies in float32 and
converts with ``__NV_SATFINITE`` (a value past the format's largest finite one becomes
that one, with its sign). The checks read ``out / scale``, the dequantized output.

The scales (``scales``): per tensor, from its largest |value| A, as a serving engine's
per-tensor scales are (1 / amax based), with room for the rotation: an element of R_m x
is at most its pair's norm, <= sqrt(2) A, so ``scale = max / (HEADROOM A)`` keeps every
output below half the format's maximum (no drawn input saturates). A scale is never
within a factor of 2 of 1 (a scale applied twice or not at all would hide there), and
k's is at most a quarter of q's (a kernel that scales k by quant_scale_q is off by 4x
or more). The scale is also large enough that the format's subnormal spacing is small:
half of it, divided by the scale, is at most one fp8 rounding (u8) of the root mean
square of the smallest nonzero head vector, so the error model's floor is relative to
each head vector's own size (``properties.tolerance``). An input where both cannot hold
(head vectors 2^13 times smaller than the largest element, for e4m3) is refused.

A *saturating* call (its ``saturate`` choice: ``SATURATING``) scales each tensor by ``SATURATE * max / A``:
every element past A / SATURATE saturates, and the ``fp8-saturation`` property checks
that they hold the format's maximum (a plain cast gives inf for e5m2 and, on hardware
converting without saturation, NaN for e4m3fn).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Fp8Format:
    """An fp8 format: its torch dtype, unit roundoff u8 (half an ulp relative: 2^-(p+1)
    for p mantissa bits), largest finite value, and subnormal spacing."""

    name: str
    dtype: torch.dtype
    unit: float
    max: float
    spacing: float


FORMATS = {
    f.name: f
    for f in (
        Fp8Format("float8_e4m3fn", torch.float8_e4m3fn, 2.0**-4, 448.0, 2.0**-9),
        Fp8Format("float8_e5m2", torch.float8_e5m2, 2.0**-3, 57344.0, 2.0**-16),
    )
}
HEADROOM = 2.0 * math.sqrt(2.0)  # sqrt(2): the rotation's growth of one element; 2 to spare
AWAY_FROM_ONE = 4.0  # a scale within a factor 2 of 1 is divided by this; k's <= q's / this
SATURATE = 2.0  # a saturating call: elements past A / SATURATE saturate
SATURATING = ("saturate", "yes")  # the call choice of a saturating call (quantized_checks.fp8_saturation)


def _amax_and_smallest_rms(values: np.ndarray) -> tuple[float, float]:
    """The largest |value| and the smallest nonzero root mean square of a head vector (the
    last axis)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return 0.0, math.inf
    rms = np.sqrt(np.mean(v * v, axis=-1))
    nonzero = rms[rms > 0]
    return float(np.abs(v).max()), float(nonzero.min()) if nonzero.size else math.inf


def _scale(values: np.ndarray, fmt: Fp8Format, saturate: bool, cap: float = math.inf) -> float:
    amax, rms = _amax_and_smallest_rms(values)
    if amax == 0.0:
        return 1.0 / AWAY_FROM_ONE
    if saturate:
        scale = SATURATE * fmt.max / amax
    else:
        scale = min(fmt.max / (HEADROOM * amax), cap)
        if 0.5 < scale < 2.0:
            scale /= AWAY_FROM_ONE
    scale = float(np.float32(scale))  # what the kernel takes (a C float)
    smallest = fmt.spacing / (2.0 * fmt.unit * rms)
    if scale < smallest:
        raise ValueError(
            f"ropecheck cannot quantize this input to {fmt.name} with a per-tensor scale: its largest |value| "
            f"{amax:.3g} is {amax / rms:.3g} times the root mean square of its smallest head vector (the format's "
            "subnormals would swallow that vector)"
        )
    return scale


def scales(q: np.ndarray, k: np.ndarray, fmt: Fp8Format, saturate: bool = False) -> tuple[float, float]:
    """(quant_scale_q, quant_scale_kv) ropecheck passes for q and k (their values, any
    shape with head vectors on the last axis): see the module's docstring."""
    scale_q = _scale(q, fmt, saturate)
    return scale_q, _scale(k, fmt, saturate, cap=scale_q / AWAY_FROM_ONE)


def saturate(v: np.ndarray, fmt: Fp8Format) -> np.ndarray:
    """v clamped to the format's finite range (what ``__NV_SATFINITE`` keeps)."""
    return np.clip(v, -fmt.max, fmt.max)


def quantized(values: np.ndarray, scale: float, fmt: Fp8Format, compute_unit: float) -> tuple:
    """(expected, allowed |out - expected|) for ``out`` = values * scale quantized to
    ``fmt``, with no rotation (the no-position parts): the product rounds once in the
    compute dtype (float32 or the input's: ``compute_unit``), then once to fp8, each
    relative to the value (u8 of it, or the subnormal spacing's half where it underflows),
    and past the maximum it saturates (clamping moves no value closer to a wrong one)."""
    exact = saturate(np.asarray(values, dtype=np.float64) * scale, fmt)
    return exact, (fmt.unit + 2.0 * compute_unit) * np.abs(exact) + fmt.spacing / 2.0
