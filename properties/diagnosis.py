"""Diagnosis: when ``reference`` fails, test the usual suspects and name the one that fits.

One probe call: two batch rows (row 1 is row 0 reversed, so every row has its own
positions), positions 0..3 (frequency fitting), 100, 1000, the float16/bfloat16
rounding points below, and large ones up to min(max_position, 2^20 + 2^12); head_dim
the declared rotary dimension plus 32 pass-through features, else the target's head
size or 128. The target's output (amplitude divided out) is compared in float64 with
each candidate, a small record: its name, the options it tries in order (an offset k, a
dtype, a fitted base), the model it predicts for an option, and a description.

A candidate *fits* when the target is within the candidate's allowance at every element.

Exact candidates (a wrong rotation, computed correctly) predict a float64 output and
allow exactly what ``reference`` allows a correct kernel: ``ctx.model.element_bound`` for
the candidate's input, positions and convention (a float32 angle allowance at m, pass-
through features one output rounding).

Rounding candidates are envelopes around the declared reference: u_L is the unit
roundoff of the low-precision dtype L, rho a pair's norm, dphi32 the float32 angle
allowance, the rest of the pair bound (K u rho + floor) as in ``ErrorModel.pair_bound``.

- cos/sin rounded to L (only where u_L exceeds the compute unit: cos/sin held in the
  compute dtype is what the error model already allows):
  |fl_L(c) - c| <= u_L |c| + s_L/2 (s_L: L's subnormal spacing), same for s, so
  |a dc - b ds| <= u_L (|a||c| + |b||s|) + s_L rho <= (u_L + s_L) rho at every m: the
  allowance is rho (K u + min(dphi32, 2) + u_L + s_L), independent of m; each pair's
  norm is scaled by sqrt(c'^2 + s'^2), within u_L + s_L of 1: |y| - rho within
  ``norm_bound(rho)`` + (u_L + s_L) rho.
- angles m*theta_i (or positions) held in L: the position, theta_i and their product
  each round once, so with g = (1 + u_L)^3 the angle is off by at most
  g dphi32 + (g - 1) |m theta_i| + (|m| + 1) s_L (about 3 u_L |m theta_i|: it grows with
  the angle; the s_L term is theta_i or the product underflowing in float16), and a
  rotation by a wrong angle moves a pair by at most 2 rho; the allowance is
  rho (K u + min(that, 2)); a rotation keeps norms, so |y| - rho within ``norm_bound(rho)``.

An envelope holds every target inside it, a correct one included, so nothing is named
when the target agrees with the declared reference, and the envelopes are tried from
the tightest to the loosest, the first that holds the target named: cos/sin in float16,
then bfloat16 (bounded at every m), then angles in float16, then bfloat16 (growing with
m). The two kinds differ in how the error grows with the position: angle rounding moves
the fastest pair (theta_0 = 1) by a radian or more at every probed position L cannot
hold (2049, 4097, 4111, ...: no cos/sin allowance holds that), and cos/sin rounding
changes pair norms (no angle allowance holds that). An angle envelope saturates at
large m (it holds any wrong angle once it allows 2 rho), so it also requires the target
to miss the reference at every probed position L cannot hold: a cos/sin table that
clamps past its length, wrong only at the largest positions, is not angle rounding.

When several candidates fit, the exact ones come first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import numpy as np
import torch

from ropecheck.properties.cases import as_float64
from ropecheck.reference import pair_indices
from ropecheck.reference.scaling import Linear, Scaling
from ropecheck.calling import CallError
from ropecheck.dtypes import SUBNORMAL_SPACING, UNIT_ROUNDOFF, torch_dtype

HEADS = 4
SEED = 20261123
DEFAULT_HEAD_DIM = 128
PASS_THROUGH = 32
SMALL = 3  # positions 0 .. SMALL: where float32 angles are exact to a few ulps
# 2049, 4097: float16 and bfloat16 round them to 2048, 4096; 4111 = 2^12 + 2^4 - 1,
# 65791 = 2^16 + 2^8 - 1 and 2^20 + 2^12 - 1: bfloat16 rounds them down by almost
# u_bf16 m, the most it can (float16 does not hold 65791 and beyond: it overflows).
POSITIONS = (0, 1, 2, 3, 100, 1000, 2049, 4097, 4111, 65791, 2**20 + 2**12 - 1)
LARGEST = 2**20
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


@dataclass(frozen=True)
class Suspect:
    name: str
    option: str  # the option that fits: "+1", "bfloat16", "1000", ... ("" for none)
    cause: str  # the sentence, measured agreement included
    error: float  # max |target - candidate| in units of the candidate's allowance (<= 1)
    relative: float  # max |target - candidate| / |x| per head vector at positions <= SMALL
    exact: bool


# --- the probe ------------------------------------------------------------------------

def probe_positions(limit: int) -> np.ndarray:
    row = sorted({p for p in POSITIONS if p <= limit} | {min(limit, LARGEST)})
    return np.array([row, row[::-1]], dtype=np.int64)


def _probe(ctx) -> Optional[Probe]:
    head_dim = ctx.target.rotary_dim or DEFAULT_HEAD_DIM
    if ctx.convention.rotary_dim is not None:
        head_dim += PASS_THROUGH
    positions = probe_positions(ctx.max_position)
    values = np.random.default_rng(SEED).standard_normal((2, positions.shape[1], HEADS, head_dim))
    x = torch.from_numpy(values).to(torch_dtype(ctx.dtype)).contiguous()
    try:
        y = ctx.rope(x, torch.from_numpy(positions))
    except CallError:
        return None
    return Probe(ctx, as_float64(x), positions, ctx.unscale(as_float64(y)))


# --- models -----------------------------------------------------------------------------

def _rotation(probe: Probe, convention=None, positions=None, start=0, inverse=False) -> Model:
    """``convention`` (default: the declared one) at ``positions`` (default: the probe's)
    on the features from ``start`` on, those before passing through; the allowance is the
    error model's for that computation."""
    convention = convention or probe.convention
    m = probe.positions if positions is None else positions
    x, model = probe.x64, probe.ctx.model
    y, bound = x.copy(), np.abs(x) * model.output_unit + model.floor
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
    return _rotation(probe, positions=m.astype(np.int64))


def _partial(kind: str):
    def model(probe: Probe, _) -> Optional[Model]:
        r, d, conv = probe.convention.rotary_dim, probe.head_dim, probe.convention
        if r is None or r >= d:
            return None
        whole = replace(conv, rotary_dim=None)
        if kind == "last":
            return _rotation(probe, whole, start=d - r)
        if kind == "whole":
            return _rotation(probe, whole)
        # theta_i = base^(-2i/d) = (base^(r/d))^(-2i/r): the same float32 operations
        return _rotation(probe, replace(conv, base=conv.base ** (r / d)))
    return model


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
    reference = _rotation(probe)
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
    return [(b, fitted) for b in _round_numbers(fitted)
            if b > 1 and math.isfinite(b) and not math.isclose(b, probe.convention.base, rel_tol=SAME)]


def _scales(probe: Probe) -> list[tuple[float, float]]:
    """(factor s, fitted s): theta_0 = 1 / s under linear position interpolation."""
    theta = _measured_theta(probe)
    if theta is None or not theta[0] > 0:
        return []
    fitted = 1.0 / float(theta[0])
    return [(s, fitted) for s in _round_numbers(fitted)
            if s > 0 and not math.isclose(s, 1.0, rel_tol=SAME)
            and Linear(factor=s) != probe.convention.scaling]


def _declared_scaling(probe: Probe) -> str:
    scaling = probe.convention.scaling
    return "none" if scaling.rope_type == "default" else scaling.flag()


def _unscaled(probe: Probe, _) -> Optional[Model]:
    if probe.convention.scaling.rope_type == "default":
        return None
    return _rotation(probe, replace(probe.convention, scaling=Scaling()))


# --- the candidates -----------------------------------------------------------------------

PAIRING = {"half": "(i, i + r/2)", "interleaved": "(2i, 2i + 1)"}
OTHER = {"half": "interleaved", "interleaved": "half"}


def _shift(k: int) -> str:
    return f"m {'+' if k > 0 else '-'} {abs(k)}"


def _describe_rounding(probe: Probe, option) -> tuple[str, str]:
    kind, dtype = option
    bits = int(round(-math.log2(UNIT_ROUNDOFF[dtype])))
    if kind == "cos/sin":
        return (f"cos and sin are rounded to {dtype} while x is {probe.ctx.dtype}",
                f"stays within {dtype}'s rounding of cos and sin (2^-{bits} of each pair's norm "
                "beyond the float32 error model) at every position")
    return (f"the angles m*theta_i (or the positions) are held in {dtype}",
            f"grows with |m theta_i| within {dtype}'s rounding of the angle (3 * 2^-{bits} |m theta_i|)")


CANDIDATES = (
    Candidate("clockwise", lambda p, _: _rotation(p, inverse=True),
              lambda p, _: ("the target rotates clockwise", "the reference at -m")),
    Candidate("layout", lambda p, _: _rotation(p, replace(p.convention, layout=OTHER[p.convention.layout])),
              lambda p, _: (f"the target pairs features {PAIRING[OTHER[p.convention.layout]]}, the "
                            f"{OTHER[p.convention.layout]} layout, not {PAIRING[p.convention.layout]}, "
                            f"the declared {p.convention.layout} layout",
                            f"the {OTHER[p.convention.layout]}-layout reference")),
    Candidate("offset", lambda p, k: _rotation(p, positions=p.positions + k),
              lambda p, k: (f"positions are off by {k:+d}", f"the reference at {_shift(k)}"),
              options=lambda p: (1, -1, 2, -2, 3, -3)),
    Candidate("positions-ignored",
              lambda p, _: _rotation(p, positions=np.broadcast_to(np.arange(p.positions.shape[1]),
                                                                  p.positions.shape)),
              lambda p, _: ("the positions are ignored: the target uses 0 .. seq-1 in every row",
                            "the reference at positions 0 .. seq-1")),
    Candidate("first-row-positions",
              lambda p, _: _rotation(p, positions=np.broadcast_to(p.positions[:1], p.positions.shape)),
              lambda p, _: ("every batch row gets row 0's positions",
                            "the reference with row 0's positions in every row")),
    Candidate("no-rotation", lambda p, _: _rotation(p, positions=np.zeros_like(p.positions)),
              lambda p, _: ("the target does not rotate at all", "its input")),
    Candidate("positions-rounded", _rounded_positions,
              lambda p, dtype: (f"positions are rounded to {dtype} before the angle is formed",
                                f"the reference at {dtype}(m)"),
              options=lambda p: ("float16", "bfloat16")),
    Candidate("last-features", _partial("last"),
              lambda p, _: (f"the last {p.rotary} features rotate instead of the first {p.rotary}",
                            f"the reference applied to features {p.head_dim - p.rotary} .. "
                            f"{p.head_dim - 1}")),
    Candidate("whole-head", _partial("whole"),
              lambda p, _: (f"the whole head rotates (head_dim {p.head_dim}), not the declared first "
                            f"{p.rotary} features", f"the reference with rotary_dim {p.head_dim}")),
    Candidate("theta-from-head-dim", _partial("theta"),
              lambda p, _: (f"the frequencies come from head_dim: theta_i = base^(-2i/{p.head_dim}), "
                            f"not base^(-2i/{p.rotary})",
                            f"the reference with theta_i = base^(-2i/{p.head_dim})")),
    Candidate("scaling-not-applied", _unscaled,
              lambda p, _: (f"the declared scaling ({_declared_scaling(p)}) is not applied",
                            "the unscaled reference")),
    Candidate("linear-scale", lambda p, s: _rotation(p, replace(p.convention, scaling=Linear(factor=s[0]))),
              lambda p, s: (f"positions are scaled by 1/{s[0]:g} (linear interpolation, factor "
                            f"{s[0]:g}; fitted from its angles: {s[1]:.7g}), not as declared "
                            f"(scaling: {_declared_scaling(p)})",
                            f"the reference with linear scaling factor {s[0]:g}"),
              options=_scales),
    Candidate("base", lambda p, b: _rotation(p, replace(p.convention, base=b[0])),
              lambda p, b: (f"the target uses base {b[0]:g} (fitted from its angles: {b[1]:.7g}), "
                            f"not {p.convention.base:g}", f"the reference with base {b[0]:g}"),
              options=_bases),
    Candidate("rounding", _rounding, _describe_rounding,
              options=lambda p: (("cos/sin", "float16"), ("cos/sin", "bfloat16"),
                                 ("angles", "float16"), ("angles", "bfloat16")),
              exact=False),
)


# --- scoring ------------------------------------------------------------------------------

def _score(probe: Probe, model: Model) -> float:
    score = float((np.abs(probe.y - model.y) / model.bound).max())
    if model.norm_bound is not None:
        i, j = probe.pairs()
        change = np.hypot(probe.y[..., i], probe.y[..., j]) - np.hypot(probe.x64[..., i], probe.x64[..., j])
        score = max(score, float((np.abs(change) / model.norm_bound).max()))
    return score


def _relative(probe: Probe, model: Model, where=None) -> float:
    ratio = np.linalg.norm(probe.y - model.y, axis=-1) / np.linalg.norm(probe.x64, axis=-1)
    return float(ratio[where].max() if where is not None and where.any() else ratio.max())


def _option_text(option) -> str:
    if option is None:
        return ""
    if isinstance(option, int):
        return f"{option:+d}"
    if isinstance(option, tuple):
        return f"{option[0]}-{option[1]}" if isinstance(option[0], str) else f"{option[0]:g}"
    return str(option)


def _suspect(probe: Probe, candidate: Candidate, option, model: Model, score: float) -> Suspect:
    cause, what = candidate.describe(probe, option)
    small = np.abs(probe.positions) <= SMALL
    largest = int(probe.positions.max())
    if candidate.exact:
        rel = _relative(probe, model, small & (np.abs(model.positions) <= SMALL))
        text = (f"{cause} (it equals {what} to {rel:.0e} at positions 0..{SMALL}, and to "
                f"{score:.2f} of the error bound up to position {largest})")
    else:
        rel = _relative(probe, model, small)
        text = (f"{cause} (its error is {rel:.0e} of |x| at positions 0..{SMALL} and "
                f"{_relative(probe, model):.0e} up to position {largest}: it {what}; "
                f"{score:.2f} of that allowance)")
    return Suspect(candidate.name, _option_text(option), text, score, rel, candidate.exact)


def suspects(ctx) -> list[Suspect]:
    """The candidates that fit the target's probe output, exact ones first; empty when the
    target agrees with the declared reference on the probe (nothing to explain), when it
    declares no convention, or when the probe call fails (``CallError``)."""
    if ctx.convention is None:
        return []
    probe = _probe(ctx)
    if probe is None or _score(probe, _rotation(probe)) <= 1.0:
        return []
    found = []
    for candidate in CANDIDATES:
        for option in candidate.options(probe):
            model = candidate.model(probe, option)
            if model is None:
                continue
            score = _score(probe, model)
            if score <= 1.0:
                found.append(_suspect(probe, candidate, option, model, score))
                break
    return sorted(found, key=lambda s: not s.exact)


def likely_cause(ctx) -> Optional[str]:
    """'likely cause: ...' for the first suspect, or None when nothing fits."""
    found = suspects(ctx)
    return f"likely cause: {found[0].cause}" if found else None


__all__ = ["Suspect", "Candidate", "CANDIDATES", "suspects", "likely_cause", "probe_positions"]
