"""The fitting toolkit of ``ropecheck identify``: numbers written as simply as their error
allows, weighted least squares under the error model's bounds, the measured frequencies
and their segments (unscaled leading pairs, scaled trailing ones), and candidates
verified against every measurement."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ropecheck.properties.tolerance import U32, ErrorModel
from ropecheck.reference.scaling import Llama3, Scaling, YaRN, parse

FAMILY_OPS = max(Llama3.theta_ops, YaRN.theta_ops)
MAX_TRIED = 40  # candidates verified per family before giving up (ordered simplest first)
DEFAULT_BETA_FAST, DEFAULT_BETA_SLOW = 32.0, 1.0


# --- numbers -------------------------------------------------------------------------------


def number(value) -> str:
    """A number as a ``--scaling`` value: integers plainly, floats as their shortest exact form."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    value = float(value)
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def digits(value: float) -> int:
    """Significant digits of the shortest decimal that is exactly ``value``."""
    for d in range(1, 18):
        if float(f"{value:.{d - 1}e}") == value:
            return d
    return 17


def simplest(low: float, high: float) -> Optional[float]:
    """The number in [low, high] with the fewest significant digits (the one nearest the
    geometric middle among equals); None when the interval is empty or not positive."""
    if not (0 < low <= high and math.isfinite(high)):
        return None
    middle = math.sqrt(low * high)
    for d in range(1, 18):
        step = 10.0 ** (math.floor(math.log10(high)) - d + 1)
        first, last = math.ceil(low / step), math.floor(high / step)
        if first <= last:
            k = min(max(round(middle / step), first), last)
            value = float(f"{k * step:.{d}g}")
            if low <= value <= high:
                return value
    return None


def simplest_integer(low: float, high: float) -> Optional[int]:
    """An integer in [low, high]: the power of two nearest the geometric middle when there is
    one (context lengths usually are), else the one with the fewest significant digits."""
    low, high = max(low, 1.0), high
    if not low <= high:
        return None
    middle = math.sqrt(low * high)
    powers = [2**k for k in range(math.ceil(math.log2(low)), math.floor(math.log2(high)) + 1)]
    if powers:
        return min(powers, key=lambda p: abs(math.log(p / middle)))
    for d in range(1, 18):
        step = max(10.0 ** (math.floor(math.log10(high)) - d + 1), 1.0)
        first, last = math.ceil(low / step), math.floor(high / step)
        if first <= last:
            return int(min(max(round(middle / step), first), last) * step)
    return None


def length_digits(length: int) -> int:
    """How simple a context length reads: a power of two counts as one digit."""
    return 1 if length & (length - 1) == 0 else digits(float(length))


def base_candidates(ln_base: float, d_ln_base: float) -> list[float]:
    """The base with the fewest digits inside its uncertainty, then with one more digit at a
    time up to the fitted value: the roundest one that verifies is printed."""
    fitted = math.exp(ln_base)
    first = simplest(fitted * math.exp(-d_ln_base), fitted * math.exp(d_ln_base)) or fitted
    more = [float(f"{fitted:.{d - 1}e}") for d in range(digits(first) + 1, 18)]
    return list(dict.fromkeys([first] + more + [fitted]))


# --- least squares with the error model's bounds ---------------------------------------------


def wls(design: np.ndarray, y: np.ndarray, sigma: np.ndarray):
    """Weighted least squares y ~ design @ beta with |y_k - exact_k| <= sigma_k. Returns
    (beta, bound on |beta - exact|, worst residual over its bound, per-point ratios); the
    bounds are worst cases: residual (I - H) err, |.| <= sigma + |H| sigma; beta error C err."""
    weight = 1.0 / sigma**2
    weighted = design * weight[:, None]
    coef = np.linalg.solve(design.T @ weighted, weighted.T)
    beta = coef @ y
    allowed = sigma + np.abs(design @ coef) @ sigma
    per = np.abs(y - design @ beta) / allowed
    return beta, np.abs(coef) @ sigma, float(per.max(initial=0.0)), per


# --- the measurements ---------------------------------------------------------------------


@dataclass
class Measured:
    """What identify measured, in frequency order (highest first)."""

    theta: np.ndarray
    error: np.ndarray  # bound on |theta - theta_exact| (float32 angle allowance + read error)
    used: np.ndarray  # the position each theta was read at
    read: float  # angle read error bound sqrt(2) e / a (radians)
    amplitude: float
    amplitude_error: float

    @property
    def n(self) -> int:
        return len(self.theta)

    @property
    def rotary_dim(self) -> int:
        return 2 * self.n

    @property
    def x(self) -> np.ndarray:
        return 2.0 * np.arange(self.n) / self.rotary_dim

    def sigma(self) -> np.ndarray:
        """Bound on |ln theta_k - ln theta_exact,k| under any family fitted here."""
        return np.log1p((self.error + U32 * FAMILY_OPS * self.theta) / self.theta)

    def allowed(self, reference: np.ndarray, base: float, theta_ops: int, gain=1.0) -> np.ndarray:
        """|theta_k - reference_k| a target computing ``reference`` in float32 may show."""
        per_unit_m = ErrorModel.angle_error(1.0, reference, self.x * math.log(base), theta_ops, gain)
        return per_unit_m + self.read / self.used


@dataclass
class Segments:
    """The geometric head (unscaled) and tail (divided by s) of the spectrum."""

    head: int
    tail: int
    ln_base: float
    d_ln_base: float
    ln_scale: float
    d_ln_scale: float
    ratio: float

    @property
    def pairs(self) -> int:
        """Pairs that pin the base: a one-pair tail fits exactly with its own intercept."""
        return self.head + (self.tail if self.tail > 1 else 0)


@dataclass
class Candidate:
    flag: str
    family: str
    how: str  # how the parameters were fitted
    base: Optional[float] = None  # the base it was verified with
    ratio: float = math.inf  # worst |theta - ref| / allowed over every measurement
    amplitude_ratio: float = math.inf
    theta: list = field(default_factory=list)  # the candidate's float64 inv_freq (first measurement)

    @property
    def verified(self) -> bool:
        return self.ratio <= 1.0 and self.amplitude_ratio <= 1.0


def verify(candidate: Candidate, measurements: list[Measured], base: float) -> Candidate:
    """Build the candidate with reference.scaling.parse and compare it with every measurement
    (one per rotary dim probed)."""
    scaling: Scaling = parse(candidate.flag)
    candidate.base, candidate.ratio, candidate.amplitude_ratio = base, 0.0, 0.0
    for k, measured in enumerate(measurements):
        reference = scaling.inv_freq(measured.rotary_dim, base)
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = scaling.theta_gain(measured.rotary_dim, base)
            ratios = np.abs(measured.theta - reference) / measured.allowed(reference, base, scaling.theta_ops, gain)
        candidate.ratio = max(candidate.ratio, float(np.nan_to_num(ratios, nan=math.inf).max()))
        candidate.amplitude_ratio = max(
            candidate.amplitude_ratio, abs(measured.amplitude - scaling.attention_factor()) / measured.amplitude_error
        )
        if k == 0:
            candidate.theta = [float(t) for t in reference]
    return candidate


def first_verified(candidates, measurements, base) -> tuple[Optional[Candidate], Optional[Candidate]]:
    """(the first verified candidate, the closest one tried), simplest first."""
    best = None
    for candidate in candidates[:MAX_TRIED]:
        verify(candidate, measurements, base)
        if candidate.verified:
            return candidate, candidate
        if best is None or max(candidate.ratio, candidate.amplitude_ratio) < max(best.ratio, best.amplitude_ratio):
            best = candidate
    return None, best


# --- step 1: segments ---------------------------------------------------------------------


def _segment_fit(measured: Measured, head: int, tail: int):
    n = measured.n
    index = np.r_[0:head, n - tail : n]
    x, y, sigma = measured.x[index], np.log(measured.theta[index]), measured.sigma()[index]
    columns = [-x] + ([-(np.arange(len(index)) >= head).astype(np.float64)] if tail else [])
    beta, d_beta, ratio, _ = wls(np.stack(columns, axis=1), y, sigma)
    return beta, d_beta, ratio


def fit_segments(measured: Measured) -> Optional[Segments]:
    """The longest unscaled head plus scaled tail that are geometric with one base (step 1);
    None when the leading pair is not at theta_0 = 1 or no segment leaves a test."""
    n, sigma = measured.n, measured.sigma()
    if n < 3 or abs(math.log(measured.theta[0])) > sigma[0]:
        return None

    def informative(head, tail):  # points beyond theta_0 minus parameters >= 1
        return (head - 1) + tail >= 1 + (1 if tail else 0) + 1

    def segments(head, tail):
        beta, d_beta, ratio = _segment_fit(measured, head, tail)
        if ratio > 1.0 or beta[0] <= 0:
            return None
        return Segments(
            head,
            tail,
            float(beta[0]),
            float(d_beta[0]),
            float(beta[1]) if tail else 0.0,
            float(d_beta[1]) if tail else 0.0,
            ratio,
        )

    heads = [h for h in range(n, 0, -1) if h <= 2 or _segment_fit(measured, h, 0)[2] <= 1.0]
    best = None
    for head in heads:
        for tail in (t for t in range(n - head, -1, -1) if t != 1):  # one pair tests nothing
            if best is not None and head + tail <= best.pairs:
                break
            found = segments(head, tail) if informative(head, tail) else None
            if found is not None:
                best = found
                break
    if best is not None and best.tail == 0 and best.head < n:
        # a plateau of one pair still gives the factor (the candidates' verification tests it)
        best = segments(best.head, 1) or best
    return best
