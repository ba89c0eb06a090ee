"""Sinusoidal absolute position encoding (Vaswani et al.), a negative control for RoPE.

    p_{k, 2i} = sin(k / base^(2i/d)),   p_{k, 2i+1} = cos(k / base^(2i/d)),   i = 0 .. d/2 - 1

It is added to the input, y = x + p_k: not a rotation, so it preserves neither norms nor
inner products, is not the identity at k = 0, and <f(q, m), f(k, n)> depends on m and n,
not only on n - m.  Property checks must reject it.
"""

from __future__ import annotations

import numpy as np

from ropecheck.reference.rope import DEFAULT_BASE, angles, inv_freq


def sinusoidal_encoding(positions, d: int, base: float = DEFAULT_BASE) -> np.ndarray:
    """p_k of shape (*positions.shape, d) in float64, for integer positions and even d."""
    if d <= 0 or d % 2:
        raise ValueError(f"d must be a positive even integer, got {d}")
    phi = angles(positions, inv_freq(d, base))  # k / base^(2i/d)
    p = np.empty(phi.shape[:-1] + (d,))
    p[..., 0::2] = np.sin(phi)
    p[..., 1::2] = np.cos(phi)
    return p


def apply_sinusoidal(x, positions, *, base: float = DEFAULT_BASE) -> np.ndarray:
    """y = x + p_k, with apply_rope's contract: positions.shape leads x.shape (broadcast axes between)."""
    x = np.asarray(x, dtype=np.float64)
    m = np.asarray(positions)
    extra = x.ndim - 1 - m.ndim
    if extra < 0 or x.shape[: m.ndim] != m.shape:
        raise ValueError(f"positions shape {m.shape} does not lead x shape {x.shape}")
    p = sinusoidal_encoding(m, x.shape[-1], base)
    return x + p.reshape(m.shape + (1,) * extra + (x.shape[-1],))
