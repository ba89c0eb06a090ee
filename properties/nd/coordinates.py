"""Where an N-D target's positions lie, and how the checks draw and move them.

Language models number tokens from 0; image and video models give each token the
coordinates of its patch, and those may be negative (Qwen-Image centres its grid),
fractional (LTX-Video's normalised frames, DINOv3's [-1, 1]), scaled (EVA-02) or offset
(CogVideoX's crop grid). A ``Coordinates`` record says which (``--positions``,
``--coord-range``, ``--coord-scale``, ``--coord-offset``); the rotation then turns pair p by
theta_p (S_a x_a + O_a), a = the pair's axis.

- ``int`` without a range (the default, ``TOKEN_INDICES``): token indices from 0, drawn and
  shifted below the target's largest position, as 1-D RoPE's are;
- ``int`` with a range: integer coordinates anywhere in it, negative ones included;
- ``float``: float32 coordinates (default range FLOAT_RANGE); the reference takes their
  exact float32 values, and the shifts of relativity and commutation are real numbers.

Positions are drawn either as a grid (the meshgrid of a patchified image or video: axis a
takes evenly spaced values of its range, the last axis fastest, as every image model lays
its tokens out) or scattered over the range. The error model measures an angle in units
of |S_a x_a| + |O_a| (``magnitudes``), what a float32 kernel rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from hypothesis import strategies as st

from ropecheck.reference.nd import per_axis

KINDS = ("int", "float")
FLOAT_RANGE = (-512.0, 512.0)  # float coordinates drawn by default: patch indices past bf16's 256 and their fractions
DRAWN = 64  # coordinates drawn one by one up to this many, from a drawn seed beyond (hypothesis' budget)


@dataclass(frozen=True)
class Coordinates:
    """The positions an N-D target takes: their kind, the range drawn per axis, and the
    per-axis scale and offset its rotation applies to them (S_a x_a + O_a)."""

    kind: str = "int"
    ranges: tuple = ()  # ((lo, hi), ...): one for every axis, or one for all; () the kind's default
    scale: tuple = ()  # S_a: one for every axis, or one for all; () 1
    offset: tuple = ()  # O_a: likewise; () 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"--positions must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for lo, hi in self.ranges:
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"--coord-range {lo:g}:{hi:g}: needs finite LO < HI")
            if self.kind == "int" and (lo != int(lo) or hi != int(hi)):
                raise ValueError(f"--coord-range {lo:g}:{hi:g}: integer positions need integer bounds")
        if any(not math.isfinite(s) or s == 0 for s in self.scale):
            raise ValueError(f"--coord-scale must be finite and non-zero, got {list(self.scale)}")
        if any(not math.isfinite(o) for o in self.offset):
            raise ValueError(f"--coord-offset must be finite, got {list(self.offset)}")

    @property
    def token_indices(self) -> bool:
        """Token indices from 0: the positions language models give (the default)."""
        return self.kind == "int" and not self.ranges

    @property
    def dtype(self):
        return np.float32 if self.kind == "float" else np.int64

    @property
    def bounded(self) -> bool:
        """Whether a range is declared: then it is the target's domain, and every position a
        check hands the target lies in it, shifted ones too (a kernel may index a table
        with them, as Wan's and Cosmos' do)."""
        return bool(self.ranges)

    def holds_zero(self, n_axes: int) -> bool:
        """Whether position 0 of every axis lies in the domain (identity and commutation
        hand the target 0 and small steps)."""
        lo, hi = self.bounds(n_axes)
        return not self.bounded or bool(np.all(lo <= 0) and np.all(hi >= 0))

    @property
    def offsets_angles(self) -> bool:
        """Whether the rotation turns pairs at x = 0 (an offset): then f(x, 0) != x."""
        return any(o != 0 for o in self.offset)

    def check_axes(self, n_axes: int) -> "Coordinates":
        """Itself, after checking that each per-axis list has 1 or ``n_axes`` entries."""
        for what, values in (
            ("--coord-range", self.ranges),
            ("--coord-scale", self.scale),
            ("--coord-offset", self.offset),
        ):
            if len(values) not in (0, 1, n_axes):
                raise ValueError(f"{what}: give one value for all axes or one per axis ({n_axes}), got {len(values)}")
        return self

    def scales(self, n_axes: int) -> np.ndarray:
        return np.asarray(per_axis(self.scale, n_axes, 1.0, "--coord-scale"), dtype=np.float64)

    def offsets(self, n_axes: int) -> np.ndarray:
        return np.asarray(per_axis(self.offset, n_axes, 0.0, "--coord-offset"), dtype=np.float64)

    def bounds(self, n_axes: int) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) per axis of the drawn positions (not for token indices: ``limit``)."""
        default = FLOAT_RANGE if self.kind == "float" else (0, 0)
        pairs = per_axis(self.ranges, n_axes, default, "--coord-range")
        return np.asarray([p[0] for p in pairs], np.float64), np.asarray([p[1] for p in pairs], np.float64)

    def span(self, n_axes: int) -> float:
        """The widest range's width: how far shifts move positions."""
        lo, hi = self.bounds(n_axes)
        return float(np.max(hi - lo))

    def given(self, positions) -> np.ndarray:
        """The positions as the target is handed them: float32 coordinates (a shifted
        position rounded as the caller's tensor rounds it), else int64."""
        return np.asarray(positions).astype(self.dtype)

    def magnitudes(self, positions) -> np.ndarray:
        """|S_a x_a| + |O_a| per axis, float64: the size of the coordinate a kernel turns
        into an angle, in the units a float32 angle is rounded in."""
        p = np.asarray(positions, dtype=np.float64)
        n_axes = p.shape[-1]
        return np.abs(p * self.scales(n_axes)) + np.abs(self.offsets(n_axes))

    # --- drawing -------------------------------------------------------------------------
    def draw(self, d, batch: int, seq: int, n_axes: int, *, room: bool = False) -> np.ndarray:
        """Positions (batch, seq, n_axes) in the ranges: a grid or scattered (not for token
        indices, whose draw is ``checks.nd_cases``'s). ``room``: in a declared range, only
        its lower half, the upper half left for the shifts of the checks that move positions
        (as token indices are drawn below half the largest position)."""
        lo, hi = self.bounds(n_axes)
        if room and self.bounded:
            hi = lo + (hi - lo) / 2
            if self.kind == "int":
                hi = np.floor(hi)
        rng = np.random.default_rng(d(st.integers(0, 2**32 - 1)))
        if d(st.booleans()):  # a grid: the meshgrid of a patchified image / video, last axis fastest
            sides = grid_sides(seq, n_axes)
            axes = []
            for a, n in enumerate(sides):
                start = d(st.sampled_from((lo[a], hi[a] - (n - 1)))) if self.kind == "int" else lo[a]
                step = 1.0 if self.kind == "int" else (hi[a] - lo[a]) / max(n - 1, 1)
                axes.append(np.clip(start + step * np.arange(n), lo[a], hi[a]))
            grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, n_axes)[:seq]
            p = np.broadcast_to(grid, (batch, seq, n_axes))
        elif self.kind == "int":
            p = rng.integers(lo.astype(np.int64), hi.astype(np.int64) + 1, size=(batch, seq, n_axes))
        else:
            p = lo + (hi - lo) * rng.random((batch, seq, n_axes))
        p = np.array(p, dtype=self.dtype)
        if p.size and d(st.booleans()):  # the range's ends and zero, where real grids have them
            ends = np.stack([lo, hi, np.clip(0.0, lo, hi)]).astype(self.dtype)
            p.reshape(-1, n_axes)[: min(3, p.shape[0] * p.shape[1])] = ends[: min(3, p.shape[0] * p.shape[1])]
        return p

    def shift(self, positions: np.ndarray, axis: int, *, nonzero: bool = False, as_position: bool = False):
        """A strategy of one shift c of ``axis`` (an integer, or a float32 real number): what
        relativity and commutation move positions by. In a declared range, P + c stays in
        it (and c itself, ``as_position``: commutation hands the target c as positions);
        else c lies within the widest range's width either way."""
        n_axes = positions.shape[-1]
        if self.bounded:
            lo, hi = self.bounds(n_axes)
            p = np.asarray(positions, np.float64)[..., axis]
            low, high = lo[axis] - (p.min() if p.size else 0.0), hi[axis] - (p.max() if p.size else 0.0)
            if as_position:
                low, high = max(low, lo[axis]), min(high, hi[axis])
        else:
            high = max(self.span(n_axes), 1.0)
            low = -high
        values: st.SearchStrategy = (
            st.integers(math.ceil(low), math.floor(high))
            if self.kind == "int"  # else float32 ends inside [low, high]: P + c rounds into the range
            else st.floats(_inward(low, +1), _inward(high, -1), allow_nan=False, width=32)
        )
        return values.filter(bool) if nonzero else values

    def shifts(self, positions: np.ndarray, *, as_position: bool = False):
        """A strategy of one shift per axis (``shift``'s rules, each axis its own)."""
        return st.tuples(*(self.shift(positions, a, as_position=as_position) for a in range(positions.shape[-1])))

    def turning_shifts(self, half_turns: list, n_axes: int) -> tuple:
        """The shifts the invertibility check moves an axis by: the widest range's width, 1,
        and per axis the shift that turns its fastest pair about half a turn (``half_turns``:
        pi / (theta_max S_a), in units of the coordinate); integers for integer positions.
        In a declared range none exceeds a quarter of the narrowest range's width, so that
        P + c e_k and P + c (e_j - e_k) stay in it from ``invertibility_base``."""
        shifts = {self.span(n_axes), 1.0, *half_turns}
        if self.kind == "int":
            shifts = {max(1, int(round(c))) for c in shifts}
        if self.bounded:  # a range narrower than 4 integers still gets a step of 1
            shifts = {min(c, max(self.quarter(n_axes), 1 if self.kind == "int" else 0)) for c in shifts}
        if self.kind == "int":
            return tuple(sorted(shifts))
        return tuple(sorted({float(np.float32(c)) for c in shifts if c > 0}))

    def quarter(self, n_axes: int) -> float:
        """A quarter of the narrowest declared range's width (integer positions: whole)."""
        lo, hi = self.bounds(n_axes)
        q = float(np.min(hi - lo)) / 4
        return math.floor(q) if self.kind == "int" else q

    def invertibility_base(self, positions: np.ndarray, largest_shift) -> np.ndarray:
        """Positions the invertibility check moves by +-c along axes: in a declared range,
        drawn in its lower half and moved up by the largest shift (then P +- c stays in the
        range); otherwise as drawn."""
        if not self.bounded:
            return positions
        return self.given(np.asarray(positions, np.float64) + largest_shift)


def _inward(value: float, direction: int) -> float:
    """The float32 nearest ``value`` on its side ``direction`` (+1: not below, -1: not above)."""
    f = np.float32(value)
    if direction > 0 and f < value:
        f = np.nextafter(f, np.float32(np.inf))
    if direction < 0 and f > value:
        f = np.nextafter(f, np.float32(-np.inf))
    return float(f)


TOKEN_INDICES = Coordinates()


def grid_sides(seq: int, n_axes: int) -> list:
    """Sides (n_0, .., n_{N-1}) of a grid with at least ``seq`` points, as near square as
    integers allow (the last axes get the larger sides, as images are wider than tall and
    videos have fewer frames than rows)."""
    side = max(1, math.ceil(seq ** (1.0 / n_axes)))
    sides = [side] * n_axes
    for a in range(n_axes):  # the first axes shrink while the grid still holds seq points
        while sides[a] > 1 and math.prod(sides) // sides[a] * (sides[a] - 1) >= seq:
            sides[a] -= 1
    return sides


def parse_range(text: str) -> tuple:
    """One ``LO:HI`` of --coord-range as (lo, hi) floats."""
    lo, sep, hi = text.partition(":")
    if not sep:
        raise ValueError(f"--coord-range takes LO:HI, got {text!r}")
    try:
        return float(lo), float(hi)
    except ValueError:
        raise ValueError(f"--coord-range takes numbers LO:HI, got {text!r}") from None


def declared(parameters: dict, n_axes: int) -> Optional[Coordinates]:
    """The coordinates the parameters declare (None: token indices, today's default)."""
    kind = parameters.get("positions")
    ranges, scale, offset = (parameters.get(k) for k in ("coord_range", "coord_scale", "coord_offset"))
    if not (kind or ranges or scale or offset):
        return None
    coords = Coordinates(
        kind or "int",
        tuple(parse_range(r) if isinstance(r, str) else tuple(r) for r in ranges or ()),
        tuple(float(s) for s in scale or ()),
        tuple(float(o) for o in offset or ()),
    )
    return coords.check_axes(n_axes)
