"""Naming the position scaling of a map that ``ropecheck identify`` measured: the base from
the geometric parts of the spectrum, each published family's parameters fitted to the rest,
and every candidate verified against the measurements before it is suggested.

Input: the measured frequencies theta_k, k = 0 .. n-1 (highest first, r = 2n), with bounds
e_k on |theta_k - theta_exact,k| (``ropecheck.identification``'s module docstring: the read error
sqrt(2) e / a over the position m_k the pair was unwrapped at, plus the float32 angle
allowance), and the amplitude A with its bound. A scaling that spends ``theta_ops`` more
float32 operations on theta (``reference.scaling``) moves theta by U32 theta_ops theta more:
the allowance ``ropecheck check`` gives it (``ropecheck.tolerance``). So, with
sigma_k = ln(1 + (e_k + U32 OPS theta_k) / theta_k) the bound on ln theta_k (OPS the largest
theta_ops of the families fitted here):

1. Segments. Llama 3 and YaRN leave the leading (high-frequency) pairs untouched and divide
   the trailing ones by the factor s: ln theta_k = -x_k ln b on a head k < n0 (so theta_0 = 1)
   and -x_k ln b - ln s on a tail k >= n - n1, x_k = 2k/r. A weighted least-squares fit of
   (ln b, ln s) over head and tail, accepted when every residual is within
   sigma_k + sum_j |H_kj| sigma_j (H the hat matrix: the residual of exact data plus errors
   bounded by sigma), picks the longest head + tail; the coefficient bounds sum_j |C_ij| sigma_j
   (C the solution operator) are the uncertainties of ln b and ln s. This gives the base of
   every map whose leading pairs are geometric and unscaled, named or not.
2. The band between head and tail, as the kept fraction rho_k = theta_k / b^(-x_k):
   - Llama 3: rho = 1/s + (1 - 1/s) (w - w_lo) / (w_hi - w_lo) with w = 1/wavelength =
     b^(-x)/(2 pi), w_lo = low_freq_factor / L0, w_hi = high_freq_factor / L0 (L0 the original
     context): a line in w (fitted and tested like step 1) whose crossings of 1/s and 1 are
     the band edges. Only w_lo and w_hi are measurable: every (low, high, L0) with these
     ratios is the same map. The one chosen has the fewest significant digits in low, high
     and L0 (a power of two counts as one) inside the edges' uncertainty, then low >= 1, then
     the smallest L0.
   - YaRN: rho = 1 - ramp (1 - 1/s), ramp = clip((k - low) / (high - low), 0, 1): a line in k.
     Truncated (the default), low = max(floor(d(beta_fast)), 0) and high =
     min(ceil(d(beta_slow)), r - 1) are integers, d(beta) = r D(beta) / (2 ln b) with
     D(beta) = ln(L0 / (2 pi beta)): at each rotary dim measured, every integer (low, high)
     whose ramp reproduces the frequencies is found (exhaustively), and each confines
     D(beta_fast) and D(beta_slow) to intervals of width 2 ln b / r. Their intersection over
     the rotary dims measured is all that is known: only L0 / beta_fast and L0 / beta_slow
     matter, and only to these ranges, so the values chosen reproduce the measured rotary dims
     (``ropecheck identify`` measures the head dims ``ropecheck check`` draws, and 256). The
     defaults beta_fast = 32, beta_slow = 1 are kept when one integer L0 satisfies both (a
     power of two when there is one), else beta_slow, then beta_fast, is chosen with the
     fewest digits. Not truncated: the line's crossings of 0 and 1 (fitted when the band has
     two pairs or more) with their uncertainty.
   - YaRN's attention factor: the default 0.1 ln s + 1 when the amplitude agrees with it
     within the amplitude bound, else the measured amplitude with the fewest digits inside
     its bound, as ``attention_factor``.
   - linear (geometric frequencies over s): ``linear:factor=s``.
3. Verification. Each candidate ``--scaling`` value is built with ``reference.scaling.parse``
   and its float64 inv_freq compared with the measured theta at every rotary dim measured
   (the fit uses the one with the most pairs): |theta_k - ref_k| must be at
   most the read error plus the float32 angle allowance of the candidate itself (what
   ``ropecheck check`` allows it: U32 ref_k (2 x_k ln b + 6 + theta_ops) per unit of m_k),
   and its attention factor must agree with the amplitude within the amplitude bound. Only
   verified candidates are suggested; the others are reported in words, with the worst ratio.
   A base that does not verify with its fewest digits is tried with more, up to the fitted
   value.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ropecheck.identification.fitting import (
    DEFAULT_BETA_FAST,
    DEFAULT_BETA_SLOW,
    MAX_TRIED,
    Candidate,
    Measured,
    Segments,
    digits,
    first_verified,
    fit_segments,
    length_digits,
    number,
    simplest,
    simplest_integer,
    verify,
    wls,
)
from ropecheck.reference.scaling import YaRN, yarn_mscale

# --- step 2: the families -----------------------------------------------------------------


def _band(measured: Measured, seg: Segments, base: float):
    """Indices of the band, its kept fraction rho and the bound on rho's error."""
    band = np.arange(seg.head, measured.n - seg.tail)
    geometric = base ** (-measured.x[band])
    rho = measured.theta[band] / geometric
    relative = measured.sigma()[band] + measured.x[band] * (seg.d_ln_base + abs(math.log(base) - seg.ln_base))
    return band, geometric, rho, rho * np.expm1(relative)


def _scale(seg: Segments) -> list[float]:
    s = math.exp(seg.ln_scale)
    rounded = simplest(s * math.exp(-seg.d_ln_scale), s * math.exp(seg.d_ln_scale))
    return [v for v in dict.fromkeys([rounded, s]) if v is not None and v > 1.0]


def llama3_candidates(
    measured: Measured, seg: Segments, base: float, measurements: list, notes: list
) -> list[Candidate]:
    """Llama 3 from the band of ``measured`` (the measurement with the most pairs)."""
    band, geometric, rho, d_rho = _band(measured, seg, base)
    if seg.tail == 0:
        notes.append("llama3: no plateau of pairs divided by the factor: the factor is not measured")
        return []
    if seg.tail == 1:
        notes.append("llama3: only the last pair is divided by the factor: the factor rests on it alone")
    if len(band) < 2:
        notes.append(
            f"llama3: {len(band)} pair(s) between the unscaled and the scaled pairs: the "
            f"band edges (original context / low and high freq factor) are not pinned"
        )
        return []
    w = geometric / (2 * math.pi)
    (slope, intercept), (d_slope, d_intercept), ratio, _ = wls(np.stack([w, np.ones_like(w)], 1), rho, d_rho)
    if ratio > 1.0 or slope <= 0:
        notes.append(f"llama3: the band's kept fraction is not linear in 1/wavelength ({ratio:.3g} times the bound)")
        return []
    out = []
    for s in _scale(seg):
        inv_s, d_inv_s = 1.0 / s, seg.d_ln_scale / s
        w_lo, w_hi = (inv_s - intercept) / slope, (1.0 - intercept) / slope
        dw_lo = (d_intercept + d_inv_s + abs(w_lo) * d_slope) / slope
        dw_hi = (d_intercept + abs(w_hi) * d_slope) / slope
        if not 0 < w_lo < w_hi:
            continue
        found = {}
        for mantissa in range(1, 100):
            for exponent in range(-3, 4):
                low = float(f"{mantissa * 10.0**exponent:.2g}")
                original = round(low / w_lo)
                if original < 1 or abs(low / original - w_lo) > dw_lo:
                    continue
                high = simplest(original * (w_hi - dw_hi), original * (w_hi + dw_hi))
                if high is None or high <= low:
                    continue
                key = (digits(low) + digits(high) + length_digits(original), low < 1, original, low)
                found[key] = (low, high, original)
        ranked = [found[k] for k in sorted(found)][: MAX_TRIED // 4]
        original = max(1, round(1.0 / w_lo))  # unrounded edges: always expressible
        ranked.append((original * w_lo, original * w_hi, original))
        how = (
            f"band of {len(band)} pairs: edges at wavelengths {1 / w_lo:.6g} (+-{dw_lo / w_lo:.1e}) and "
            f"{1 / w_hi:.6g} (+-{dw_hi / w_hi:.1e}); factor from {seg.tail} plateau pairs"
        )
        for low, high, original in ranked:
            out.append(
                Candidate(
                    f"llama3:factor={number(s)},low_freq_factor={number(low)},"
                    f"high_freq_factor={number(high)},"
                    f"original_max_position_embeddings={original}",
                    "llama3",
                    how,
                )
            )
    return out


def _yarn_attention(measured: Measured, s: float) -> list[str]:
    """'' (YaRN's default 0.1 ln s + 1 agrees) or ',attention_factor=A'."""
    amp, d_amp = measured.amplitude, measured.amplitude_error
    out = []
    if abs(amp - yarn_mscale(s)) <= d_amp:
        out.append("")
    rounded = simplest(amp - d_amp, amp + d_amp)
    out += [f",attention_factor={number(v)}" for v in dict.fromkeys([rounded, amp]) if v is not None]
    return out


LN_LENGTH = (0.0, 40 * math.log(2))  # ln L0 searched in [1, 2^40]
LN_BETA = (math.log(1e-6), math.log(1e6))


def yarn_ends(measured: Measured, base: float, s: float) -> list[tuple[int, int]]:
    """Every integer (low, high), 0 <= low < high <= r - 1, whose truncated YaRN ramp
    reproduces the measured frequencies at this rotary dim (factor s, base b)."""
    n, r = measured.n, measured.rotary_dim
    geometric = base ** (-measured.x)
    k = np.arange(n, dtype=np.float64)
    highs = np.arange(1, r, dtype=np.float64)[:, None]
    out = []
    for low in range(n):
        span = highs[low:] - low
        ramp = np.clip((k - low) / span, 0.0, 1.0)
        reference = geometric / s * ramp + geometric * (1.0 - ramp)
        allowed = measured.allowed(reference, base, YaRN.theta_ops)
        ok = (np.abs(measured.theta - reference) <= allowed).all(axis=1)
        out += [(low, int(h)) for h in highs[low:, 0][ok]]
    return out


def _intersect(a: list, b: list) -> list:
    return [(max(x0, y0), min(x1, y1)) for x0, x1 in a for y0, y1 in b if max(x0, y0) < min(x1, y1)]


def _ramp_ranges(measurements: list, base: float, s: float, notes: list):
    """The ranges of D(beta) = ln(L0 / (2 pi beta)) for beta_fast and beta_slow that give the
    integer ramp ends found at every measured rotary dim (unions of intervals), or None."""
    fast, slow = [(-math.inf, math.inf)], [(-math.inf, math.inf)]
    for measured in measurements:
        r = measured.rotary_dim
        ends = yarn_ends(measured, base, s)
        if not ends:
            notes.append(f"yarn: no truncated ramp with factor {s:g} reproduces the frequencies at rotary dim {r}")
            return None
        c = 2 * math.log(base) / r
        lows, highs = sorted({lo for lo, _ in ends}), sorted({hi for _, hi in ends})
        fast = _intersect(fast, [(-math.inf if lo == 0 else c * lo, c * (lo + 1)) for lo in lows])
        slow = _intersect(slow, [(c * (hi - 1), math.inf if hi >= r - 1 else c * hi) for hi in highs])
    if not fast or not slow:
        notes.append("yarn: the ramp ends found at the measured rotary dims are inconsistent")
        return None
    return fast, slow


def _inside(intervals: list, shift: float, bounds: tuple) -> list:
    """exp of each (interval + shift) clipped to ``bounds`` (ln), shrunk off its open ends."""
    out = []
    for lo, hi in intervals:
        lo, hi = max(lo + shift, bounds[0]), min(hi + shift, bounds[1])
        if lo < hi:
            margin = 1e-9 * max(1.0, abs(lo), abs(hi))
            out.append((math.exp(lo + margin), math.exp(hi - margin)))
    return out


def _simplest_length(intervals: list) -> Optional[int]:
    found = [v for lo, hi in intervals if (v := simplest_integer(lo, hi)) is not None]
    return min(found, key=lambda v: (length_digits(v), v)) if found else None


def _simplest_beta(length: int, intervals: list) -> Optional[float]:
    """beta with ln(L0 / (2 pi beta)) inside one of ``intervals``."""
    ln_scale = math.log(length / (2 * math.pi))
    flipped = [(ln_scale - hi, ln_scale - lo) for lo, hi in intervals]
    found = [v for lo, hi in _inside(flipped, 0.0, LN_BETA) if (v := simplest(lo, hi)) is not None]
    return min(found, key=lambda v: (digits(v), abs(math.log(v)))) if found else None


def _yarn_contexts(fast: list, slow: list) -> list[tuple[int, float, float]]:
    """(L0, beta_fast, beta_slow) inside the ranges, simplest first (module docstring)."""
    ln_fast, ln_slow = math.log(2 * math.pi * DEFAULT_BETA_FAST), math.log(2 * math.pi * DEFAULT_BETA_SLOW)
    out = []
    both = _intersect(
        [(lo + ln_fast, hi + ln_fast) for lo, hi in fast], [(lo + ln_slow, hi + ln_slow) for lo, hi in slow]
    )
    length = _simplest_length(_inside(both, 0.0, LN_LENGTH))
    if length is not None:
        out.append((length, DEFAULT_BETA_FAST, DEFAULT_BETA_SLOW))
    length = _simplest_length(_inside(fast, ln_fast, LN_LENGTH))
    if length is not None and (beta := _simplest_beta(length, slow)) is not None:
        out.append((length, DEFAULT_BETA_FAST, beta))
    length = _simplest_length(_inside(slow, ln_slow, LN_LENGTH))
    if length is not None and (beta := _simplest_beta(length, fast)) is not None:
        out.append((length, beta, DEFAULT_BETA_SLOW))
    for k in range(8, 25):
        bf, bs = _simplest_beta(2**k, fast), _simplest_beta(2**k, slow)
        if bf is not None and bs is not None:
            out.append((2**k, bf, bs))
            break
    return out


def yarn_candidates(measured: Measured, seg: Segments, base: float, measurements: list, notes: list) -> list[Candidate]:
    """YaRN from the band of ``measured`` (the measurement with the most pairs); the
    truncated ramp's ends from every measurement."""
    r = measured.rotary_dim
    if seg.tail == 0:
        notes.append("yarn: no plateau of pairs divided by the factor: the factor is not measured")
        return []
    if seg.tail == 1:
        notes.append("yarn: only the last pair is divided by the factor: the factor rests on it alone")
    band, _, rho, d_rho = _band(measured, seg, base)
    dims = ", ".join(str(m.rotary_dim) for m in measurements)
    out = []
    for s in _scale(seg):
        attention = _yarn_attention(measured, s)
        contexts = []
        ranges = _ramp_ranges(measurements, base, s, notes)
        if ranges is not None:
            how = (
                f"ramp ends found at rotary dims {dims} (integers: the last unscaled and the "
                f"first fully scaled pair); factor from {seg.tail} plateau pairs"
            )
            contexts += [(c, True, how) for c in _yarn_contexts(*ranges)]
        if len(band) >= 2:
            ramp, d_ramp = (1 - rho) / (1 - 1 / s), d_rho / (1 - 1 / s)
            (slope, intercept), (d_slope, d_intercept), ratio, _ = wls(
                np.stack([band.astype(np.float64), np.ones(len(band))], 1), ramp, d_ramp
            )
            if ratio <= 1.0 and slope > 0:
                low, high = -intercept / slope, (1 - intercept) / slope
                d_low = (d_intercept + abs(low) * d_slope) / slope
                d_high = (d_intercept + abs(high) * d_slope) / slope
                how = (
                    f"ramp from pair {low:.6g} (+-{d_low:.1e}) to {high:.6g} (+-{d_high:.1e}) at "
                    f"rotary dim {r}, not truncated; factor from {seg.tail} plateau pairs"
                )
                contexts += [(c, False, how) for c in _yarn_context_real(low, d_low, high, d_high, base, r)]
            else:
                notes.append(
                    f"yarn: the band's kept fraction is not linear in the pair index ({ratio:.3g} times the bound)"
                )
        for (original, bf, bs), truncate, how in contexts:
            words = [f"factor={number(s)}", f"original_max_position_embeddings={original}"]
            if bf != DEFAULT_BETA_FAST:
                words.append(f"beta_fast={number(bf)}")
            if bs != DEFAULT_BETA_SLOW:
                words.append(f"beta_slow={number(bs)}")
            if not truncate:
                words.append("truncate=false")
            for extra in attention:
                out.append(Candidate("yarn:" + ",".join(words) + extra, "yarn", how))
    return out


def _yarn_context_real(low, d_low, high, d_high, base, r):
    """(L0, beta_fast, beta_slow) for real (not truncated) ramp ends: d(beta_fast) = low and
    d(beta_slow) = high within their uncertainty; L0 a power of two, the betas simplest."""
    c = 2 * math.log(base) / r
    found = []
    for k in range(4, 31):
        original = 2**k
        scale = original / (2 * math.pi)
        bf = simplest(scale * math.exp(-c * (low + d_low)), scale * math.exp(-c * (low - d_low)))
        bs = simplest(scale * math.exp(-c * (high + d_high)), scale * math.exp(-c * (high - d_high)))
        if bf is not None and bs is not None and low > 0 and high < r - 1:
            found.append((digits(bf) + digits(bs), original, bf, bs))
    return [(o, bf, bs) for _, o, bf, bs in sorted(found)][: MAX_TRIED // 2]


FAMILIES = (("llama3", llama3_candidates), ("yarn", yarn_candidates))


def best_segments(measurements: list[Measured]) -> tuple[Optional[Measured], Optional[Segments]]:
    """The measurement with the most pairs whose head (and tail) are geometric, and its segments."""
    fitted = [(m, seg) for m in measurements if (seg := fit_segments(m)) is not None]
    return max(fitted, key=lambda ms: ms[0].n) if fitted else (None, None)


def match(measured: Measured, seg: Segments, measurements: list[Measured], bases: list[float]):
    """Fit every family on ``measured`` (with its segments ``seg``), verify on all
    ``measurements`` (one per rotary dim probed). Returns (verified candidates, simplest first
    per family, with the first of ``bases`` that verifies as their ``base``; notes in words on
    the families when none verifies)."""
    verified, notes = [], []
    for family, make in FAMILIES:
        family_notes: list[str] = []
        found = closest = None
        for k, base in enumerate(bases):
            candidates = make(measured, seg, base, measurements, family_notes if k == 0 else [])
            found, near = first_verified(candidates, measurements, base)
            closest = closest or near
            if found is not None:
                break
        if found is not None:
            verified.append(found)
            continue
        if closest is not None:
            family_notes.append(
                f"{family}: the closest fit ({closest.flag}) misses the measured "
                f"frequencies by {closest.ratio:.3g} and the amplitude by "
                f"{closest.amplitude_ratio:.3g} times their bounds: not suggested"
            )
        notes += [note for note in dict.fromkeys(family_notes)]
    return verified, ([] if verified else notes)


def linear_candidate(measured: Measured, base: float, scale: float) -> Candidate:
    return verify(
        Candidate(f"linear:factor={number(scale)}", "linear", "geometric frequencies divided by the factor", base),
        [measured],
        base,
    )
