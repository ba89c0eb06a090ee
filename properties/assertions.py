"""Comparisons that every check shares, and the failure they raise.

Each comparison measures |actual - expected| against an allowed bound of the same shape
and returns the largest ratio (the error in tolerance units); a ratio above 1 raises
CheckFailure naming how many elements failed, the worst one, its position, and the
values on both sides.
"""

from __future__ import annotations

import numpy as np

__tracebackhide__ = True


class CheckFailure(AssertionError):
    """A property does not hold. ``error`` is in tolerance units (> 1)."""

    def __init__(self, message: str, error: float = float("inf"), where: dict | None = None):
        super().__init__(message)
        self.error = error
        self.where = where or {}  # axis name -> index of the worst element


AXES_4D = ("batch", "seq", "head", "feature")
AXES_3D = ("batch", "seq", "head")


def _where(index, axes, positions) -> str:
    parts = [f"{name}={i}" for name, i in zip(axes, index)]
    if positions is not None and len(index) >= 2:
        parts.append(f"position={int(positions[index[0], index[1]])}")
    return ", ".join(parts)


class Tally:
    """|actual - expected| <= bound over blocks of one comparison (a large input compared a
    chunk at a time): the largest ratio, how many elements failed, and the worst element
    with its index in the whole."""

    def __init__(self):
        self.worst, self.bad, self.size = 0.0, 0, 0
        self.detail = None  # (index, actual, expected, diff, bound) of the worst element

    def add(self, actual, expected, bound, offset=()) -> "Tally":
        """One block; ``offset``: its first index in the whole (per leading axis). The
        block is numpy arrays (float64), or torch tensors on a device (float64; the ratios
        are computed there and only the worst element comes to the host): the same tally
        for the same values."""
        if hasattr(actual, "device") and hasattr(actual, "abs"):  # torch, where the data is
            diff = (actual - expected).abs()
            ratio = diff / bound.clamp_min(np.finfo(np.float64).tiny)
            ratio = ratio.where(diff.isfinite(), ratio.new_tensor(np.inf))
            bound = bound.expand(ratio.shape)
        else:
            actual = np.asarray(actual, np.float64)
            expected = np.broadcast_to(np.asarray(expected, np.float64), actual.shape)
            bound = np.broadcast_to(np.asarray(bound, np.float64), actual.shape)
            diff = np.abs(actual - expected)
            ratio = np.where(np.isfinite(diff), diff / np.maximum(bound, np.finfo(np.float64).tiny), np.inf)
        size = int(np.prod(tuple(ratio.shape)))
        self.size += size
        if size == 0:
            return self
        self.bad += int((ratio > 1.0).sum())
        flat = int(ratio.reshape(-1).argmax())
        worst = float(ratio.reshape(-1)[flat])
        if self.detail is None or worst > self.worst:
            index = np.unravel_index(flat, tuple(ratio.shape))
            self.worst = worst
            whole = tuple(int(i) + (offset[n] if n < len(offset) else 0) for n, i in enumerate(index))
            self.detail = (whole, *(float(t[index]) for t in (actual, expected, diff, bound)))
        return self

    def verdict(self, *, what: str, positions=None, axes=AXES_4D) -> float:
        """The largest ratio; CheckFailure when it is above 1."""
        __tracebackhide__ = True
        if self.worst <= 1.0:
            return self.worst
        index, got, expected, diff, bound = self.detail
        raise CheckFailure(
            f"{what}: {self.bad} / {self.size} ({100.0 * self.bad / self.size:.3g} %) outside the bound; "
            f"worst at {_where(index, axes, positions)}: got {got:.9g}, expected "
            f"{expected:.9g}, |difference| {diff:.3g}, allowed {bound:.3g} "
            f"({self.worst:.3g} x tolerance)",
            error=self.worst,
            where=dict(zip(axes, map(int, index))),
        )


def assert_close(actual, expected, bound, *, what: str, positions=None, axes=AXES_4D) -> float:
    """|actual - expected| <= bound elementwise; returns max(|actual - expected| / bound)."""
    __tracebackhide__ = True
    return Tally().add(actual, expected, bound).verdict(what=what, positions=positions, axes=axes)


def assert_distinct(a, b, bound, *, what: str, positions=None, axes=AXES_3D) -> float:
    """|a - b| > bound elementwise (things that must differ do, beyond rounding noise).
    Returns the largest bound / |a - b| (<= 1 passes; inf where a and b are equal)."""
    __tracebackhide__ = True
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    bound = np.broadcast_to(np.asarray(bound, np.float64), diff.shape)
    ratio = np.divide(bound, diff, out=np.full(diff.shape, np.inf), where=diff > 0)
    flat = int(np.argmax(ratio))
    worst = float(ratio.flat[flat])
    if worst <= 1.0:
        return worst
    index = np.unravel_index(flat, ratio.shape)
    raise CheckFailure(
        f"{what}: at {_where(index, axes, positions)} the difference "
        f"{diff[index]:.3g} is within rounding noise {bound[index]:.3g}",
        error=worst,
        where=dict(zip(axes, map(int, index))),
    )


def assert_moved(base, base_noise, moved, *, what: str, positions=None, axes=AXES_3D) -> float:
    """Each head vector (the last axis: its elements) of ``base`` moved beyond rounding noise
    in one of the ``moved`` outputs: ``moved`` is a list of (output, its element noise),
    and an element moved when |output - base| exceeds its noise plus ``base_noise`` (the
    two calls' element bounds). Per head vector the best element of the best output
    decides (<= 1 passes; the largest bound / |difference| is returned)."""
    __tracebackhide__ = True
    picked = []  # per output: (score, |difference|, noise) of each head vector's best element
    for output, noise in moved:
        diff = np.abs(np.asarray(output, np.float64) - np.asarray(base, np.float64))
        noise = np.broadcast_to(np.asarray(noise, np.float64) + base_noise, diff.shape)
        score = diff / np.maximum(noise, np.finfo(np.float64).tiny)
        pick = np.argmax(score, axis=-1)[..., None]
        picked.append([np.take_along_axis(a, pick, -1)[..., 0] for a in (score, diff, noise)])
    best = np.argmax(np.stack([p[0] for p in picked]), axis=0)[None]  # the best output per head vector
    best_diff, best_noise = (np.take_along_axis(np.stack([p[n] for p in picked]), best, 0)[0] for n in (1, 2))
    return assert_distinct(best_diff, 0.0, best_noise, what=what, positions=positions, axes=axes)
