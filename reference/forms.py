"""The seeds' four equivalent forms of 1-D RoPE, in float64.

Each is the same map as :func:`reference.rope.apply_rope`, written the way a source writes it,
so the tests can check that they agree:

- matrix form (seed eq. 6-7): y = R_m x, R_m block-diagonal with the 2x2 blocks
  [[cos m theta_i, -sin m theta_i], [sin m theta_i, cos m theta_i]] on the pairs of
  ``pair_indices`` and the identity on the pass-through features; R_m = expm(m B) with B
  skew-symmetric, B[j, i] = theta_i = -B[i, j] for each pair (i, j);
- complex form (seed eq. 5, Meta LLaMA's ``view_as_complex``): the interleaved pair
  (x_2i, x_2i+1) is the complex number z_i = x_2i + 1j x_2i+1 and f(z_i, m) = z_i e^{i m theta_i};
- elementwise form (seed eq. 8, interleaved):
  y = x * (cos m theta_0, cos m theta_0, cos m theta_1, ...)
    + (-x_1, x_0, -x_3, x_2, ...) * (sin m theta_0, sin m theta_0, sin m theta_1, ...);
- rotate_half form (GPT-NeoX / HF, half layout), with x = (x1, x2) split at r/2:
  y = x * cat(cos, cos) + cat(-x2, x1) * cat(sin, sin).

The vector functions take x with last axis head_dim and an integer position m: a scalar or
an array broadcastable (numpy rules) against ``x.shape[:-1]``.  Features r .. d-1 pass through.
They are for tests, not speed: the matrix form builds a d x d matrix per position.
"""

from __future__ import annotations

import numpy as np

from ropecheck.reference.rope import DEFAULT_BASE, angles, check_layout, check_rotary_dim, inv_freq, pair_indices


def _rotary_dim(head_dim: int, rotary_dim: int | None) -> int:
    return check_rotary_dim(head_dim if rotary_dim is None else rotary_dim, head_dim)


def _prepare(x, m, base: float, rotary_dim: int | None):
    """x broadcast against m, r, and phi = m * theta_i of shape (*lead, r/2)."""
    x = np.asarray(x, dtype=np.float64)
    m = np.asarray(m)
    r = _rotary_dim(x.shape[-1], rotary_dim)
    lead = np.broadcast_shapes(x.shape[:-1], m.shape)
    x = np.broadcast_to(x, lead + x.shape[-1:])
    phi = np.broadcast_to(angles(m, inv_freq(r, base)), lead + (r // 2,))
    return x, r, phi


def _with_tail(y_rot: np.ndarray, x: np.ndarray, r: int) -> np.ndarray:
    return np.concatenate([y_rot, x[..., r:]], axis=-1)


def generator(head_dim: int, *, layout: str, base: float = DEFAULT_BASE, rotary_dim: int | None = None) -> np.ndarray:
    """Skew-symmetric B (d, d) with R_m = expm(m B): B[j, i] = theta_i, B[i, j] = -theta_i."""
    check_layout(layout)
    r = _rotary_dim(head_dim, rotary_dim)
    i, j = pair_indices(r, layout)
    theta = inv_freq(r, base)
    b = np.zeros((head_dim, head_dim))
    b[j, i] = theta
    b[i, j] = -theta
    return b


def rotation_matrix(
    m, head_dim: int, *, layout: str, base: float = DEFAULT_BASE, rotary_dim: int | None = None
) -> np.ndarray:
    """Explicit R_m, shape (*m.shape, d, d): rotation blocks on the pairs, identity elsewhere."""
    check_layout(layout)
    r = _rotary_dim(head_dim, rotary_dim)
    i, j = pair_indices(r, layout)
    phi = angles(m, inv_freq(r, base))
    cos, sin = np.cos(phi), np.sin(phi)
    rot = np.broadcast_to(np.eye(head_dim), phi.shape[:-1] + (head_dim, head_dim)).copy()
    rot[..., i, i] = cos
    rot[..., i, j] = -sin
    rot[..., j, i] = sin
    rot[..., j, j] = cos
    return rot


def rotation_matrix_expm(
    m, head_dim: int, *, layout: str, base: float = DEFAULT_BASE, rotary_dim: int | None = None
) -> np.ndarray:
    """R_m = scipy.linalg.expm(m B), shape (*m.shape, d, d)."""
    import scipy.linalg  # here: a worker process that never calls it need not import it

    b = generator(head_dim, layout=layout, base=base, rotary_dim=rotary_dim)
    m = np.asarray(m)
    if not np.issubdtype(m.dtype, np.integer):
        raise TypeError(f"positions must be integers, got dtype {m.dtype}")
    return scipy.linalg.expm(m.astype(np.float64)[..., None, None] * b)


def rope_matrix_form(x, m, *, layout: str, base: float = DEFAULT_BASE, rotary_dim: int | None = None) -> np.ndarray:
    """y = R_m x (seed eq. 7)."""
    x = np.asarray(x, dtype=np.float64)
    rot = rotation_matrix(m, x.shape[-1], layout=layout, base=base, rotary_dim=rotary_dim)
    return np.einsum("...ij,...j->...i", rot, x)


def rope_complex_form(x, m, *, base: float = DEFAULT_BASE, rotary_dim: int | None = None) -> np.ndarray:
    """Interleaved: z_i = x_2i + 1j x_2i+1 -> z_i * exp(1j m theta_i) (seed eq. 5, Meta LLaMA)."""
    x, r, phi = _prepare(x, m, base, rotary_dim)
    z = x[..., 0:r:2] + 1j * x[..., 1:r:2]
    w = z * np.exp(1j * phi)
    y_rot = np.stack([w.real, w.imag], axis=-1).reshape(x.shape[:-1] + (r,))
    return _with_tail(y_rot, x, r)


def rope_elementwise_form(x, m, *, base: float = DEFAULT_BASE, rotary_dim: int | None = None) -> np.ndarray:
    """Interleaved: x * cos_vec + (-x_1, x_0, -x_3, x_2, ...) * sin_vec (seed eq. 8)."""
    x, r, phi = _prepare(x, m, base, rotary_dim)
    cos_vec = np.repeat(np.cos(phi), 2, axis=-1)
    sin_vec = np.repeat(np.sin(phi), 2, axis=-1)
    xr = x[..., :r]
    rotated = np.stack([-xr[..., 1::2], xr[..., 0::2]], axis=-1).reshape(xr.shape)
    return _with_tail(xr * cos_vec + rotated * sin_vec, x, r)


def rope_rotate_half_form(x, m, *, base: float = DEFAULT_BASE, rotary_dim: int | None = None) -> np.ndarray:
    """Half layout: x * cat(cos, cos) + cat(-x2, x1) * cat(sin, sin) (GPT-NeoX, HF rotate_half)."""
    x, r, phi = _prepare(x, m, base, rotary_dim)
    cos = np.concatenate([np.cos(phi)] * 2, axis=-1)
    sin = np.concatenate([np.sin(phi)] * 2, axis=-1)
    x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
    rotate_half = np.concatenate([-x2, x1], axis=-1)
    return _with_tail(x[..., :r] * cos + rotate_half * sin, x, r)
