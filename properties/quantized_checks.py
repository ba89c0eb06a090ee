"""The 1-D property only an interface that quantizes its outputs to fp8 has (``--api
flashinfer-rope-fp8``): ``properties/call_checks.py`` registers it in the 1-D family's
table (``QUANTIZED_CHECKS``).

- fp8-saturation: past the format's largest finite value M, an output saturates to +-M.
  No other check reaches that value (ropecheck's scales keep every drawn output below M /
  2, ``properties.core.quantization``); here the input is called in its own fp8 format
  with scales that saturate, each tensor scaled by 2 M / A (A its largest |value|), so that every
  element past A / 2 saturates, in q and in k. The dequantized output is compared with
  clip(A_m R_m x s, -M, M) / s (A_m the scaling's attention factor, the scales recomputed
  from the same values as ropecheck passed them) within the element bound of the error
  model: clamping is 1-Lipschitz, so it brings no correct output farther from its clamped
  reference than the bound allows. A kernel that converts without saturating returns inf
  (e5m2) or, on hardware that converts without ``__NV_SATFINITE``, NaN (e4m3fn has no
  inf): a non-finite output for finite input.
"""

from __future__ import annotations

import numpy as np
import torch

from ropecheck.properties.assertions import Tally
from ropecheck.properties.core.quantization import FORMATS, SATURATING, saturate, scales
from ropecheck.properties.inputs.cases import Case, as_float64
from ropecheck.properties.one_d import Context


def fp8_saturation(ctx: Context, case: Case) -> float:
    interface = ctx.target.interface
    assert interface is not None, "fp8-saturation needs an interface that quantizes (needs_quantized)"
    fmt = FORMATS[interface.output_format(case.choices)]
    p, x = case.positions_array(), case.tensor()
    saturating = case.with_choices(quantize_dtype=fmt.name, **dict([SATURATING]))
    y = ctx.rope(x, torch.from_numpy(np.ascontiguousarray(p)), case=saturating)
    x64, conv = as_float64(x), ctx.convention
    q, k = x64[:, :, : case.heads], x64[:, :, case.heads :]
    expected = conv.apply(x64, p, seq_len=conv.seq_len(p))
    expected[..., : conv.rotary_dim_for(case.head_dim)] *= ctx.amplitude
    saturated = 0
    for part, scale in zip((slice(0, case.heads), slice(case.heads, None)), scales(q, k, fmt, saturate=True)):
        saturated += int(np.count_nonzero(np.abs(expected[:, :, part]) * scale > fmt.max))
        expected[:, :, part] = saturate(expected[:, :, part] * scale, fmt) / scale
    bound = ctx.model.element_bound(x64, p, conv)
    tally = Tally().add(ctx.unscale(as_float64(y)), ctx.unscale(expected), bound)
    return tally.verdict(
        what=f"f(x, m) in {fmt.name} with scales that saturate {saturated} of {expected.size} values "
        f"(past +-{fmt.max:g}: they must hold it) against clip(R_m x * scale) / scale",
        positions=p,
    )


# name -> (the Property's fields, its check)
QUANTIZED_CHECKS = {
    "fp8-saturation": (
        {
            "formula": "out = saturate(f(x, m) * scale): past the fp8 format's maximum an output holds it",
            "needs_convention": True,
            "needs_table": True,
            "needs_quantized": True,
            "calls": ("qk",),
            "calls_why": "an interface that quantizes takes q and k",
        },
        fp8_saturation,
    ),
}
