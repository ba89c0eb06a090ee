"""An RMSNorm before the rotation (a fused QK-norm + RoPE kernel: vLLM's ``fused_qk_norm_rope``,
SGLang's): what ropecheck draws for it, how the checks read its outputs, and what it may
add to a correct kernel's error.

The kernel turns each q (k) head u of a packed qkv projection into

    y = R_m (u * w / rms(u)),   rms(u) = sqrt(mean(u^2) + eps)   (over the head's D features)

with w the head's weights (``q_weight``, ``k_weight``, in the input's dtype). The checks
read the rotation of the *normalised* head: the canonical x a check hands the kernel is
z, the vector the rotation turns, and ropecheck gives the kernel the raw head

    u = z / w * s,  rounded once to the input's dtype,

(s a power of two per call: ``scale``), then reads back y * rms(u) / s (rms of the u the
kernel got, in float64): in exact arithmetic R_m (u * w) / s = R_m z. So every property of
the rotation holds on the normalised q and k, and f(z, 0) = z says the kernel did the norm
alone at position 0. The weights are drawn per call (``weights``), never ones: magnitudes
log-uniform in [1/4, 4] (a weight used for the wrong feature, head or tensor moves the
result by its ratio), one in eight negative; eps is one of ``EPS`` (what models ship).

The error a correct kernel may add, per unit of a pair's magnitude (``unit``), beyond the
rotation's own (``properties.tolerance``):
- the raw input's rounding to the input's dtype: z (1 + d), |d| <= u (its pair moves by
  at most u rho), and the canonical output's rounding once more: 2u;
- the norm: the sum of the D squares in float32 (any order: at most (D - 1) u32 relative),
  the mean, eps and the reciprocal square root (3 more), halved by the root; then the
  products with 1 / rms and w (2): (D - 1 + 3) / 2 + 2 = D / 2 + 3 roundings of u32.
An input element whose raw value underflows into the dtype's subnormals errs by half their
spacing, times |w| / s in z's units at most (``floor``).
A ``near eps`` call (``SCALES``) makes the raw heads so small that eps is a large part of
mean(u^2): a kernel that drops eps (or adds it twice) is off by far more than this.
"""

from __future__ import annotations

import numpy as np

from ropecheck.properties.core.dtypes import SUBNORMAL_SPACING, UNIT_ROUNDOFF

U32 = UNIT_ROUNDOFF["float32"]
WEIGHT_RANGE = (0.25, 4.0)  # |w|: log-uniform between these
NEGATIVE_WEIGHTS = 1 / 8  # the share of negative weights
EPS = (1e-6, 1e-5)  # eps of the models that ship a QK norm (Qwen3: 1e-6; others 1e-5)
# the scale s of a call's raw heads, by its "qkv values" class: a model's activations, or
# heads whose mean square is near eps (float16 cannot hold 2^-10 z / w: its subnormals
# start at 6e-5, so its near-eps heads are 2^-6 z / w with eps 1e-5)
SCALES = {"model scale": 8.0, "near eps": 2.0**-10}
FLOAT16_NEAR_EPS = 2.0**-6
# a probe, not a class its callers pass (vLLM's and SGLang's kernels refuse a non-contiguous
# qkv): qkv a view of a wider buffer, each row followed by ROW_PAD features of something else
STRIDED_QKV = ("qkv rows", "row-strided")
ROW_PAD = 16


def scale(values_class: str, dtype: str) -> float:
    """The power of two s of a call's raw heads u = z / w * s."""
    if values_class == "near eps" and dtype == "float16":
        return FLOAT16_NEAR_EPS
    return SCALES.get(values_class, SCALES["model scale"])


def epsilon(values_class: str, seed: int) -> float:
    """The eps of a call: a near-eps call takes the larger one (eps matters most there)."""
    return EPS[-1] if values_class == "near eps" else EPS[seed % len(EPS)]


def weights(rng: np.random.Generator, head_dim: int) -> np.ndarray:
    """float64 (head_dim,) RMSNorm weights: |w| log-uniform in WEIGHT_RANGE, some negative."""
    low, high = np.log(WEIGHT_RANGE[0]), np.log(WEIGHT_RANGE[1])
    w = np.exp(rng.uniform(low, high, head_dim))
    return np.where(rng.random(head_dim) < NEGATIVE_WEIGHTS, -w, w)


def rms(u: np.ndarray, eps: float) -> np.ndarray:
    """sqrt(mean(u^2) + eps) over the last axis, float64, keepdims."""
    u = np.asarray(u, dtype=np.float64)
    return np.sqrt(np.mean(u * u, axis=-1, keepdims=True) + eps)


def unit(dtype: str, head_dim: int) -> float:
    """What a norm before the rotation may add to a correct kernel's error, per unit of a
    pair's magnitude: the two roundings of the canonical view, the norm's D / 2 + 3."""
    return 2.0 * UNIT_ROUNDOFF[dtype] + (head_dim / 2.0 + 3.0) * U32


def floor(dtype: str) -> float:
    """The absolute error a raw element in the dtype's subnormals adds, in z's units (at
    the smallest scale a call in the dtype takes)."""
    return 0.5 * SUBNORMAL_SPACING[dtype] * WEIGHT_RANGE[1] / scale("near eps", dtype)
