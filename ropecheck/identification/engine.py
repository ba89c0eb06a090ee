"""Identify a RoPE implementation by black-box probing (``ropecheck identify``).

The target is called, through its ``Caller`` (``ropecheck.calling.caller``) only, on the standard
basis: batch 1, one token per probe position m, head_dim = d heads, head j holding e_j.
Output head j at position m is column j of the matrix M_m of the map x -> f(x, m). Two
calls are made: a *small* one at positions 0, 1, 2, 3, 4, 8, ..., 2^10 (below the
max_position_embeddings of every dynamic scheme), which also carries the zero vector and
three integer vectors for the linearity test, and a *large* one at 0, 1, 2, 4, ..., 2^20
(retried up to 2^16, then 2^12, when the target refuses large positions). No probe uses a
position above ``max_position`` (``--max-position``, default 2^24) or the target's declared
``max_position``: each of those tops is capped at it.

What is read from the matrices, in order (each step refuses the target with its reason):

1. f(0, m) = 0 (else the encoding is additive), f(v, m) = M_m v (linear);
2. column norms constant in m, columns orthogonal, M_0 = diag(a_j) (position 0 is the
   identity up to an amplitude). When norms change, how they change is measured: xPos-like
   only when log|f(e_j, m)| is a line in m within rounding while its slope is not
   (``norm_trend``); else the change is reported as it is (size, residuals of that line,
   entries that all are numbers of a coarser dtype, e.g. cos/sin stored in bfloat16);
3. the coupled features: the connected components of {(i, j): |M_m[i, j]| above noise
   for some m}; each must be one feature (pass-through) or a pair (a 2x2 rotation);
4. each pair's 2x2 block is a * R(phi_m); its angle phi_m is unwrapped over the doubling
   positions (predict m * theta, take the nearest 2 pi branch) while the angle error is
   still well under pi/2, which pins the low frequencies; the angles must be linear in m;
5. the pairing is matched to the ``half`` / ``interleaved`` layouts (else reported as an
   exact list of pairs), the sign of the angles gives the direction, the frequencies of
   the two calls are compared (different: they depend on the call's positions, dynamic
   NTK), and log theta_k = -(2k/r) ln(base) - ln(s) is fitted;
6. frequencies that are not geometric: they are measured at the other head dims too
   (EXTRA_HEAD_DIMS and those ``ropecheck check`` draws, when the whole head rotates and the
   target takes them: YaRN's parameters are pinned only per rotary dim); the base from the
   geometric unscaled head (and the tail divided by a factor), the published scalings
   (Llama 3, YaRN) fitted to the rest on the rotary dim with the most pairs and verified at
   every one (``ropecheck.identify_scaling``). Only verified ``--scaling`` values that
   ``reference.scaling.parse`` reads are suggested (``linear:factor=s`` for geometric
   frequencies over s); what no value expresses (an amplitude without YaRN's frequencies,
   dynamic frequencies) is said in the notes.

Error model (every threshold below comes from it; ``ropecheck.tolerance`` derives it).
With u the unit roundoff of the compute dtype (the probe dtype, never finer than float32),
K = K_OPS = 6 and a the largest amplitude seen:

- an entry of M_m is a single rotated coordinate of a unit vector: |error| <= e = K u a +
  floor (floor: the subnormal spacing term);
- a column norm is off by at most nb = sqrt(2) K u a + floor (``ErrorModel.norm_bound``),
  so two norms differ by at most 2 nb and an inner product of two columns by 2 a nb + nb^2;
- f(v) - M_m v, for v exactly representable: f(v)'s own error K u a |v|_2 plus the
  entries' errors summed, (K u a + floor) |v|_1;
- f(0, m) must be exactly zero up to floor (0 times anything is 0);
- a pair's angle read from its block is off by at most sqrt(2) e / a from the angle the
  target used, which is off from m * theta_exact by the float32 allowance
  dphi(m) = 2^-24 |m| theta (2 ln(1/theta) + 6) (``ErrorModel.angle_error``); so an
  unwrapped estimate theta = Phi(m) / m has |theta - theta_exact| <= (dphi(m) +
  sqrt(2) e / a) / m, and the nearest 2 pi branch is provably right while that bound plus
  the prediction error stays below pi/2;
- the fit: with |ln theta_k - ln theta_exact,k| <= sigma_k (the relative bound above), a
  weighted least-squares line with hat matrix H has residuals at most
  sigma_k + sum_j |H_kj| sigma_j; larger residuals mean the frequencies are not geometric
  (per-frequency scaling). The same coefficients bound the error of ln(base) and ln(s).

Every test yields a *ratio*, the largest deviation over its bound (<= 1: what a correct
float32-angle kernel may do). The confidence is ``high`` when every ratio is <= 1 and the
base and scale are pinned to better than 1e-3 relative (so the printed digits are
significant) and the frequencies are geometric or a named scaling is verified, ``medium``
when the ratios are <= 1 but the parameters are coarser (low precision probe dtype, two or
fewer frequencies) or the frequencies are neither.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ropecheck.calling.caller import DEFAULT_TIMEOUT, Caller
from ropecheck.identification.fitting import Measured
from ropecheck.identification.frequencies import confidence, fit_frequencies, measure_more, orient
from ropecheck.identification.inference import (
    Bounds,
    check_identity_at_zero,
    check_linear,
    check_norms,
    pair_blocks,
    record,
    structure,
    unwrap,
)
from ropecheck.identification.probe import Probe, choose_probe, linearity_vectors, probe_at, probe_large
from ropecheck.identification.result import (
    DEFAULT_MAX_POSITION,
    SMALL_POSITIONS,
    Identification,
    NotRotary,
    UnusableTarget,
)
from ropecheck.properties.core.contract import CallError, TargetHung
from ropecheck.properties.tolerance import ErrorModel
from ropecheck.session.loading import TargetLoadError, load
from ropecheck.targets.target import Target


def identify(
    target: Target, timeout: Optional[float] = DEFAULT_TIMEOUT, max_position: int = DEFAULT_MAX_POSITION
) -> Identification:
    """Probe ``target`` and infer its convention. Raises UnusableTarget when it cannot be
    called; a map that is not a rotary embedding gives ``rotary=False`` with reasons. No
    probe uses a position above ``max_position`` (nor above the target's declared
    ``max_position``)."""
    if max_position < 1:
        raise ValueError(f"max_position must be >= 1, got {max_position}")
    limit = min(max_position, target.max_position) if target.max_position is not None else max_position
    limit = max(limit, 1)
    ident = Identification(target=target.name)
    caller = target.caller(timeout)
    small_positions = tuple(p for p in SMALL_POSITIONS if p <= limit)
    try:
        ident.dtype, ident.head_dim = choose_probe(caller, target)
        small = probe_at(caller, ident.dtype, ident.head_dim, small_positions, linearity_vectors(ident.head_dim))
    except NotRotary as exc:
        ident.reasons.append(str(exc))
        return ident
    except CallError as exc:
        ident.reasons.append(f"the call contract is broken at positions up to {small_positions[-1]}: {exc}")
        return ident
    except TargetHung as exc:
        raise UnusableTarget(str(exc)) from None
    try:
        infer(ident, small, caller, limit)
        ident.rotary = True
    except NotRotary as exc:
        ident.reasons.append(str(exc))
    ident.confidence = confidence(ident)
    return ident


def span(probe: Probe) -> str:
    return f" (m <= 2^{int(probe.positions.max()).bit_length() - 1})"


def infer(ident: Identification, small: Probe, caller: Caller, limit: int):
    amplitude = float(np.linalg.norm(small.matrices, axis=1).max())
    bounds = Bounds(ident.dtype, amplitude)
    check_linear(ident, small, bounds)
    check_norms(ident, small.matrices, small.positions, bounds, span(small))
    check_identity_at_zero(ident, small.matrices[0], bounds)
    large = probe_large(caller, ident.dtype, ident.head_dim, ident.notes, limit, int(small.positions.max()))
    if large is not None:
        check_norms(ident, large.matrices, large.positions, bounds, span(large))
    pairs, single = structure(ident, small, large, bounds)

    # the pairs' blocks, amplitude and angles in each call
    measured = []
    for probe in (small, large) if large is not None else (small,):
        c, s, residual = pair_blocks(probe.matrices, pairs)
        k = int(residual.max(axis=0).argmax())
        where = span(probe)
        record(
            ident,
            f"2x2 rotation{where}",
            residual.max(),
            bounds.entry,
            f"blocks are a R(phi) to {residual.max():.3g}",
            f"not a rotation: the block of features {pairs[k]} is not a scaled 2x2 rotation "
            f"(off by {residual.max():.3g}; a reflection or a shear?)",
        )
        amp = np.hypot(c, s)
        record(
            ident,
            f"amplitude{where}",
            np.abs(amp - amp.mean()).max(),
            2 * bounds.norm,
            f"pair amplitudes {amp.min():.6g} .. {amp.max():.6g}",
            f"not a RoPE: the pairs are scaled differently ({amp.min():.6g} .. {amp.max():.6g})",
        )
        theta, error, ratios, _, used = unwrap(probe.positions, c, s, bounds)
        p, k = np.unravel_index(ratios.argmax(), ratios.shape)
        record(
            ident,
            f"angles linear in m{where}",
            ratios.max(),
            1.0,
            f"phi(m) = m theta to {ratios.max():.2g} of the angle bound",
            f"not a RoPE: the angle of features {pairs[k]} is not proportional to the position "
            f"at m = {probe.positions[p]} ({ratios.max():.3g} times the float32 angle bound; "
            f"a cos/sin cache that wraps or clamps?)",
        )
        measured.append((theta, error, int(probe.positions.max()), used))
        ident.amplitude = float(amp.mean())

    ident.scaled_amplitude = abs(ident.amplitude - 1.0) > 2 * bounds.norm
    # the measured amplitude (a mean of hypot(c, s)) is off by at most a norm bound, with one
    # more rounding for an attention factor that multiplies cos and sin
    amplitude_error = float(ErrorModel(ident.dtype, extra_ops=1).norm_bound(bounds.a))
    if ident.scaled_amplitude:
        implied = math.exp((ident.amplitude - 1.0) / 0.1)
        ident.notes.append(
            f"amplitude: rotated pairs are scaled by {ident.amplitude:.6g} (a YaRN "
            f"attention factor 0.1 ln(s) + 1 would mean s = {implied:.4g})"
        )
    passed = np.array([small.matrices[0, j, j] for j in single])
    if len(single) and np.abs(passed - 1.0).max() > bounds.entry:
        ident.notes.append(f"pass-through scaled: pass-through features are multiplied by {passed.mean():.6g}")

    theta, error, top, used = measured[0]
    if len(measured) == 2:
        t2, e2, top2, used2 = measured[1]
        if (np.abs(theta - t2) > error + e2).any():
            ident.dynamic = True
        else:
            theta, error, top, used = t2, e2, top2, used2
    ident.max_position = top

    # direction and pairing, then the frequencies
    keys = orient(ident, pairs, theta, error, single, measured)
    by_pair = dict(zip(pairs, used))
    positions = (large if large is not None and not ident.dynamic else small).positions
    fit_frequencies(
        ident,
        keys,
        measured,
        Measured(
            np.array(ident.theta),
            np.array(ident.theta_error),
            np.array([by_pair[k] for k in keys]),
            math.sqrt(2.0) * bounds.entry / bounds.a,
            ident.amplitude,
            amplitude_error,
        ),
        lambda: measure_more(ident, caller, tuple(int(p) for p in positions)),
    )


def identify_spec(
    spec: str,
    timeout: Optional[float] = DEFAULT_TIMEOUT,
    max_position: int = DEFAULT_MAX_POSITION,
    in_process: bool = False,
) -> Identification:
    """Load ``spec`` (file.py:func, module:attr or a built-in name) and identify it, its
    calls running in a worker process unless ``in_process``."""
    try:
        target = load(spec, worker=not in_process)
    except TargetLoadError as exc:
        raise UnusableTarget(str(exc)) from None
    try:
        return identify(target, timeout, max_position)
    finally:
        target.close()
