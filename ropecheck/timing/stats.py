"""Distribution-free statistics of timing samples: a median and its interval, the shift
between two runs, and the gate a CI job fails on.

Timing samples are not normal: they have a floor (the kernel cannot run faster than the
hardware allows) and a long right tail (interrupts, clock steps, another process). So
nothing here assumes a distribution. The statistics are of ranks and order statistics,
whose coverage holds for any continuous distribution of independent samples:

- ``median_interval``: the interval between two order statistics of the samples that holds
  the median with probability at least ``confidence`` (the number of samples below the
  median is Binomial(n, 1/2)).
- ``shift``: how much slower ``current`` is than ``baseline``, both given as positive values
  per block (in use, each block's median kernel time over the same block's median copy time:
  the copy ran interleaved with the kernel, so the ratio cancels the clock and thermal drift
  both saw). On logs, so that a change is relative: the one-sided Mann-Whitney U tests say
  whether current is slower (or faster) at all, the Hodges-Lehmann estimate (the median of
  every pairwise difference log current_i - log baseline_j) says by how much, and the Moses
  interval (two order statistics of those differences, placed by the null distribution of
  U) bounds it. Reported back as relative changes, exp(.) - 1: +0.2 is 20 % slower.
- ``gate``: "slower" (the CI job fails) only when a slowdown is both significant and larger
  than the threshold; noise alone fails a job with probability at most ``alpha``.
- ``drift``: the copy's block medians getting slower over a run (a throttling clock).

Blocks, not single samples, are the unit of the comparison: consecutive samples are not
independent (they share a clock frequency, a cache state, a neighbour's load), a block's
median is much less so, and the ratio to the copy in the same block removes what the two
share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np
from scipy import stats as sps

MIN_BLOCKS = 3  # blocks on each side below which the gate does not decide
EXACT_LIMIT = 8  # the exact null distribution of U when the smaller sample has at most this many (as scipy's "auto")

Values = Sequence[float] | np.ndarray


def _values(samples: Values, what: str = "samples") -> np.ndarray:
    x = np.asarray(samples, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError(f"no {what}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what} are not all finite: {x[~np.isfinite(x)][:3]}")
    return x


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie between 0 and 1, not {confidence}")


def median_interval(samples: Values, confidence: float = 0.95) -> tuple[float, float]:
    """The distribution-free ``confidence`` interval of the median: (x_(j), x_(n+1-j)) of
    the sorted samples, j the largest rank with P(B < j) <= (1 - confidence) / 2 for
    B ~ Binomial(n, 1/2) (the count of samples below the median), so the interval holds
    the median with probability at least ``confidence`` for any continuous distribution.

    With too few samples to reach the confidence (at 95 %, five or fewer: even the whole
    range holds the median only with probability 1 - 2 / 2**n, 94 % for five), the interval
    is (min, max), which covers less than asked.
    """
    _check_confidence(confidence)
    x = np.sort(_values(samples))
    n = x.size
    cdf = sps.binom.cdf(np.arange(n // 2 + 1), n, 0.5)
    # j = 1 + the largest r with P(B <= r) <= (1 - confidence) / 2 (0 when there is none)
    j = max(int(np.searchsorted(cdf, (1 - confidence) / 2, side="right")), 1)
    return float(x[j - 1]), float(x[n - j])


def relative_width(samples: Values, confidence: float = 0.95) -> float:
    """The width of ``median_interval`` over the median: 0.02 is an interval 2 % of the median wide."""
    lo, hi = median_interval(samples, confidence)
    median = float(np.median(_values(samples)))
    if median == 0:
        return 0.0 if hi == lo else math.inf
    return (hi - lo) / abs(median)


def block_medians(samples: Values, block: int) -> np.ndarray:
    """The medians of consecutive blocks of ``block`` samples; a last partial block is dropped."""
    if block < 1:
        raise ValueError(f"block must be at least 1, not {block}")
    x = np.asarray(samples, dtype=np.float64).ravel()
    blocks = x.size // block
    return np.median(x[: blocks * block].reshape(blocks, block), axis=1)


@dataclass(frozen=True)
class Shift:
    """How ``current`` compares with ``baseline`` (``shift``)."""

    estimate: float  # relative change of current against baseline: +0.2 = 20 % slower (exp of the log shift minus 1)
    low: float  # the confidence interval of that relative change
    high: float
    p_slower: float  # one-sided p-value that current is slower
    p_faster: float  # one-sided p-value that current is faster
    n_baseline: int
    n_current: int
    confidence: float = 0.95  # of [low, high]


@lru_cache(maxsize=64)
def _u_cdf(n: int, m: int) -> np.ndarray:
    """P(U <= u), u = 0 .. n m, of the Mann-Whitney U of samples of sizes n and m under the
    null: the coefficients of the Gaussian binomial [n + m choose n]_q over C(n + m, n),
    computed exactly in integers as prod_i (1 - q^(m+i)) / (1 - q^i) in power series
    truncated after q^(n m)."""
    n, m = min(n, m), max(n, m)
    size = n * m + 1
    counts = [0] * size
    counts[0] = 1
    for i in range(1, n + 1):
        k = m + i
        for u in range(size - 1, k - 1, -1):  # times (1 - q^k)
            counts[u] -= counts[u - k]
        for u in range(i, size):  # over (1 - q^i)
            counts[u] += counts[u - i]
    total = math.comb(n + m, n)
    cumulative = 0
    out = np.empty(size)
    for u, c in enumerate(counts):
        cumulative += c
        out[u] = cumulative / total  # exact integers, one rounding
    return out


def _moses_rank(n: int, m: int, confidence: float) -> int:
    """k, the rank (from 1) of the lower end of the Moses interval among the n m sorted
    differences: k - 1 is the largest u with P(U <= u) <= (1 - confidence) / 2, exactly
    where the smaller sample has at most ``EXACT_LIMIT`` values, else by the normal
    approximation with continuity correction. 0 when no such u exists (too few values)."""
    half_alpha = (1 - confidence) / 2
    if min(n, m) <= EXACT_LIMIT:
        return int(np.searchsorted(_u_cdf(n, m), half_alpha, side="right"))
    sigma = math.sqrt(n * m * (n + m + 1) / 12)
    u = math.floor(n * m / 2 - sps.norm.isf(half_alpha) * sigma - 0.5)
    return max(u + 1, 0)


def _p_value(current: np.ndarray, baseline: np.ndarray, alternative: str) -> float:
    p = float(sps.mannwhitneyu(current, baseline, alternative=alternative, method="auto").pvalue)
    return 1.0 if math.isnan(p) else p  # every value tied: no evidence either way


def shift(baseline: Values, current: Values, confidence: float = 0.95) -> Shift:
    """How much slower ``current`` is than ``baseline`` (positive values per block), with
    its ``confidence`` interval and the one-sided p-values (module docstring).

    The p-values are scipy's Mann-Whitney U ("auto": exact when the smaller side has at
    most 8 values and there are no ties, else the normal approximation with tie and
    continuity corrections). The interval's ranks come from the exact null distribution of
    U under the same size rule, else the normal approximation; with too few values to reach
    the confidence (at 95 %, 3 against 3) it is the whole range of the differences.
    """
    _check_confidence(confidence)
    b, c = _values(baseline, "baseline values"), _values(current, "current values")
    if np.any(b <= 0) or np.any(c <= 0):
        raise ValueError("shift compares positive values (times, or ratios of times)")
    lb, lc = np.log(b), np.log(c)
    differences = np.sort(np.subtract.outer(lc, lb).ravel())
    k = max(_moses_rank(b.size, c.size, confidence), 1)
    return Shift(
        estimate=math.expm1(float(np.median(differences))),
        low=math.expm1(float(differences[k - 1])),
        high=math.expm1(float(differences[-k])),
        p_slower=_p_value(lc, lb, "greater"),
        p_faster=_p_value(lc, lb, "less"),
        n_baseline=b.size,
        n_current=c.size,
        confidence=confidence,
    )


@dataclass(frozen=True)
class Gate:
    """The verdict on a ``Shift`` against a threshold (``gate``)."""

    verdict: str  # "slower" (fails: exit 1), "faster", "unchanged", "inconclusive"
    message: str  # one line a user reads
    shift: Shift
    failed: bool  # verdict == "slower"


def _percent(x: float) -> str:
    return f"{100 * x:.1f}"


def _blocks_to_decide(alpha: float) -> int:
    """The fewest blocks on each side with which a one-sided rank test can reach ``alpha``
    (the smallest p-value is 1 / C(2n, n))."""
    n = 1
    while 1 / math.comb(2 * n, n) >= alpha:
        n += 1
    return n


def gate(s: Shift, threshold: float, alpha: float = 0.01) -> Gate:
    """The verdict on ``s`` at a relative ``threshold`` (0.05: 5 %) and significance ``alpha``:

    - "slower" (``failed``) when current is significantly slower (p_slower < alpha) and the
      estimate is above the threshold;
    - "faster" when it is significantly faster and the estimate is below -threshold;
    - "unchanged" when the whole interval lies within (-threshold, threshold), or when
      neither test is significant, the interval's upper end is below the threshold and the
      estimate above -threshold (a large speedup short of significance is not "unchanged":
      it is inconclusive);
    - "inconclusive" otherwise (the interval reaches past the threshold and the evidence
      does not settle it: more blocks would), and with fewer than 3 blocks on either side.
    """
    if threshold <= 0:
        raise ValueError(f"threshold must be positive, not {threshold}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie between 0 and 1, not {alpha}")
    slower = s.estimate >= 0
    p = s.p_slower if slower else s.p_faster
    significant = p < alpha
    p_text = f"p = {p:.2g} < {alpha:g}" if significant else f"p = {p:.2g}"
    said = (
        f"{_percent(abs(s.estimate))} % {'slower' if slower else 'faster'} "
        f"({100 * s.confidence:g} % interval {_percent(s.low)} .. {_percent(s.high)} %), {p_text}"
    )
    limit = f"the {100 * threshold:g} % threshold"

    def verdict(name: str, why: str) -> Gate:
        return Gate(name, f"{said}: {why}", s, name == "slower")

    fewest = min(s.n_baseline, s.n_current)
    if fewest < MIN_BLOCKS:
        return verdict(
            "inconclusive",
            f"too few blocks to decide ({s.n_baseline} baseline, {s.n_current} current; at least {MIN_BLOCKS} each)",
        )
    if s.p_slower < alpha and s.estimate > threshold:
        return verdict("slower", f"over {limit}")
    if s.p_faster < alpha and s.estimate < -threshold:
        return verdict("faster", f"past {limit}")
    if -threshold < s.low and s.high < threshold:
        return verdict("unchanged", f"the interval is within {limit}")
    if s.p_slower >= alpha and s.p_faster >= alpha and s.high < threshold and s.estimate > -threshold:
        return verdict("unchanged", f"no significant change, and the interval rules out a slowdown past {limit}")
    needed = _blocks_to_decide(alpha)
    more = (
        f"at least {needed} blocks on each side could reach p < {alpha:g} (now {s.n_baseline} and {s.n_current})"
        if fewest < needed
        else f"more blocks (now {s.n_baseline} and {s.n_current}) would narrow it"
    )
    return verdict("inconclusive", f"the interval reaches past {limit} and the evidence does not settle it: {more}")


def drift(values: Values) -> float:
    """The relative change of the median of the last third of ``values`` against the first
    third's (+0.1: the last third 10 % higher); 0.0 for fewer than 6 values. On the copy's
    block medians: the same copy getting slower during a run is a clock throttling."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size < 6:
        return 0.0
    third = x.size // 3
    return float(np.median(x[-third:]) / np.median(x[:third]) - 1)
