"""Float64 reference for N-D rotary position embeddings (seed: 2-D RoPE via matrix exponentials).

A position is a vector (x_1, .., x_n) and R_x = expm(sum_k x_k B_k). Relativity,
R_x^T R_y = R_{y-x}, holds when every B_k is skew-symmetric and the B_k commute pairwise;
invertibility (x recoverable from R_x) needs them to act independently. Every scheme in
use is the block-diagonal solution: each rotated pair p of features (first_p, second_p)
turns by phi_p = x_{axis_p} theta_p. ``PairRotation`` describes such a map by its pairs;
two constructors give the schemes in use:

- ``axial``: features split into per-axis blocks, a 1-D RoPE (layout, base or theta) in
  each block (timm, rotary-embedding-torch, the seed's RoPE-2D);
- ``mrope``: one 1-D RoPE over the whole head (theta_i = base^(-2i/d)) whose pairs are
  assigned to axes by frequency sections, in units of pairs (Qwen2-VL: [16, 24, 24] for
  head_dim 128, half layout), in chunks or interleaved (Qwen3-VL: [24, 20, 20]).

``rotation_expm`` computes the general case with ``scipy.linalg.expm`` after
``validate_generators``; it agrees with ``PairRotation.apply`` on the block-diagonal one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ropecheck.reference.rope import DEFAULT_BASE, check_layout, inv_freq, pair_indices

PAIR_SPANS = ("axis", "head")  # where an axial half layout's pairs lie: in each axis' block, or across the head


class GeneratorError(ValueError):
    """Generators that cannot give a relative N-D RoPE (not skew-symmetric, or not commuting)."""


@dataclass(frozen=True)
class PairRotation:
    """An N-D RoPE as a list of rotated pairs: pair p turns features (first[p], second[p])
    counter-clockwise by theta[p] (S_a x_a + O_a) + phase[p], a = axis[p], x the position
    (``scale`` S and ``offset`` O per axis, default 1 and 0: coordinates of image and video
    models; ``phase`` per pair, default 0). Features in no pair pass through."""

    head_dim: int
    n_axes: int
    first: tuple
    second: tuple
    axis: tuple
    theta: tuple
    description: str = ""
    phase: tuple = ()  # per pair (() none)
    scale: tuple = ()  # per axis (() 1)
    offset: tuple = ()  # per axis (() 0)
    # the rotation spans a token's ``heads`` heads: head_dim is heads x the target's head size,
    # and the pairs index that joined vector (a rotation applied before the head split; None: per head)
    heads: Optional[int] = None

    def __post_init__(self):
        used = list(self.first) + list(self.second)
        if len(set(used)) != len(used) or (used and (min(used) < 0 or max(used) >= self.head_dim)):
            raise ValueError("pairs must use distinct features inside head_dim")
        if not (len(self.first) == len(self.second) == len(self.axis) == len(self.theta)):
            raise ValueError("first, second, axis and theta must have one entry per pair")
        if any(not 0 <= a < self.n_axes for a in self.axis):
            raise ValueError(f"pair axes must lie in 0 .. {self.n_axes - 1}")
        if self.phase and len(self.phase) != len(self.first):
            raise ValueError("phase must have one entry per pair")
        if any(len(v) not in (0, self.n_axes) for v in (self.scale, self.offset)):
            raise ValueError(f"scale and offset must have one entry per axis ({self.n_axes})")
        if self.heads is not None and (self.heads < 1 or self.head_dim % self.heads):
            raise ValueError(f"{self.heads} heads do not split head_dim {self.head_dim}")

    @property
    def arrays(self):
        return (
            np.asarray(self.first),
            np.asarray(self.second),
            np.asarray(self.axis),
            np.asarray(self.theta, dtype=np.float64),
        )

    @property
    def turns_at_zero(self) -> bool:
        """Whether some pair turns at x = 0 (an offset or a phase): then f(x, 0) != x and
        R_P R_Q != R_{P+Q}."""
        return any(v != 0 for v in (*self.phase, *self.offset))

    @property
    def turns_fast(self) -> bool:
        """Whether some pair turns by more than 1 rad per unit of its coordinate (theta S > 1)
        or has a phase: the generic angle allowance (theta_0 = 1, no phase) does not hold."""
        _, _, axis, theta = self.arrays
        scale = np.abs(np.asarray(self.scale)[axis]) if self.scale else 1.0
        return bool(np.any(theta * scale > 1.0)) or any(self.phase) or any(self.offset)

    @property
    def affine(self) -> bool:
        """Whether positions are scaled or offset before they meet the frequencies."""
        return bool(self.scale or self.offset)

    def with_coordinates(self, scale=(), offset=()) -> "PairRotation":
        """This rotation applied to S_a x_a + O_a (one value for all axes, or one per axis)."""
        from dataclasses import replace

        scale = tuple(float(t) for t in per_axis(scale, self.n_axes, 1.0, "scale"))
        offset = tuple(float(t) for t in per_axis(offset, self.n_axes, 0.0, "offset"))
        scaled, shifted = any(t != 1 for t in scale), any(t != 0 for t in offset)
        if not scaled and not shifted:
            return self
        words = [f"scale {list(scale)}"] * scaled + [f"offset {list(offset)}"] * shifted
        return replace(self, scale=scale, offset=offset, description=f"{self.description}, {', '.join(words)}")

    def pair_positions(self, positions) -> np.ndarray:
        """x_{axis_p} for every pair: shape (*positions.shape[:-1], n_pairs)."""
        m = np.asarray(positions)
        if m.shape[-1:] != (self.n_axes,):
            raise ValueError(f"positions must end in an axis of size {self.n_axes}, got shape {m.shape}")
        return m[..., self.arrays[2]]

    def _pair_affine(self) -> tuple[np.ndarray, np.ndarray]:
        """(S, O) of every pair's axis."""
        axis = self.arrays[2]
        return np.asarray(self.scale or (1.0,) * self.n_axes)[axis], np.asarray(self.offset or (0.0,) * self.n_axes)[
            axis
        ]

    def pair_coordinates(self, positions) -> np.ndarray:
        """S_a x_a + O_a for every pair's axis a, in float64 (exact for integer positions,
        and for float32 ones unscaled and not offset)."""
        x = self.pair_positions(positions).astype(np.float64)
        if not self.affine:
            return x
        scale, offset = self._pair_affine()
        return x * scale + offset

    def angle_magnitudes(self, positions) -> np.ndarray:
        """|S_a x_a| + |O_a| for every pair's axis: the size of the coordinate a float32
        kernel rounds on its way to the angle (``tolerance.rotation_bound``)."""
        x = np.abs(self.pair_positions(positions).astype(np.float64))
        if not self.affine:
            return x
        scale, offset = self._pair_affine()
        return x * np.abs(scale) + np.abs(offset)

    def angles(self, positions) -> np.ndarray:
        """phi_p = theta_p (S x + O)_{axis_p} + phase_p in float64."""
        phi = self.pair_coordinates(positions) * self.arrays[3]
        return phi + np.asarray(self.phase, dtype=np.float64) if self.phase else phi

    def apply(self, x, positions, *, inverse: bool = False) -> np.ndarray:
        """R_x v for v = x (batch, seq, heads, head_dim) at positions (batch, seq, n_axes)."""
        x = np.asarray(x, dtype=np.float64)
        m = np.asarray(positions)
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"this convention has head_dim {self.head_dim}, got x of shape {x.shape}")
        phi = -self.angles(m) if inverse else self.angles(m)  # R_P^T turns every pair back
        phi = phi.reshape(phi.shape[:-1] + (1,) * (x.ndim - phi.ndim) + phi.shape[-1:])
        i, j, _, _ = self.arrays
        a, b = x[..., i], x[..., j]
        y = x.copy()
        y[..., i] = a * np.cos(phi) - b * np.sin(phi)
        y[..., j] = a * np.sin(phi) + b * np.cos(phi)
        return y

    def generators(self) -> list:
        """B_k (head_dim x head_dim), skew-symmetric, with R_x = expm(sum_k x_k B_k) (times
        R at x = 0 where pairs turn there: ``turns_at_zero``)."""
        i, j, axis, theta = self.arrays
        if self.scale:
            theta = theta * np.asarray(self.scale)[axis]
        out = []
        for k in range(self.n_axes):
            b = np.zeros((self.head_dim, self.head_dim))
            sel = axis == k
            b[j[sel], i[sel]] = theta[sel]
            b[i[sel], j[sel]] = -theta[sel]
            out.append(b)
        return out

    def pair_norms(self, x) -> np.ndarray:
        i, j, _, _ = self.arrays
        x = np.asarray(x, dtype=np.float64)
        return np.hypot(x[..., i], x[..., j])


def per_axis(values: Optional[Sequence], n: int, default, what: str) -> list:
    """One value for every axis, or one per axis: ``values`` expanded to ``n`` (None or
    empty: ``default`` for each)."""
    if values is None or len(values) == 0:
        return [default] * n
    values = list(values)
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise ValueError(f"{what}: expected 1 or {n} values (one per axis), got {len(values)}")
    return values


def axial(
    head_dim: int,
    n_axes: int,
    *,
    layout: str = "interleaved",
    base=DEFAULT_BASE,
    split: Optional[Sequence[int]] = None,
    thetas: Optional[Sequence] = None,
    pair_span: str = "axis",
) -> PairRotation:
    """Features split into consecutive per-axis blocks (``split``: features per axis, even,
    default head_dim / n_axes each); block k is a 1-D RoPE of its own width with
    ``layout`` and theta_i = base_k^(-2i/width) (``base``: one value or one per axis), or
    the given per-axis ``thetas``. Features past the blocks pass through.

    ``pair_span="head"`` (half layout; Qwen2.5-VL's vision tower, DINOv3, Cosmos, CogView4):
    the pairs span the whole rotated head instead of each block, as rotate_half of the
    head pairs them: with r = sum(split), pair p is features (p, p + r/2); the pairs are
    dealt to the axes in consecutive blocks of split_k / 2, axis order, and pair j of axis
    k turns by x_k base_k^(-2j / split_k), as in each axis' own block."""
    check_layout(layout)
    if pair_span not in PAIR_SPANS:
        raise ValueError(f"pair span must be one of {', '.join(PAIR_SPANS)}, got {pair_span!r}")
    if pair_span == "head" and layout != "half":
        raise ValueError(
            "--pair-span head pairs feature p with p + r/2 (rotate_half of the head): it needs --layout half "
            "(interleaved pairs are adjacent features whatever the span)"
        )
    if n_axes < 1:
        raise ValueError(f"n_axes must be >= 1, got {n_axes}")
    if split is None:
        if head_dim % (2 * n_axes):
            raise ValueError(f"head_dim {head_dim} does not split into {n_axes} even blocks")
        split = [head_dim // n_axes] * n_axes
    split = per_axis(split, n_axes, None, "split")
    if any(w <= 0 or w % 2 for w in split) or sum(split) > head_dim:
        raise ValueError(f"split {split}: each block must be even and positive, in all <= head_dim {head_dim}")
    bases = per_axis(None if isinstance(base, (int, float)) else base, n_axes, base, "base")
    first, second, axis, theta = [], [], [], []
    start, half = 0, sum(split) // 2
    for k, width in enumerate(split):
        t = inv_freq(width, float(bases[k])) if thetas is None else np.asarray(thetas[k], np.float64)
        if t.shape != (width // 2,):
            raise ValueError(f"axis {k}: {width // 2} frequencies expected, got {t.shape}")
        if pair_span == "head":  # pairs start // 2 .. of the head's r/2, each with its partner r/2 on
            i = np.arange(width // 2) + start // 2
            j = i + half
        else:
            i, j = pair_indices(width, layout)
            i, j = i + start, j + start
        first += i.tolist()
        second += j.tolist()
        axis += [k] * (width // 2)
        theta += t.tolist()
        start += width
    span = ", pairs span the head" if pair_span == "head" else ""
    return PairRotation(
        head_dim,
        n_axes,
        tuple(first),
        tuple(second),
        tuple(axis),
        tuple(theta),
        f"axial {n_axes}-D, split {list(split)}, {layout}{span}",
    )


def mrope(
    sections: Sequence[int],
    *,
    layout: str = "half",
    base: float = DEFAULT_BASE,
    head_dim: Optional[int] = None,
    interleaved: bool = False,
) -> PairRotation:
    """M-RoPE: one 1-D RoPE over d = 2 * sum(sections) features (theta_i = base^(-2i/d),
    ``layout``) whose pairs are assigned to axes by ``sections`` (pairs per axis: t, h, w).

    Chunked (Qwen2-VL, Qwen2.5-VL): pairs 0 .. s_0 - 1 are driven by axis 0 (t), the next
    s_1 by axis 1 (h), and so on. ``interleaved`` (Qwen3-VL, HF ``mrope_interleaved``):
    pair i goes to axis k >= 1 when i = k (mod n) and i < n s_k (n = len(sections)), every
    other pair to axis 0, so each axis spans the whole frequency range. As in HF, a section
    that does not fit below d/2 is cut there (then axis 0 gets the pairs left over)."""
    sections = [int(s) for s in sections]
    if not sections or any(s < 0 for s in sections) or sum(sections) == 0:
        raise ValueError(f"sections must be non-negative pair counts, not all zero: {sections}")
    d = 2 * sum(sections)
    head_dim = d if head_dim is None else head_dim
    if head_dim < d:
        raise ValueError(f"sections {sections} need head_dim >= {d}, got {head_dim}")
    i, j = pair_indices(d, layout)
    if interleaved:
        n = len(sections)
        axis = np.zeros(d // 2, dtype=np.int64)
        for k in range(1, n):
            axis[k : n * sections[k] : n] = k
    else:
        axis = np.repeat(np.arange(len(sections)), sections)
    return PairRotation(
        head_dim,
        len(sections),
        tuple(i.tolist()),
        tuple(j.tolist()),
        tuple(axis.tolist()),
        tuple(inv_freq(d, base).tolist()),
        f"M-RoPE sections {sections}{', interleaved' if interleaved else ''}, {layout}",
    )


# --- any convention, as a list of pairs ------------------------------------------------


def from_table(table: dict, where: str = "the pair table") -> PairRotation:
    """A PairRotation from its JSON form (``--pair-table``): ``{"heads": null | H,
    "head_dim": D, "n_axes": N, "pairs": [[first, second, axis, theta, phase], ...]}``; pair
    (first, second) turns by theta x_axis + phase (phase optional: 0), features in no pair
    pass through. ``heads: H``: the indices run over the H * D features of a token's H heads
    together (a rotation applied before the head split), and a target is handed exactly H
    heads. ValueError naming what is wrong."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a JSON object with head_dim, n_axes and pairs")
    unknown = set(table) - {"heads", "head_dim", "n_axes", "pairs", "description"}
    if unknown:
        raise ValueError(
            f"{where}: unknown keys {sorted(unknown)} (known: heads, head_dim, n_axes, pairs, description)"
        )
    try:
        heads = table.get("heads")
        heads = None if heads is None else int(heads)
        head_dim, n_axes = int(table["head_dim"]), int(table.get("n_axes", 1))
        rows = [list(row) for row in table["pairs"]]
    except KeyError as exc:
        raise ValueError(f"{where}: missing {exc.args[0]!r}") from None
    except (TypeError, ValueError):
        raise ValueError(f"{where}: heads, head_dim and n_axes must be integers and pairs a list of lists") from None
    if heads is not None and heads < 1:
        raise ValueError(f"{where}: heads must be >= 1 or null, got {heads}")
    if head_dim < 2 or n_axes < 1:
        raise ValueError(f"{where}: head_dim must be >= 2 and n_axes >= 1, got {head_dim} and {n_axes}")
    bad = [k for k, row in enumerate(rows) if len(row) not in (4, 5)]
    if bad or not rows:
        raise ValueError(
            f"{where}: each pair is [first, second, axis, theta] or [first, second, axis, theta, phase]"
            + (f" (pair {bad[0]} has {len(rows[bad[0]])} entries)" if bad else "; none given")
        )
    try:
        first = tuple(int(r[0]) for r in rows)
        second = tuple(int(r[1]) for r in rows)
        axis = tuple(int(r[2]) for r in rows)
        theta = tuple(float(r[3]) for r in rows)
        phase = tuple(float(r[4]) if len(r) == 5 else 0.0 for r in rows)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: first, second and axis must be integers, theta and phase numbers") from None
    if not all(np.isfinite(theta)) or not all(np.isfinite(phase)):
        raise ValueError(f"{where}: theta and phase must be finite")
    width = head_dim * (heads or 1)
    description = str(table.get("description") or f"pair table, {len(rows)} pairs over {n_axes} axes")
    try:
        return PairRotation(
            width, n_axes, first, second, axis, theta, description, phase=phase if any(phase) else (), heads=heads
        )
    except ValueError as exc:
        span = f" (indices into the {heads} x {head_dim} features of a token)" if heads else ""
        raise ValueError(f"{where}: {exc}{span}") from None


def to_table(conv: PairRotation) -> dict:
    """The JSON form of a rotation (``from_table``'s inverse; scale and offset folded into
    theta and phase)."""
    i, j, axis, _ = conv.arrays
    theta = np.asarray(conv.theta) * (np.asarray(conv.scale)[axis] if conv.scale else 1.0)
    phase = np.asarray(conv.phase or (0.0,) * len(i)) + (
        np.asarray(conv.theta) * np.asarray(conv.offset)[axis] if conv.offset else 0.0
    )
    heads = conv.heads
    return {
        "heads": heads,
        "head_dim": conv.head_dim // (heads or 1),
        "n_axes": conv.n_axes,
        "description": conv.description,
        "pairs": [[int(a), int(b), int(k), float(t), float(p)] for a, b, k, t, p in zip(i, j, axis, theta, phase)],
    }


# --- the general case: expm of a sum of generators ---------------------------------


def validate_generators(generators, *, atol: float = 1e-12) -> list:
    """The seed's relativity constraints: every B_k skew-symmetric (B^T = -B) and every two
    commuting (B_j B_k = B_k B_j). Raises GeneratorError saying which fails."""
    gens = [np.asarray(b, dtype=np.float64) for b in generators]
    if not gens:
        raise GeneratorError("no generators given")
    d = gens[0].shape
    for k, b in enumerate(gens):
        if b.ndim != 2 or b.shape[0] != b.shape[1] or b.shape != d:
            raise GeneratorError(f"B_{k + 1} must be square and of the same size as B_1, got {b.shape}")
        scale = max(1.0, np.abs(b).max())
        if np.abs(b + b.T).max() > atol * scale:
            raise GeneratorError(
                f"B_{k + 1} is not skew-symmetric: max |B + B^T| = {np.abs(b + b.T).max():.3g}"
                " (relativity needs B^T = -B)"
            )
    for j in range(len(gens)):
        for k in range(j + 1, len(gens)):
            c = gens[j] @ gens[k] - gens[k] @ gens[j]
            scale = max(1.0, np.abs(gens[j]).max() * np.abs(gens[k]).max())
            if np.abs(c).max() > atol * scale:
                raise GeneratorError(
                    f"B_{j + 1} and B_{k + 1} do not commute: max |B_{j + 1} B_{k + 1} - "
                    f"B_{k + 1} B_{j + 1}| = {np.abs(c).max():.3g} (relativity needs "
                    "commuting generators)"
                )
    return gens


def rotation_expm(position, generators, *, validate: bool = True) -> np.ndarray:
    """R_x = expm(sum_k x_k B_k) for one position vector x. ``validate=False`` skips the
    checks (to exhibit what goes wrong with bad generators)."""
    gens = validate_generators(generators) if validate else [np.asarray(b, np.float64) for b in generators]
    position = np.asarray(position, dtype=np.float64).reshape(-1)
    if position.shape != (len(gens),):
        raise ValueError(f"position needs {len(gens)} coordinates, got {position.shape[0]}")
    import scipy.linalg  # here, not at import: a third of a second that only N-D checks need

    return scipy.linalg.expm(sum(x * b for x, b in zip(position, gens)))


def apply_sum_rotation(x, positions, *, layout: str = "interleaved", base: float = DEFAULT_BASE) -> np.ndarray:
    """The seed's eq. 14: every pair of a 1-D RoPE turned by (x_1 + .. + x_n) theta_i."""
    from ropecheck.reference.rope import apply_rope

    return apply_rope(x, np.asarray(positions).sum(-1), layout=layout, base=base)
