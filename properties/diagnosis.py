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

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ropecheck.properties import interface_causes
from ropecheck.properties.core.contract import CallError
from ropecheck.properties.core.dtypes import torch_dtype
from ropecheck.properties.inputs.cases import as_float64
from ropecheck.properties.interfaces import context_parallel
from ropecheck.properties.suspects import CANDIDATES, Candidate, Model, Probe, rotation

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
    """The target's output on the probe; where the call fails (a kernel that reads past
    its table at the largest positions), the probe again within half the range."""
    head_dim = ctx.target.rotary_dim or DEFAULT_HEAD_DIM
    if ctx.convention.rotary_dim is not None:
        head_dim += PASS_THROUGH
    for limit in (ctx.max_position, ctx.max_position // 2):
        positions = interface_causes.table_probe_positions(
            probe_positions(limit), bool(getattr(ctx.target, "row_offsets", False)), limit
        )
        values = np.random.default_rng(SEED).standard_normal((2, positions.shape[1], HEADS, head_dim))
        x = torch.from_numpy(values).to(torch_dtype(ctx.dtype)).contiguous()
        try:
            y = ctx.rope(x, torch.from_numpy(positions))
        except CallError:
            continue
        return Probe(ctx, as_float64(x), positions, ctx.unscale(as_float64(y)))
    return None


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
        assert model.positions is not None  # an exact candidate rotates by positions of its own
        rel = _relative(probe, model, small & (np.abs(model.positions) <= SMALL))
        text = (
            f"{cause} (it equals {what} to {rel:.0e} at positions 0..{SMALL}, and to "
            f"{score:.2f} of the error bound up to position {largest})"
        )
    else:
        rel = _relative(probe, model, small)
        text = (
            f"{cause} (its error is {rel:.0e} of |x| at positions 0..{SMALL} and "
            f"{_relative(probe, model):.0e} up to position {largest}: it {what}; "
            f"{score:.2f} of that allowance)"
        )
    text = interface_causes.cause(probe, candidate.name, option, text)
    return Suspect(candidate.name, _option_text(option), text, score, rel, candidate.exact)


def suspects(ctx) -> list[Suspect]:
    """The candidates that fit the target's probe output, exact ones first; empty when the
    target agrees with the declared reference on the probe (nothing to explain), when it
    declares no convention, or when the probe call fails (``CallError``)."""
    if ctx.convention is None:
        return []
    probe = _probe(ctx)
    if probe is None or _score(probe, rotation(probe)) <= 1.0:
        return []
    found = []
    for candidate in interface_causes.candidates(probe) + CANDIDATES:
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
    """'likely cause: ...' for the first suspect, or None when nothing fits; under context
    parallelism, first the ranks and chunks rotated at positions not theirs."""
    split = context_parallel.likely_cause(ctx)
    if split:
        return split
    found = suspects(ctx)
    return f"likely cause: {found[0].cause}" if found else None


__all__ = ["Suspect", "Candidate", "CANDIDATES", "suspects", "likely_cause", "probe_positions"]
