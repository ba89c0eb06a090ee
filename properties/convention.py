"""Conventions: what a target computes, as the float64 reference and the error model read
it. ``Convention`` for 1-D RoPE (pairing layout, base, rotary dimension, position
scaling) and ``XposConvention`` for xPos; the N-D ones are ``reference.nd.PairRotation``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

import ropecheck.reference as reference
from ropecheck.reference.relatives import XPOS_GAMMA, XPOS_SCALE_BASE, apply_xpos
from ropecheck.reference.rope import DEFAULT_BASE, check_layout
from ropecheck.reference.scaling import Scaling


@dataclass(frozen=True)
class Convention:
    """What a target computes: pairing layout, base, rotary dimension (None: head_dim),
    position scaling (``reference.scaling``; none by default) and the rotated fraction p
    (p-RoPE: of the r/2 pairs only the first floor(p r / 2) turn, theta_i = base^(-2i/r),
    the rest have frequency zero; ``reference.rope.rotated_pairs``; 1 by default: all turn).

    A scaling may multiply the rotated features by an attention factor (the *amplitude*
    A: f(x, m) = A R_m x on the rotated block) and, when ``dynamic``, take its frequencies
    from the call's sequence length, largest position + 1 (HF transformers' rule)."""

    layout: str
    base: float = reference.DEFAULT_BASE
    rotary_dim: Optional[int] = None
    scaling: Scaling = Scaling()
    rotated_fraction: float = 1.0

    def __post_init__(self):
        reference.check_layout(self.layout)
        if not (self.base > 1.0 and math.isfinite(self.base)):
            raise ValueError(f"base must be a finite number > 1, got {self.base}")
        if self.rotary_dim is not None:
            reference.check_rotary_dim(self.rotary_dim)
        reference.check_rotated_fraction(self.rotated_fraction)
        if self.rotated_fraction < 1.0 and self.amplitude != 1.0:
            raise ValueError(
                f"p-RoPE (rotated fraction {self.rotated_fraction:g}) with the {self.scaling.rope_type} scaling's "
                "attention factor: transformers' proportional RoPE has none, and ropecheck models none"
            )

    def rotary_dim_for(self, head_dim: int) -> int:
        return head_dim if self.rotary_dim is None else self.rotary_dim

    @staticmethod
    def seq_len(positions) -> Optional[int]:
        """The sequence length a dynamic scaling sees: largest position + 1."""
        positions = np.asarray(positions)
        return int(positions.max()) + 1 if positions.size else None

    @property
    def dynamic(self) -> bool:
        return self.scaling.dynamic

    @property
    def amplitude(self) -> float:
        return float(self.scaling.attention_factor())

    def theta(self, head_dim: int, positions=None, seq_len: Optional[int] = None) -> np.ndarray:
        """theta_i for the call at ``positions`` (they matter only to dynamic scalings;
        ``seq_len``: the whole call's, when ``positions`` are a chunk of it)."""
        if seq_len is None:
            seq_len = None if positions is None else self.seq_len(positions)
        r = self.rotary_dim_for(head_dim)
        return reference.zero_beyond(
            self.scaling.inv_freq(r, self.base, seq_len), reference.rotated_pairs(r, self.rotated_fraction)
        )

    def exponent_log_base(self, head_dim: int) -> np.ndarray:
        """e_i ln(base), e_i = 2i/r: what a float32 base^(-e_i) is perturbed by (tolerance)."""
        r = self.rotary_dim_for(head_dim)
        return np.arange(0, r, 2, dtype=np.float64) / r * math.log(self.base)

    def apply(self, x, positions, *, inverse: bool = False, seq_len: Optional[int] = None) -> np.ndarray:
        """The float64 rotation R_m x (``inverse``: R_m^T x) for x (any float array) at
        integer positions, *without* the amplitude: checks compare outputs divided by it.
        ``seq_len``: the whole call's, when x and positions are a chunk of it."""
        x = np.asarray(x, dtype=np.float64)
        theta = self.theta(x.shape[-1], positions, seq_len)
        positions = np.asarray(positions)
        return reference.apply_rope(
            x, -positions if inverse else positions, layout=self.layout, rotary_dim=self.rotary_dim, theta=theta
        )

    def unscale(self, y64: np.ndarray) -> np.ndarray:
        """Divide the rotated block of a float64 output by the amplitude (a copy)."""
        if self.amplitude == 1.0:
            return y64
        y64 = np.array(y64, dtype=np.float64)
        y64[..., : self.rotary_dim_for(y64.shape[-1])] /= self.amplitude
        return y64

    def flags(self) -> str:
        out = f"--layout {self.layout} --base {self.base:g}"
        out += f" --rotary-dim {self.rotary_dim}" if self.rotary_dim else ""
        out += f" --rotated-fraction {self.rotated_fraction!r}" if self.rotated_fraction < 1.0 else ""
        if self.scaling.rope_type != "default":
            out += f" --scaling '{self.scaling.flag()}'"
        return out


def scores(q, k) -> np.ndarray:
    """s[b, h, i, j] = q[b, i, h] . k[b, j, h] for (batch, seq, heads, head_dim) arrays."""
    return np.einsum("bihd,bjhd->bhij", q, k)


@dataclass(frozen=True)
class XposConvention:
    layout: str = "interleaved"
    base: float = DEFAULT_BASE
    gamma: float = XPOS_GAMMA
    scale_base: float = XPOS_SCALE_BASE

    def __post_init__(self):
        check_layout(self.layout)
        if not (self.base > 1 and self.scale_base > 0 and self.gamma > 0):
            raise ValueError(f"xPos needs base > 1, scale_base > 0, gamma > 0; got {self}")

    @property
    def description(self) -> str:
        return f"xPos {self.layout}, base {self.base:g}, scale_base {self.scale_base:g}, gamma {self.gamma:g}"

    def scores(self, q64, k64, positions) -> np.ndarray:
        """Reference scores (batch, heads, query, key) in float64; k64 has q64's heads (``xpos_checks.split_qk``)."""
        kw: dict = dict(layout=self.layout, base=self.base, gamma=self.gamma, scale_base=self.scale_base)
        return scores(apply_xpos(q64, positions, role="query", **kw), apply_xpos(k64, positions, role="key", **kw))

    def gradient_scores(self, gq64, gk64, positions) -> np.ndarray:
        """Reference dq[m] . dk[n] = sum_i zeta_i^((m-n)/s) [R_m^T gq]_i . [R_n^T gk]_i for the
        VJP at positions m, n: xPos with the roles swapped at -m, -n (the key role scales by
        zeta^(+m/s), R_{-m} = R_m^T)."""
        kw: dict = dict(layout=self.layout, base=self.base, gamma=self.gamma, scale_base=self.scale_base)
        negated = -np.asarray(positions)
        return scores(apply_xpos(gq64, negated, role="key", **kw), apply_xpos(gk64, negated, role="query", **kw))
