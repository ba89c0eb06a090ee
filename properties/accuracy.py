"""Accuracy against position: the error profile and the accuracy horizon.

One call at positions 0, 1, 2, 3, 2^k and 3 * 2^(k-1) up to 2^24 (the smallest head size
drawn, or the declared rotary dimension: the horizon is set by the theta_0 = 1 pair; one
model's head size in a one-model run, up to the positions its table holds). For
each position: the largest error in units of the full tolerance model and in units of the
*strict* bound (arithmetic only, no float32 angle allowance). The horizon is the largest
position up to which every probed position meets the strict bound: how far the target
keeps the accuracy of exact angles.
"""

from __future__ import annotations

import numpy as np
import torch

import ropecheck.reference as reference
from ropecheck.properties.core.contract import CallError
from ropecheck.properties.inputs.cases import Case, as_float64
from ropecheck.properties.inputs.strategies import FREE_HEAD_DIMS, MAX_POSITION, head_dim_choices, max_position_for

SWEEP_HEADS = 4


def sweep_positions(limit: int = MAX_POSITION) -> np.ndarray:
    points = {0, 1, 2, 3}
    for k in range(1, 25):
        points |= {2**k, 3 * 2 ** (k - 1)}
    return np.array(sorted(p for p in points if p <= limit), dtype=np.int64)


def _magnitudes(x64: np.ndarray, convention) -> np.ndarray:
    """Per element, the magnitude its error is relative to: the norm of its rotated pair
    (|x| for pass-through features); errors / this = relative error, what plots show."""
    i, j = reference.pair_indices(convention.rotary_dim_for(x64.shape[-1]), convention.layout)
    out = np.abs(x64).copy()
    rho = np.hypot(x64[..., i], x64[..., j])
    out[..., i], out[..., j] = rho, rho
    return np.maximum(out, np.finfo(np.float64).tiny)


def accuracy_sweep(ctx) -> dict:
    convention = ctx.convention
    if ctx.sizes.model:  # one model's head size and heads (a compiled model is handed no other)
        head_dim, heads = head_dim_choices(ctx.target.rotary_dim, ctx.sizes)[0], max(ctx.sizes.heads)
    else:  # a pooled run's too: one call, at the smallest head size, whose table budget reaches 2^24
        head_dim, heads = ctx.target.rotary_dim or FREE_HEAD_DIMS[0], SWEEP_HEADS
    positions = sweep_positions(min(max_position_for(head_dim), ctx.max_position))[None, :].copy()  # strides of its own
    case = Case(ctx.dtype, 1, positions.shape[1], heads, head_dim, tuple(map(tuple, positions.tolist())), seed=12345)
    x = case.tensor()
    rows = ctx.target.row_offsets  # per-row offsets only: one token per row
    try:
        y = as_float64(
            ctx.rope(x.transpose(0, 1), torch.from_numpy(positions.T))
            if rows
            else ctx.rope(x, torch.from_numpy(positions))
        )
    except CallError as exc:
        return {"error": str(exc)}
    if rows:
        y = y.transpose(1, 0, 2, 3)
    x64 = as_float64(x)
    diff = np.abs(ctx.unscale(y) - convention.apply(x64, positions))
    full = diff / ctx.model.element_bound(x64, positions, convention)
    strict = diff / ctx.model.element_bound(x64, positions, convention, strict=True)
    full_by_pos = full.max(axis=(0, 2, 3))
    strict_by_pos = strict.max(axis=(0, 2, 3))
    relative_by_pos = (diff / _magnitudes(x64, convention)).max(axis=(0, 2, 3))
    failing = np.nonzero(strict_by_pos > 1.0)[0]
    if failing.size == 0:
        horizon = int(positions[0, -1])
    elif failing[0] == 0:
        horizon = None
    else:
        horizon = int(positions[0, failing[0] - 1])
    return {
        "positions": positions[0].tolist(),
        "error": [float(v) for v in full_by_pos],
        "strict_error": [float(v) for v in strict_by_pos],
        "relative_error": [float(v) for v in relative_by_pos],
        "horizon": horizon,
        "max_error": float(full_by_pos.max()),
    }
