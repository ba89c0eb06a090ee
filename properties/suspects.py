"""The usual suspects of a ``reference`` failure (``properties.diagnosis`` tries them): each
a ``Candidate`` whose model predicts what a kernel with that defect returns on the probe
(a wrong rotation computed exactly, or an envelope around the declared reference for a
rounding defect), with its fitted parameters and how it is described.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import numpy as np
import torch

from ropecheck.properties.core.dtypes import SUBNORMAL_SPACING, UNIT_ROUNDOFF, torch_dtype
from ropecheck.reference import pair_indices, rotated_pairs
from ropecheck.reference.scaling import Linear, Scaling

SAME = 1e-3  # a fitted base or scale this close to the declared one is no diagnosis


@dataclass(frozen=True)
class Probe:
    ctx: Any
    x64: np.ndarray  # (2, seq, HEADS, head_dim): the input's exact values
    positions: np.ndarray  # (2, seq) int64
    y: np.ndarray  # the target's output in float64, the declared amplitude divided out

    @property
    def convention(self):
        return self.ctx.convention

    @property
    def head_dim(self) -> int:
        return self.x64.shape[-1]

    @property
    def rotary(self) -> int:
        return self.convention.rotary_dim_for(self.head_dim)

    def pairs(self):
        return pair_indices(self.rotary, self.convention.layout)


@dataclass(frozen=True)
class Model:
    """A candidate's float64 output and allowed |target - y| per element; envelopes also
    bound the change of each declared pair's norm."""

    y: np.ndarray
    bound: np.ndarray
    positions: Optional[np.ndarray] = None  # (batch, seq): those an exact candidate rotates by
    norm_bound: Optional[np.ndarray] = None  # (..., r/2)


@dataclass(frozen=True)
class Candidate:
    name: str
    model: Callable[[Probe, Any], Optional[Model]]  # None: the option does not apply
    describe: Callable[[Probe, Any], tuple[str, str]]  # (the cause, what the target equals)
    options: Callable[[Probe], Any] = lambda probe: (None,)  # tried in order, first fit wins
    exact: bool = True


# --- models -----------------------------------------------------------------------------


def rotation(probe: Probe, convention=None, positions=None, start=0, inverse=False) -> Model:
    """``convention`` (default: the declared one) at ``positions`` (default: the probe's)
    on the features from ``start`` on, those before passing through; the allowance is the
    error model's for that computation."""
    convention = convention or probe.convention
    m = probe.positions if positions is None else positions
    x, model = probe.x64, probe.ctx.model
    y, bound = x.copy(), model.pass_through_bound(x)
    y[..., start:] = convention.apply(x[..., start:], m, inverse=inverse)
    bound[..., start:] = model.element_bound(x[..., start:], m, convention)
    # the target's output was divided by the declared amplitude, not this convention's
    amplitude = convention.amplitude / probe.convention.amplitude
    if amplitude != 1.0:
        rotated = slice(start, start + convention.rotary_dim_for(x.shape[-1] - start))
        y[..., rotated] *= amplitude
        bound[..., rotated] *= amplitude
    return Model(y, bound, positions=m)


def _in_dtype(positions: np.ndarray, dtype: str) -> np.ndarray:
    """The positions as ``dtype`` holds them, in float64 (inf past its range)."""
    return torch.from_numpy(positions).to(torch_dtype(dtype)).to(torch.float64).numpy()


def _rounded_positions(probe: Probe, dtype: str) -> Optional[Model]:
    m = _in_dtype(probe.positions, dtype)
    if not np.all(np.isfinite(m)) or np.array_equal(m, probe.positions):
        return None
    return rotation(probe, positions=m.astype(np.int64))


def _partial(kind: str):
    def model(probe: Probe, _) -> Optional[Model]:
        r, d, conv = probe.convention.rotary_dim, probe.head_dim, probe.convention
        if r is None or r >= d:
            return None
        whole = replace(conv, rotary_dim=None)
        if kind == "last":
            return rotation(probe, whole, start=d - r)
        if kind == "whole":
            return rotation(probe, whole)
        # theta_i = base^(-2i/d) = (base^(r/d))^(-2i/r): the same float32 operations
        return rotation(probe, replace(conv, base=conv.base ** (r / d)))

    return model


def _fraction_as_rotary_dim(probe: Probe, _) -> Optional[Model]:
    """p-RoPE written as partial rotary (Megatron-Bridge #4195): the first 2k features
    rotate, every pair of them, k = the pairs p-RoPE turns."""
    conv = probe.convention
    if conv.rotated_fraction == 1.0:
        return None
    turning = rotated_pairs(probe.rotary, conv.rotated_fraction)
    return rotation(probe, replace(conv, rotary_dim=2 * turning, rotated_fraction=1.0))


def _describe_fraction(probe: Probe) -> tuple[str, str]:
    r, k = probe.rotary, rotated_pairs(probe.rotary, probe.convention.rotated_fraction)
    return (
        f"p-RoPE is computed as partial rotary (Megatron-Bridge #4195): the first {2 * k} features rotate, every "
        f"pair with theta_i = base^(-2i/{2 * k}), not the pairs of all {r} features with only the first {k} "
        f"turning, theta_i = base^(-2i/{r})",
        f"the reference with rotary_dim {2 * k} and every pair turning",
    )


def _rounding(probe: Probe, option) -> Optional[Model]:
    """The envelopes of the module docstring, around the declared reference (None: not
    applicable, or angle rounding that does not show where it must)."""
    kind, dtype = option
    ctx, conv, x, m = probe.ctx, probe.convention, probe.x64, probe.positions
    u, tiny = UNIT_ROUNDOFF[dtype], SUBNORMAL_SPACING[dtype]
    if kind == "cos/sin" and u <= ctx.model.unit:
        return None
    theta = conv.theta(probe.head_dim, m)
    dphi = ctx.model.declared_angle_error(m, conv, probe.head_dim)[:, :, None, :]
    if kind == "angles":
        g = (1.0 + u) ** 3
        m_abs = np.abs(m)[..., None, None]
        slack = np.minimum(g * dphi + (g - 1.0) * m_abs * theta + (m_abs + 1.0) * tiny, 2.0)
    else:
        slack = np.minimum(dphi, 2.0) + u + tiny
    reference = rotation(probe)
    if kind == "angles":  # the rounding must show at every probed position L cannot hold
        unheld = _in_dtype(m, dtype) != m
        missed = (np.abs(probe.y - reference.y) > reference.bound).any(axis=(2, 3))
        if not unheld.any() or not missed[unheld].all():
            return None
    i, j = probe.pairs()
    rho = np.hypot(x[..., i], x[..., j])
    bound = reference.bound.copy()
    bound[..., i] = bound[..., j] = ctx.model.pair_bound(rho, slack)
    norm = ctx.model.norm_bound(rho) + ((u + tiny) * rho if kind == "cos/sin" else 0.0)
    return Model(reference.y, bound, norm_bound=norm)


# --- fitted parameters -------------------------------------------------------------------


def _measured_theta(probe: Probe) -> Optional[np.ndarray]:
    """theta_i as the target turns each declared pair: the angle at position 1, refined
    over row 0's larger positions by taking the 2 pi branch nearest m theta_i."""
    i, j = probe.pairs()
    x, y, m = probe.x64[0], probe.y[0], probe.positions[0]
    turn = np.angle(((x[..., i] - 1j * x[..., j]) * (y[..., i] + 1j * y[..., j])).sum(axis=1))
    if 1 not in m:
        return None
    theta = turn[list(m).index(1)]
    for k in np.argsort(m):
        if m[k] > 1:
            branch = np.round((m[k] * theta - turn[k]) / (2 * math.pi))
            theta = (turn[k] + 2 * math.pi * branch) / m[k]
    return theta


def _round_numbers(value: float) -> list[float]:
    """value to 1, 2, ... 6 significant digits, then itself: the simplest that fits wins."""
    return list(dict.fromkeys([float(f"{value:.{k}g}") for k in range(1, 7)] + [value]))


def _bases(probe: Probe) -> list[tuple[float, float]]:
    """(base, fitted base): least squares ln(theta_i / theta_0) = -(2i/r) ln(base)."""
    theta = _measured_theta(probe)
    if theta is None or len(theta) < 2 or not np.all(theta > 0):
        return []
    e = 2.0 * np.arange(1, len(theta)) / probe.rotary
    fitted = math.exp(-np.sum(e * np.log(theta[1:] / theta[0])) / np.sum(e * e))
    return [
        (b, fitted)
        for b in _round_numbers(fitted)
        if b > 1 and math.isfinite(b) and not math.isclose(b, probe.convention.base, rel_tol=SAME)
    ]


def _scales(probe: Probe) -> list[tuple[float, float]]:
    """(factor s, fitted s): theta_0 = 1 / s under linear position interpolation."""
    theta = _measured_theta(probe)
    if theta is None or not theta[0] > 0:
        return []
    fitted = 1.0 / float(theta[0])
    return [
        (s, fitted)
        for s in _round_numbers(fitted)
        if s > 0 and not math.isclose(s, 1.0, rel_tol=SAME) and Linear(factor=s) != probe.convention.scaling
    ]


def _declared_scaling(probe: Probe) -> str:
    scaling = probe.convention.scaling
    return "none" if scaling.rope_type == "default" else scaling.flag()


def _unscaled(probe: Probe, _) -> Optional[Model]:
    if probe.convention.scaling.rope_type == "default":
        return None
    return rotation(probe, replace(probe.convention, scaling=Scaling()))


# --- the candidates -----------------------------------------------------------------------

PAIRING = {"half": "(i, i + r/2)", "interleaved": "(2i, 2i + 1)"}
OTHER = {"half": "interleaved", "interleaved": "half"}


def _shift(k: int) -> str:
    return f"m {'+' if k > 0 else '-'} {abs(k)}"


def _describe_rounding(probe: Probe, option) -> tuple[str, str]:
    kind, dtype = option
    bits = int(round(-math.log2(UNIT_ROUNDOFF[dtype])))
    if kind == "cos/sin":
        return (
            f"cos and sin are rounded to {dtype} while x is {probe.ctx.dtype}",
            f"stays within {dtype}'s rounding of cos and sin (2^-{bits} of each pair's norm "
            "beyond the float32 error model) at every position",
        )
    return (
        f"the angles m*theta_i (or the positions) are held in {dtype}",
        f"grows with |m theta_i| within {dtype}'s rounding of the angle (3 * 2^-{bits} |m theta_i|)",
    )


CANDIDATES = (
    Candidate(
        "clockwise",
        lambda p, _: rotation(p, inverse=True),
        lambda p, _: ("the target rotates clockwise", "the reference at -m"),
    ),
    Candidate(
        "layout",
        lambda p, _: rotation(p, replace(p.convention, layout=OTHER[p.convention.layout])),
        lambda p, _: (
            f"the target pairs features {PAIRING[OTHER[p.convention.layout]]}, the "
            f"{OTHER[p.convention.layout]} layout, not {PAIRING[p.convention.layout]}, "
            f"the declared {p.convention.layout} layout",
            f"the {OTHER[p.convention.layout]}-layout reference",
        ),
    ),
    Candidate(
        "offset",
        lambda p, k: rotation(p, positions=p.positions + k),
        lambda p, k: (f"positions are off by {k:+d}", f"the reference at {_shift(k)}"),
        options=lambda p: (1, -1, 2, -2, 3, -3),
    ),
    Candidate(
        "positions-ignored",
        lambda p, _: rotation(p, positions=np.broadcast_to(np.arange(p.positions.shape[1]), p.positions.shape)),
        lambda p, _: (
            "the positions are ignored: the target uses 0 .. seq-1 in every row",
            "the reference at positions 0 .. seq-1",
        ),
    ),
    Candidate(
        "first-row-positions",
        lambda p, _: rotation(p, positions=np.broadcast_to(p.positions[:1], p.positions.shape)),
        lambda p, _: ("every batch row gets row 0's positions", "the reference with row 0's positions in every row"),
    ),
    Candidate(
        "no-rotation",
        lambda p, _: rotation(p, positions=np.zeros_like(p.positions)),
        lambda p, _: ("the target does not rotate at all", "its input"),
    ),
    Candidate(
        "positions-rounded",
        _rounded_positions,
        lambda p, dtype: (
            f"positions are rounded to {dtype} before the angle is formed",
            f"the reference at {dtype}(m)",
        ),
        options=lambda p: ("float16", "bfloat16"),
    ),
    Candidate(
        "last-features",
        _partial("last"),
        lambda p, _: (
            f"the last {p.rotary} features rotate instead of the first {p.rotary}",
            f"the reference applied to features {p.head_dim - p.rotary} .. {p.head_dim - 1}",
        ),
    ),
    Candidate(
        "whole-head",
        _partial("whole"),
        lambda p, _: (
            f"the whole head rotates (head_dim {p.head_dim}), not the declared first {p.rotary} features",
            f"the reference with rotary_dim {p.head_dim}",
        ),
    ),
    Candidate(
        "theta-from-head-dim",
        _partial("theta"),
        lambda p, _: (
            f"the frequencies come from head_dim: theta_i = base^(-2i/{p.head_dim}), not base^(-2i/{p.rotary})",
            f"the reference with theta_i = base^(-2i/{p.head_dim})",
        ),
    ),
    Candidate(
        "rotated-fraction-as-rotary-dim",
        _fraction_as_rotary_dim,
        lambda p, _: _describe_fraction(p),
    ),
    Candidate(
        "scaling-not-applied",
        _unscaled,
        lambda p, _: (f"the declared scaling ({_declared_scaling(p)}) is not applied", "the unscaled reference"),
    ),
    Candidate(
        "linear-scale",
        lambda p, s: rotation(p, replace(p.convention, scaling=Linear(factor=s[0]))),
        lambda p, s: (
            f"positions are scaled by 1/{s[0]:g} (linear interpolation, factor "
            f"{s[0]:g}; fitted from its angles: {s[1]:.7g}), not as declared "
            f"(scaling: {_declared_scaling(p)})",
            f"the reference with linear scaling factor {s[0]:g}",
        ),
        options=_scales,
    ),
    Candidate(
        "base",
        lambda p, b: rotation(p, replace(p.convention, base=b[0])),
        lambda p, b: (
            f"the target uses base {b[0]:g} (fitted from its angles: {b[1]:.7g}), not {p.convention.base:g}",
            f"the reference with base {b[0]:g}",
        ),
        options=_bases,
    ),
    Candidate(
        "rounding",
        _rounding,
        _describe_rounding,
        options=lambda p: (
            ("cos/sin", "float16"),
            ("cos/sin", "bfloat16"),
            ("angles", "float16"),
            ("angles", "bfloat16"),
        ),
        exact=False,
    ),
)
