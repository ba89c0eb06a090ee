"""Host-side constants for exact angle reduction in the Triton kernel.

The kernel forms phi = m * theta_i from an int64 position m and reduces it modulo pi/2
in float64 (Cody-Waite). Two splits make that exact for |m| < 2^27:

- theta_i = THETA_HI + THETA_LO, computed in mpmath: THETA_HI has 26 significant bits, so
  m * THETA_HI is exact in float64 (27 + 26 <= 53 bits); THETA_LO is the float64 nearest
  to the rest (theta is then known to ~2^-79 relative, far beyond float64's own rounding).
- pi/2 = PIO2_1 + PIO2_2 + PIO2_3 with 26, 26 and 53 significant bits: k * PIO2_1 and
  k * PIO2_2 are exact for the quadrant counts |k| < 2^27 that |m theta| < 2^27 gives.
"""

from __future__ import annotations

import functools
import math

import mpmath
import numpy as np
import torch

HI_BITS = 26
_PRECISION = 200  # bits of mpmath precision for the splits


def _round_bits(value, bits: int) -> float:
    """``value`` (an mpf) rounded to ``bits`` significant bits, as a float64."""
    mantissa, exponent = mpmath.frexp(value)
    return math.ldexp(float(mpmath.nint(mantissa * 2**bits)), int(exponent) - bits)


@functools.lru_cache(maxsize=None)
def _tables(rotary_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    with mpmath.workprec(_PRECISION):
        theta = [mpmath.power(mpmath.mpf(base), -mpmath.mpf(2 * i) / rotary_dim) for i in range(rotary_dim // 2)]
        hi = [_round_bits(t, HI_BITS) for t in theta]
        lo = [float(t - h) for t, h in zip(theta, hi)]
        pio2 = mpmath.pi / 2
        c1 = _round_bits(pio2, HI_BITS)
        c2 = _round_bits(pio2 - c1, HI_BITS)
        c3 = float(pio2 - c1 - c2)
        consts = [float(2 / mpmath.pi), c1, c2, c3]
    return np.array([hi, lo], dtype=np.float64), np.array(consts, dtype=np.float64)


@functools.lru_cache(maxsize=64)
def angle_tables(rotary_dim: int, base: float, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(theta (2, r/2): hi and lo rows; constants (4,): 2/pi, PIO2_1, PIO2_2, PIO2_3),
    float64 tensors on ``device``."""
    theta, consts = _tables(rotary_dim, float(base))
    return (torch.from_numpy(theta).to(device), torch.from_numpy(consts).to(device))
