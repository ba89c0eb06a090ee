"""Arbitrary-precision RoPE (mpmath), the judge of the float64 reference's own accuracy.

Same map and contract as :func:`reference.rope.apply_rope`, but theta_i = base^(-2i/r), the
angle m * theta_i (m an exact integer) and its cos / sin are computed with ``dps`` decimal
digits; only the final output is rounded to float64.  Python loops: small inputs only.
"""

from __future__ import annotations

import numpy as np

from ropecheck.reference.rope import DEFAULT_BASE, check_layout, check_rotary_dim, pair_indices


def apply_rope_mpmath(
    x,
    positions,
    *,
    layout: str,
    base: float = DEFAULT_BASE,
    rotary_dim: int | None = None,
    theta=None,
    dps: int = 40,
) -> np.ndarray:
    """(a, b) -> (a cos phi - b sin phi, a sin phi + b cos phi), phi = m * theta_i in mpmath.

    ``theta`` (r/2 float64 values, taken as exact) overrides base^(-2i/r), as in apply_rope.
    """
    import mpmath  # here, not at the top: a run that never asks for it does not pay its import (0.1 s)

    x = np.asarray(x, dtype=np.float64)
    m = np.asarray(positions)
    if not np.issubdtype(m.dtype, np.integer):
        raise TypeError(f"positions must be integers, got dtype {m.dtype}")
    head_dim = x.shape[-1]
    r = check_rotary_dim(head_dim if rotary_dim is None else rotary_dim, head_dim)
    check_layout(layout)
    if x.ndim - 1 < m.ndim or x.shape[: m.ndim] != m.shape:
        raise ValueError(f"positions shape {m.shape} does not lead x shape {x.shape}")
    if not base > 0:
        raise ValueError(f"base must be positive, got {base}")
    first, second = pair_indices(r, layout)
    xs = x.reshape(m.size, -1, head_dim)  # (positions, broadcast vectors, head_dim)
    y = xs.copy()
    with mpmath.workdps(dps):
        if theta is None:
            th = [mpmath.power(mpmath.mpf(base), -mpmath.mpf(2 * k) / r) for k in range(r // 2)]
        else:
            theta = np.asarray(theta, dtype=np.float64)
            if theta.shape != (r // 2,):
                raise ValueError(f"theta must have shape ({r // 2},), got {theta.shape}")
            th = [mpmath.mpf(float(t)) for t in theta]
        for p, pos in enumerate(m.reshape(-1).tolist()):
            for k, (i, j) in enumerate(zip(first.tolist(), second.tolist(), strict=True)):
                phi = pos * th[k]
                c, s = mpmath.cos(phi), mpmath.sin(phi)
                for v in range(xs.shape[1]):
                    a, b = mpmath.mpf(float(xs[p, v, i])), mpmath.mpf(float(xs[p, v, j]))
                    y[p, v, i] = float(a * c - b * s)
                    y[p, v, j] = float(a * s + b * c)
    return y.reshape(x.shape)
