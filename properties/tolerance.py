"""The tolerance model: how far from exact a correct RoPE kernel may be.

Errors are measured against the float64 reference, per rotated pair, in units of the
pair's magnitude rho = |(a, b)| (a rotation moves a pair along a circle of radius rho, so
every error of a correct kernel scales with rho). A correct kernel may differ from exact
by two independent effects:

1. Arithmetic, ``K_OPS * u`` per unit of rho, where u = max(u_out, u_fp32) is the unit
   roundoff of the compute dtype (the output dtype, but never finer than float32: a
   float64 kernel may still take cos/sin in float32). Derivation for
   y = a*c - b*s with c, s computed then rounded to the compute dtype (the HF way):
   cos and sin may each be off by 2 ulp (<= 4u relative; SLEEF u10 and glibc give 1 ulp),
   each product and the sum round once (u each):
       |dy| <= (|a||c| + |b||s|) (4u + u) + u |y| <= 5u rho + u rho = 6u rho,
   using |a||c| + |b||s| <= rho (Cauchy-Schwarz, c^2 + s^2 = 1). Hence K_OPS = 6.

2. The angle m * theta_i formed in float32 (what every library does). A wrong angle by
   dphi moves the pair by at most rho * |dphi|. Float32 sources, u32 = 2^-24:
     - theta_i = base^(-e_i), e_i = 2i/r: rounding e_i and ln(base) perturbs the exponent
       by 2 e_i ln(base) u32 relative;  pow/exp itself 2 ulp (4 u32);  the reciprocal u32;
     - the product m * theta_i rounds once: u32 (positions <= 2^24 are exact in float32).
   So |dphi_i| <= u32 |m| theta_i (2 e_i ln(base) + 6)  (ANGLE_CONST = 6).
   A position scaling (reference.scaling) spends a few more float32 operations on
   theta_i (a division by the factor, YaRN's ramp mix, ...): each adds one rounding, so
   the constant grows by the scaling's ``theta_ops``.
   Without a declared convention theta_i and e_i are unknown; since
   theta (2 e ln b + 6) = e^-t (2t + 6) <= 6 for t = e ln b >= 0, the generic bound is
   |dphi| <= 6 u32 |m|.

3. A table-fed interface (``interface.Table``: a cos_sin_cache, cos/sin tensors, angles)
   computes no angle: ropecheck makes its table from the float64 angles and rounds it to
   the table's dtype, unit roundoff u_T. Then
   - cos/sin tables: c_T = c (1 + d), |d| <= u_T (likewise s_T). A kernel may cast the
     table to its compute dtype (c' = c_T (1 + d'), |d'| <= u), each product and the
     difference round once:
         |dy| <= (|a||c| + |b||s|)(u_T + u + u) + u |y| <= rho (u_T + 3u),
     so K_OPS is replaced by TABLE_OPS = 3 and u_T is added, with no angle term at any m:
     the bound is tighter than a kernel computing its own float32 angles at every
     position past 0 (6u there). The pair norm |c_T, s_T| is within u_T of 1, so a pair's
     norm may change by u_T rho (``norm_bound``).
   - angle tables (TransformerEngine's freqs): the angle m theta_i rounds once to the
     table's dtype, |dphi_i| <= u_T |m| theta_i, and the kernel evaluates cos/sin of it as
     in 1. (K_OPS): the angle term 2. becomes u_T |m| theta_i, a sixth (or less) of the
     float32 allowance.

4. Outputs quantized to fp8 with a per-tensor scale s (``properties.core.quantization``; the
   checks read out / s in the input's dtype): after the rotation above, the product with
   s rounds once in the compute dtype (u), the fp8 conversion once (u8 = 2^-4 for e4m3,
   2^-3 for e5m2, relative, where the value is a normal fp8 number), and the division by
   s once more in the input's dtype (u): u8 + 2u per unit of rho is added to the
   arithmetic. Where the scaled value underflows into fp8's subnormals the error is half
   their spacing over s; ropecheck picks s so that this is at most u8 times the root mean
   square of the head vector (``quantization_floor``), and over a whole
   head vector of norm n it adds at most u8 n (sqrt(d) elements of u8 n / sqrt(d)).
   Saturation is no error: no drawn input reaches the format's maximum (the
   ``fp8-saturation`` property checks the values past it).

5. An RMSNorm before the rotation (a fused QK-norm + RoPE interface,
   ``properties.core.normalization``; the checks read the rotation of the normalised head):
   the raw head's rounding and the canonical view's, 2u, and the norm's float32 reduction
   over the head's D features and its scale, (D / 2 + 3) u32, per unit of rho, added to the
   arithmetic and to the pass-through features; a raw element in the dtype's subnormals
   adds half their spacing times |w| / s to the floor.

The full bound per element is rho * (K_OPS u + dphi_i) + K_OPS * subnormal_spacing (the
absolute floor for results that underflow), plus a quantized output's terms. Errors are
reported normalised by this bound: a value <= 1 passes. The *strict* bound drops the
angle term; the accuracy horizon is the largest position at which a target still meets
it.

Buggy kernels land far outside: angles or positions in bf16/fp16 err by ~2^-9 |m theta|
or more (2^15 times the float32 allowance); cos/sin stored in fp16 for fp32 input err by
~2^-11 rho at every position (300 x K_OPS u32); caches that wrap err by O(rho) on the
low-frequency pairs whose float32 allowance stays tiny even at large m.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ropecheck.properties.core import normalization
from ropecheck.properties.core.dtypes import SUBNORMAL_SPACING, UNIT_ROUNDOFF, canonical
from ropecheck.properties.core.quantization import FORMATS

U32 = UNIT_ROUNDOFF["float32"]
K_OPS = 6.0
ANGLE_CONST = 6.0
TABLE_OPS = 3.0  # a kernel fed cos/sin: the cast of the table, the products, the difference
TABLE_KINDS = ("cos-sin", "angles")


@dataclass(frozen=True)
class ErrorModel:
    """Error bounds for a target producing ``dtype`` outputs."""

    dtype: str
    extra_ops: int = 0  # roundings beyond the K_OPS derivation (an attention factor: 1)
    # a table-fed interface: its table's kind (TABLE_KINDS; "" for none) and dtype
    table_kind: str = ""
    table_dtype: str = ""
    quantized: str = ""  # the fp8 format its outputs are quantized to ("" none)
    norm_features: int = 0  # an RMSNorm before the rotation: the head size it reduces over (0 none)

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical(self.dtype))
        if self.table_kind and self.table_kind not in TABLE_KINDS:
            raise ValueError(f"unknown table kind {self.table_kind!r}; known: {', '.join(TABLE_KINDS)}")
        if self.quantized and self.quantized not in FORMATS:
            raise ValueError(f"unknown fp8 format {self.quantized!r}; known: {', '.join(FORMATS)}")
        if self.table_kind:
            object.__setattr__(self, "table_dtype", canonical(self.table_dtype or self.dtype))

    @property
    def ops(self) -> float:
        return (TABLE_OPS if self.table_kind == "cos-sin" else K_OPS) + self.extra_ops

    @property
    def table_unit(self) -> float:
        """u_T: the unit roundoff of the table a table-fed kernel is given (0: none)."""
        return UNIT_ROUNDOFF[self.table_dtype] if self.table_kind else 0.0

    @property
    def values_unit(self) -> float:
        """Relative error of the cos/sin values themselves: a cos/sin table's rounding."""
        return self.table_unit if self.table_kind == "cos-sin" else 0.0

    @property
    def unit(self) -> float:
        """Unit roundoff of the compute dtype: the output dtype, never finer than float32."""
        return max(UNIT_ROUNDOFF[self.dtype], U32)

    @property
    def quantization_unit(self) -> float:
        """Relative error a quantized output adds to each element: the product with the
        scale, the fp8 rounding, the dequantization (0: not quantized)."""
        return FORMATS[self.quantized].unit + 2.0 * self.unit if self.quantized else 0.0

    @property
    def norm_unit(self) -> float:
        """Relative error an RMSNorm before the rotation adds (0: none)."""
        return normalization.unit(self.dtype, self.norm_features) if self.norm_features else 0.0

    @property
    def quantization_floor_unit(self) -> float:
        """The quantization floor per unit of a head vector's root mean square (per
        element) or norm (per head vector): u8 (0: not quantized)."""
        return FORMATS[self.quantized].unit if self.quantized else 0.0

    @property
    def output_unit(self) -> float:
        """Relative error of a feature that passes through: one rounding to the output
        dtype, or a quantized output's product, fp8 rounding and dequantization."""
        return (self.quantization_unit or UNIT_ROUNDOFF[self.dtype]) + self.norm_unit

    @property
    def floor(self) -> float:
        """Absolute error allowed for results that underflow into subnormals (and raw
        elements of a norm's input that do)."""
        norm = normalization.floor(self.dtype) if self.norm_features else 0.0
        return self.ops * SUBNORMAL_SPACING[self.dtype] + norm

    def quantization_floor(self, x64) -> np.ndarray:
        """A quantized output's floor per element of head vectors x64 (..., head_dim): u8
        times each head vector's root mean square, shape (..., 1) (0: not quantized)."""
        if not self.quantized:
            return np.zeros(np.shape(x64)[:-1] + (1,))
        rms = np.sqrt(np.mean(np.square(np.asarray(x64, dtype=np.float64)), axis=-1, keepdims=True))
        return self.quantization_floor_unit * rms

    def element_floor(self, x64) -> np.ndarray:
        """The absolute error allowed per element of head vectors x64 whatever their
        values: ``floor`` plus the quantization floor."""
        return self.floor + self.quantization_floor(x64)

    def pass_through_bound(self, x64) -> np.ndarray:
        """Allowed |y - x| per element of head vectors x64 (..., head_dim) for features
        that pass through unrotated: one output rounding (or quantization) and the floor."""
        x64 = np.asarray(x64, dtype=np.float64)
        return np.abs(x64) * self.output_unit + self.element_floor(x64)

    # --- angle error of a float32 angle computation -------------------------------
    @staticmethod
    def angle_error(positions, theta=None, e_ln_base=None, theta_ops: int = 0, gain=1.0) -> np.ndarray:
        """Allowed |dphi|: per frequency, shape (*positions.shape, r/2), when the
        frequencies theta are known; generic, shape positions.shape, otherwise.
        ``e_ln_base`` is e_i ln(base) (default -ln(theta_i), exact without scaling).
        ``gain`` (per frequency) is how a scaling amplifies a relative error of the unscaled
        theta_i (``Scaling.theta_gain``: Llama 3's band mixes theta with a weight that is
        itself linear in theta); its own weight's roundings add 4 (gain - 1)."""
        m = np.abs(np.asarray(positions, dtype=np.float64))
        if theta is None:
            return ANGLE_CONST * U32 * m
        theta = np.asarray(theta, dtype=np.float64)
        if e_ln_base is None:  # theta_i = base^(-e_i)  =>  e_i ln(base) = -ln(theta_i)
            e_ln_base = -np.log(theta)
        gain = np.asarray(gain, dtype=np.float64)
        per_freq = theta * (gain * (2.0 * np.maximum(e_ln_base, 0.0) + ANGLE_CONST) + 4.0 * (gain - 1.0) + theta_ops)
        return U32 * m[..., None] * per_freq

    def allowed_angle_error(self, positions, theta=None, **float32_terms) -> np.ndarray:
        """The angle error this model allows: the float32 one (``angle_error``) for a kernel
        that forms its own angles; none for one fed cos/sin; the table's rounding of the
        angle, u_T |m| theta_i (generic: u_T |m|, theta_i <= 1), for one fed angles."""
        if not self.table_kind:
            return self.angle_error(positions, theta, **float32_terms)
        m = np.abs(np.asarray(positions, dtype=np.float64))
        if self.table_kind == "cos-sin":
            return np.zeros(m.shape + (() if theta is None else (len(theta),)))
        if theta is None:
            return self.table_unit * m
        return self.table_unit * m[..., None] * np.asarray(theta, dtype=np.float64)

    def declared_angle_error(self, positions, convention, head_dim: int, seq_len=None) -> np.ndarray:
        """The allowed angle error for the frequencies a Convention declares at this head
        size (a float32 angle: its scaling's extra operations and gain included): shape
        (*positions.shape, r/2). ``seq_len``: the whole call's, when ``positions`` are a
        chunk of it."""
        scaling = convention.scaling
        theta = convention.theta(head_dim, positions, seq_len)
        if self.table_kind:
            return self.allowed_angle_error(positions, theta)
        return self.angle_error(
            positions,
            theta,
            convention.exponent_log_base(head_dim),
            scaling.theta_ops,
            scaling.theta_gain(convention.rotary_dim_for(head_dim), convention.base),
        )

    # --- bounds ------------------------------------------------------------------
    def relative_bound(self, angle_error, strict: bool = False):
        """Allowed error per unit of rho: K_OPS u (TABLE_OPS u + u_T fed cos/sin) (+ dphi
        unless strict), plus a quantized output's u8 + 2u and a norm's terms."""
        ops = self.ops * self.unit + self.values_unit + self.quantization_unit + self.norm_unit
        return ops + (0.0 if strict else angle_error)

    def pair_bound(self, pair_norms, angle_error, strict: bool = False) -> np.ndarray:
        """Allowed absolute error of each element of a rotated pair."""
        return pair_norms * self.relative_bound(angle_error, strict) + self.floor

    def vector_unit_bound(self, positions, angle_error=None) -> np.ndarray:
        """Allowed error of a whole head vector per unit of its norm, shape
        (*positions.shape, 1), without knowing the pairing: each pair's error vector is at
        most sqrt(2) times the per-element bound, so sqrt(2) (K_OPS u + dphi) (plus a
        quantized output's floor, u8); dphi the generic allowance at ``positions``, or the
        largest of a declared rotation's pairs (``angle_error``, positions' shape)."""
        dphi = self.allowed_angle_error(positions) if angle_error is None else angle_error
        relative = self.relative_bound(dphi)[..., None]
        return math.sqrt(2.0) * relative + self.quantization_floor_unit

    def vector_bound(self, vector_norms, positions) -> np.ndarray:
        """Allowed Euclidean norm of the error of head vectors (batch, seq, heads)."""
        return vector_norms * self.vector_unit_bound(positions) + self.floor

    def norm_bound(self, vector_norms) -> np.ndarray:
        """Allowed change of a head vector's norm: rotations by a wrong angle keep norms,
        so only the arithmetic term counts (and a cos/sin table's rounding, and a quantized
        output's terms)."""
        arithmetic = math.sqrt(2.0) * self.relative_bound(0.0, strict=True) + self.quantization_floor_unit
        return vector_norms * arithmetic + self.floor

    def element_bound(self, x64, positions, convention, strict: bool = False, seq_len=None) -> np.ndarray:
        """Allowed |y - y_ref| per element of x64 (batch, seq, heads, head_dim) under a
        declared convention: the pair bound with the per-frequency angle allowance on
        rotated features; one output rounding on pass-through features and on the pairs of
        frequency zero (p-RoPE's unturned pairs: cos 1 and sin 0 are exact, so such a pair
        comes back as it went in). ``seq_len``: the whole call's, when x64 and positions are
        a chunk of it."""
        from ropecheck.reference import pair_slices

        x64 = np.asarray(x64, dtype=np.float64)
        head_dim = x64.shape[-1]
        i, j = pair_slices(convention.rotary_dim_for(head_dim), convention.layout)
        rho = np.hypot(x64[..., i], x64[..., j])
        dphi = self.declared_angle_error(positions, convention, head_dim, seq_len)[:, :, None, :]
        pair = self.pair_bound(rho, dphi, strict)
        bound = np.abs(x64) * self.output_unit + self.floor
        still = convention.theta(head_dim, positions, seq_len) == 0.0
        bound[..., i] = np.where(still, bound[..., i], pair)
        bound[..., j] = np.where(still, bound[..., j], pair)
        return bound + self.quantization_floor(x64)

    @staticmethod
    def rotation_angle_error(conv, positions: np.ndarray) -> np.ndarray:
        """dphi_p of every pair of an N-D rotation at ``positions`` (..., n_axes): shape
        (..., pairs); see ``rotation_bound``."""
        _, _, _, theta = conv.arrays
        m = conv.angle_magnitudes(positions)
        e_ln_base = np.maximum(-np.log(np.where(theta > 0, theta, 1.0)), 0.0)  # a zero frequency: none
        ops = ANGLE_CONST + (2.0 if conv.affine else 0.0)
        dphi = U32 * m * theta * (2.0 * e_ln_base + ops)
        if conv.phase:
            dphi = dphi + 2.0 * U32 * np.abs(np.asarray(conv.phase, dtype=np.float64))
        return dphi

    def rotation_bound(self, conv, x64: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """``element_bound`` for an N-D rotation (``reference.nd.PairRotation``): pair p,
        driven by axis k, may err by rho (K_OPS u + dphi_p) + floor, dphi_p = u32 |x_k|
        theta_p (2 e_p ln b + 6) with e_p ln b = -ln theta_p; features in no pair by one
        output rounding. Coordinates that are scaled or offset (S_k x_k + O_k) count in
        units of |S_k x_k| + |O_k| with the product and sum's two roundings more; a phase
        adds its own rounding, 2 u32 |phase_p|."""
        i, j, _, _ = conv.arrays
        dphi = self.rotation_angle_error(conv, positions)[:, :, None, :]  # (b, s, 1, pairs)
        pair = self.pair_bound(conv.pair_norms(x64), dphi)
        bound = np.abs(x64) * self.output_unit + self.floor
        bound[..., i] = pair
        bound[..., j] = pair
        return bound
