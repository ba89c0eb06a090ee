"""Property checks for RoPE's relatives (``reference.relatives``), driven by what each family
promises (``reference.relatives.FAMILIES``): a promised property must hold, a property the
family is known to break must fail (negative controls), and the rest are not judged.

Implementations are float64 callables:
- "relativity": ``scores(q, k, q_pos, k_pos) -> (nq, nk)`` unchanged when both shift by c;
- "norm": ``encode(x, pos) -> y`` with |y| = |x| per token;
- "relative-bias": ``bias(q_pos, k_pos) -> (..., nq, nk)`` unchanged when both shift by c;
- "linear-equals-quadratic": ``(linear, quadratic)``, each ``attn(q, k, v, pos) -> out``, equal;
- "shift-invariance": ``attn(q, k, v, pos)`` unchanged when pos shifts by c.
Bounds: float64 arithmetic on O(d) terms with angles m theta, m <= 2^14: errors below
RTOL = 1e-9 of the magnitudes summed (the angle alone errs by <= 2^14 2^-53 ~ 2e-12).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ropecheck.reference.relatives import FAMILIES

RTOL = 1e-9
SHIFTS = (1, 7, 1000)


def _positions(rng, n, top=2**12):
    return np.sort(rng.integers(0, top, size=n))


def relativity(scores: Callable, d: int = 16, n: int = 6, seed: int = 0) -> bool:
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    pq, pk = _positions(rng, n), _positions(rng, n)
    s0 = scores(q, k, pq, pk)
    scale = np.abs(q).sum(-1)[:, None] * np.abs(k).sum(-1)[None, :] * 8  # xPos scales by <= zeta^-(8)
    return all(np.all(np.abs(scores(q, k, pq + c, pk + c) - s0) <= RTOL * scale) for c in SHIFTS)


def norm(encode: Callable, d: int = 16, n: int = 6, seed: int = 0) -> bool:
    rng = np.random.default_rng(seed)
    x, p = rng.standard_normal((n, d)), _positions(rng, n)
    nx = np.linalg.norm(x, axis=-1)
    return bool(np.all(np.abs(np.linalg.norm(encode(x, p), axis=-1) - nx) <= RTOL * nx))


def relative_bias(bias: Callable, n: int = 8, seed: int = 0) -> bool:
    rng = np.random.default_rng(seed)
    pq, pk = _positions(rng, n, 300), _positions(rng, n, 300)
    b0 = np.asarray(bias(pq, pk), np.float64)
    return all(np.allclose(np.asarray(bias(pq + c, pk + c), np.float64), b0, rtol=RTOL, atol=RTOL) for c in SHIFTS)


def linear_equals_quadratic(pair, d: int = 8, n: int = 7, seed: int = 0) -> bool:
    linear, quadratic = pair
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((n, d)), rng.standard_normal((n, d)), rng.standard_normal((n, 3))
    p = np.arange(n) + 5
    a, b = linear(q, k, v, p), quadratic(q, k, v, p)
    return bool(np.allclose(a, b, rtol=1e-9, atol=1e-9 * np.abs(b).max()))


def shift_invariance(attn: Callable, d: int = 8, n: int = 7, seed: int = 0) -> bool:
    if isinstance(attn, tuple):
        attn = attn[0]
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((n, d)), rng.standard_normal((n, d)), rng.standard_normal((n, 3))
    p = np.arange(n)
    a = attn(q, k, v, p)
    return all(np.allclose(attn(q, k, v, p + c), a, rtol=1e-9, atol=1e-9 * np.abs(a).max()) for c in SHIFTS)


CHECKS: dict[str, Callable[..., bool]] = {
    "relativity": relativity,
    "norm": norm,
    "relative-bias": relative_bias,
    "linear-equals-quadratic": linear_equals_quadratic,
    "shift-invariance": shift_invariance,
}


def judge(family: str, impls: dict) -> dict:
    """{property: (holds, as the family says)} for every property the family promises or
    breaks; ``impls`` maps the property to the callable it needs."""
    fam = FAMILIES[family]
    out = {}
    for prop in sorted(fam.promises | fam.breaks):
        holds = bool(CHECKS[prop](impls[prop]))
        out[prop] = (holds, holds == (prop in fam.promises))
    return out


def conforms(family: str, impls: dict) -> bool:
    return all(ok for _, ok in judge(family, impls).values())
