"""RoPE's relatives, in float64 (seeds: ALiBi / T5 / Transformer-XL / DeBERTa / xPos survey,
linear attention with RoPE, the long-range decay bound).

Each family declares, as data (``FAMILIES``), which properties it promises; the checks in
``properties.relative_checks`` test exactly those and expect the rest to fail where a
family is a negative control.

- xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): q_m -> zeta^(m/s) R_m q,
  k_n -> zeta^(-n/s) R_n k per pair i, zeta_i = (2i/d + gamma)/(1 + gamma), gamma = 0.4,
  s = scale_base (512), pairs in either layout (``interleaved`` as the paper's code, or
  ``half``; ``reference.rope.pair_indices``). The score depends on n - m only (relativity of
  the scaled product), norms are not kept. The seed (004) writes zeta_n = (1+gamma)/(2n/d
  + gamma) with n = 1..d/2 and no scale_base, with q scaled by zeta^(-t), k by zeta^(s):
  the reciprocal of the paper's zeta, the same relative form, a different decay per pair
  (``xpos_zeta(..., seed_form=True)``).
- Linear attention with RoPE (seed 001, eq. 10/11): numerator sum_j [R_i phi(q_i)]^T
  [R_j psi(k_j)] v_j, denominator sum_j phi(q_i)^T psi(k_j) (rotation in the numerator
  only); causal, O(n^2) and O(n) (prefix sums of R_j psi(k_j) v_j^T) forms.
- Sinusoidal absolute encoding: ``reference.sinusoidal`` (additive; fails relativity).
- ALiBi: bias -slope_h |i - j| (causal: -slope_h (i - j)), slopes 2^(-8h/n) for a power of
  two n heads, else those of the next lower power of two followed by every other slope of
  the next higher one (Press et al.'s reference code).
- T5 relative buckets (Raffel et al.; HF ``_relative_position_bucket``): bidirectional or
  causal, num_buckets 32, max_distance 128.
- Transformer-XL score: (a) q_i.k_j + (b) q_i.W R_{i-j} + (c) u.k_j + (d) v.W R_{i-j}, R
  the sinusoidal encoding of the relative distance.
- DeBERTa: delta(i, j) = clip(i - j, -k, k) + k in [0, 2k) (k = max relative positions), the
  index into the relative embedding table (2k - 1 at the top, as the paper writes it).
- Long-range decay (seed 001): (1/(d/2)) sum_{j=1}^{d/2} |S_j|, S_j = sum_{i<j} e^{i r theta_i}.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ropecheck.reference.rope import DEFAULT_BASE, apply_rope, inv_freq, pair_indices
from ropecheck.reference.sinusoidal import sinusoidal_encoding

XPOS_GAMMA = 0.4
XPOS_SCALE_BASE = 512.0


# --- xPos ---------------------------------------------------------------------------


def xpos_zeta(d: int, gamma: float = XPOS_GAMMA, *, seed_form: bool = False) -> np.ndarray:
    """zeta_i per pair, shape (d/2,). Paper: (2i/d + gamma)/(1 + gamma), i = 0..d/2-1.
    ``seed_form``: the seed's (1 + gamma)/(2n/d + gamma), n = 1..d/2."""
    if seed_form:
        n = np.arange(1, d // 2 + 1, dtype=np.float64)
        return (1 + gamma) / (2 * n / d + gamma)
    i = np.arange(0, d // 2, dtype=np.float64)
    return (2 * i / d + gamma) / (1 + gamma)


def apply_xpos(
    x,
    positions,
    *,
    role: str,
    layout: str = "interleaved",
    base: float = DEFAULT_BASE,
    gamma: float = XPOS_GAMMA,
    scale_base: float = XPOS_SCALE_BASE,
) -> np.ndarray:
    """xPos on x (..., d) at integer positions (leading x's shape): R_m x with pair i scaled by
    zeta_i^(m / scale_base) (role 'query') or zeta_i^(-m / scale_base) (role 'key'); pair i is
    the one ``pair_indices(d, layout)`` names."""
    if role not in ("query", "key"):
        raise ValueError(f"role must be 'query' or 'key', got {role!r}")
    x = np.asarray(x, dtype=np.float64)
    m = np.asarray(positions, dtype=np.float64)
    d = x.shape[-1]
    first, second = pair_indices(d, layout)
    power = (m / scale_base) * (1.0 if role == "query" else -1.0)
    pair_scale = xpos_zeta(d, gamma) ** power[..., None]  # (*positions.shape, d/2)
    scale = np.empty(m.shape + (d,))
    scale[..., first] = pair_scale
    scale[..., second] = pair_scale
    scale = scale.reshape(m.shape + (1,) * (x.ndim - 1 - m.ndim) + (d,))
    return apply_rope(x, positions, layout=layout, base=base) * scale


# --- linear attention with RoPE (seed eq. 10/11) -------------------------------------


def _feature_map(x):
    """phi = psi = elu(x) + 1, a non-negative feature map."""
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def linear_attention_quadratic(q, k, v, positions, *, base: float = DEFAULT_BASE) -> np.ndarray:
    """Causal eq. 11, O(n^2): q, k (seq, d), v (seq, dv)."""
    fq, fk = _feature_map(np.asarray(q, np.float64)), _feature_map(np.asarray(k, np.float64))
    rq = apply_rope(fq, positions, layout="interleaved", base=base)
    rk = apply_rope(fk, positions, layout="interleaved", base=base)
    n = len(fq)
    mask = np.tril(np.ones((n, n)))
    num = (rq @ rk.T * mask) @ np.asarray(v, np.float64)
    den = (fq @ fk.T * mask).sum(-1, keepdims=True)
    return num / den


def linear_attention_linear(q, k, v, positions, *, base: float = DEFAULT_BASE) -> np.ndarray:
    """Causal eq. 11, O(n): prefix sums of R_j psi(k_j) v_j^T and psi(k_j)."""
    fq, fk = _feature_map(np.asarray(q, np.float64)), _feature_map(np.asarray(k, np.float64))
    v = np.asarray(v, np.float64)
    rq = apply_rope(fq, positions, layout="interleaved", base=base)
    rk = apply_rope(fk, positions, layout="interleaved", base=base)
    kv = np.cumsum(rk[:, :, None] * v[:, None, :], axis=0)  # (n, d, dv)
    ks = np.cumsum(fk, axis=0)
    return np.einsum("nd,nde->ne", rq, kv) / np.einsum("nd,nd->n", fq, ks)[:, None]


# --- ALiBi ----------------------------------------------------------------------------


def alibi_slopes(n_heads: int) -> np.ndarray:
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")

    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(n_heads).is_integer():
        return np.array(power_of_two(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two(2 * closest)[0::2][: n_heads - closest]
    return np.array(power_of_two(closest) + extra)


def alibi_bias(q_positions, k_positions, n_heads: int, *, causal: bool = False) -> np.ndarray:
    """(heads, nq, nk): -slope_h |i - j| (causal: -slope_h (i - j), for j <= i)."""
    rel = np.asarray(q_positions)[:, None] - np.asarray(k_positions)[None, :]
    dist = rel if causal else np.abs(rel)
    return -alibi_slopes(n_heads)[:, None, None] * dist[None].astype(np.float64)


# --- T5 relative buckets ----------------------------------------------------------------


def t5_bucket(
    relative_position, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> np.ndarray:
    """Bucket of relative_position = key - query (integer array)."""
    rel = np.asarray(relative_position, dtype=np.int64)
    out = np.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        out += (rel > 0).astype(np.int64) * num_buckets
        n = np.abs(rel)
    else:
        n = np.maximum(-rel, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    with np.errstate(divide="ignore"):
        large = max_exact + (
            np.log(np.maximum(n, 1) / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
        ).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return out + np.where(is_small, n, large)


def t5_bias(q_positions, k_positions, table, **kw) -> np.ndarray:
    """(heads, nq, nk): table[bucket(k - q), h], table (num_buckets, heads)."""
    rel = np.asarray(k_positions)[None, :] - np.asarray(q_positions)[:, None]
    return np.moveaxis(np.asarray(table)[t5_bucket(rel, num_buckets=len(table), **kw)], -1, 0)


# --- Transformer-XL --------------------------------------------------------------------


def transformer_xl_scores(q, k, q_positions, k_positions, w_r, u, v) -> np.ndarray:
    """(nq, nk): q.k + q.W R_{i-j} + u.k + v.W R_{i-j}, with R the sinusoidal encoding of
    i - j (shape (d,)), W = w_r (d, d)."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    rel = np.asarray(q_positions)[:, None] - np.asarray(k_positions)[None, :]
    r = sinusoidal_encoding(rel, w_r.shape[1]) @ np.asarray(w_r, np.float64).T  # (nq, nk, d)
    return q @ k.T + np.einsum("id,ijd->ij", q, r) + (k @ u)[None, :] + r @ v


# --- DeBERTa -----------------------------------------------------------------------------


def deberta_relative(q_positions, k_positions, k_max: int) -> np.ndarray:
    """delta(i, j) = clip(i - j, -k, k - 1) + k, in [0, 2k) (the paper's eq. 2 as an index)."""
    rel = np.asarray(q_positions)[:, None] - np.asarray(k_positions)[None, :]
    return np.clip(rel, -k_max, k_max - 1) + k_max


# --- the long-range decay bound -----------------------------------------------------------


def decay_bound(distances, d: int = 128, base: float = DEFAULT_BASE) -> np.ndarray:
    """(1/(d/2)) sum_{j=1}^{d/2} |S_j|, S_j = sum_{i<j} e^{i r theta_i}, for each distance r."""
    theta = inv_freq(d, base)
    r = np.asarray(distances, dtype=np.float64)
    s = np.cumsum(np.exp(1j * r[..., None] * theta), axis=-1)
    return np.abs(s).mean(-1)


# --- what each family promises ------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    name: str
    promises: frozenset  # properties that must hold
    breaks: frozenset = frozenset()  # properties that must fail (negative controls)
    note: str = ""


FAMILIES = {
    "rope": Family("rope", frozenset({"relativity", "norm"})),
    "xpos": Family(
        "xpos",
        frozenset({"relativity"}),
        frozenset({"norm"}),
        "relativity of the scaled product q_m . k_n; norms scale by zeta^(m/s)",
    ),
    "sinusoidal": Family("sinusoidal", frozenset(), frozenset({"relativity", "norm"}), "a negative control"),
    "alibi": Family("alibi", frozenset({"relative-bias"})),
    "t5": Family("t5", frozenset({"relative-bias"})),
    "transformer-xl": Family("transformer-xl", frozenset({"relative-bias"})),
    "deberta": Family("deberta", frozenset({"relative-bias"}), note="within clipping by construction"),
    "linear-attention": Family("linear-attention", frozenset({"linear-equals-quadratic", "shift-invariance"})),
}
