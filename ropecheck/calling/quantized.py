"""One canonical (q, k) call through an interface that quantizes its outputs to fp8
(FlashInfer's ``rope_quantize_fp8``; ``Preset.returns == "quantized"``), and its results
brought back to the canonical ``y``: the dequantized outputs.

The call: q and k (views of x, in the preset's (tokens, heads, head_dim) format) are
split at the rotary dimension into their rotated parts (``q_rope``, ``k_rope``) and the
features past it (``q_nope``, ``k_nope``), views all four; the call's choices name the fp8
format (``quantize_dtype``) and whether its scales saturate, and ``quant_scale_q`` and
``quant_scale_kv`` are chosen from q's and k's values (``properties.core.quantization``). The
kernel returns ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)``.

The interface's promises, each a finding that names the tensor (and the token, head and
feature at fault): four tensors of their inputs' shapes, in the requested fp8 dtype,
finite (past the format's maximum a value saturates); the no-position parts quantized
without rotation, ``q_nope_out = saturate(q_nope * quant_scale_q)`` in the format (k's with
``quant_scale_kv``), within one fp8 rounding of the product in float32 or the input's
dtype. Then y = out / scale in x's dtype, the rotated and the no-position features in
their canonical places; every property reads it under the quantized error model.
"""

from __future__ import annotations

import numpy as np
import torch

from ropecheck.calling.forms import ReturnedWrong, TargetCall, _kind
from ropecheck.properties.core.dtypes import UNIT_ROUNDOFF, dtype_name
from ropecheck.properties.core.quantization import FORMATS, SATURATING, Fp8Format, quantized, scales

OUTPUTS = ("q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out")


def _host64(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().to(torch.float64).numpy()


def _where(index, what: str) -> str:
    token, head, feature = (int(i) for i in index)
    return f"{what} at token {token}, head {head}, feature {feature}"


def _outputs(out, given: dict, fmt: Fp8Format) -> tuple:
    """The four returned tensors, after checking that each is a tensor of its input's
    shape and device in the requested fp8 dtype."""
    if not (isinstance(out, (tuple, list)) and len(out) == 4):
        raise ReturnedWrong("type", f"the target returned {_kind(out)}, expected ({', '.join(OUTPUTS)})")
    for name, t in zip(OUTPUTS, out):
        like = given[name.removesuffix("_out")]
        if not isinstance(t, torch.Tensor):
            raise ReturnedWrong("type", f"{name} is {type(t).__name__}, expected a torch.Tensor")
        if tuple(t.shape) != tuple(like.shape):
            raise ReturnedWrong("shape", f"{name} shape {tuple(t.shape)} differs from its input's {tuple(like.shape)}")
        if t.dtype != fmt.dtype:
            raise ReturnedWrong("dtype", f"{name} dtype {t.dtype}, requested quantize_dtype={fmt.dtype}")
        if t.device != like.device:
            raise ReturnedWrong("device", f"{name} on {t.device}, input on {like.device}")
    return tuple(out)


def _finite(name: str, values: np.ndarray, fmt: Fp8Format, saturating: bool) -> None:
    bad = np.argwhere(~np.isfinite(values))
    if bad.size:
        index = tuple(bad[0])
        past = (
            f": this call's scales put values past the format's maximum, which must saturate to +-{fmt.max:g}"
            if saturating
            else ""
        )
        raise ReturnedWrong("non-finite", f"{_where(index, name)} holds {values[index]} for finite input{past}")


def _nope_promise(name: str, out: np.ndarray, given: torch.Tensor, scale: float, fmt: Fp8Format, which: str):
    """``name`` (a no-position output) = saturate(input * scale) in the format, within one
    fp8 rounding of the product in float32 or the input's dtype."""
    compute_unit = max(UNIT_ROUNDOFF.get(dtype_name(given.dtype), 0.0), UNIT_ROUNDOFF["float32"])
    expected, bound = quantized(_host64(given), scale, fmt, compute_unit)
    ratio = np.abs(out - expected) / bound
    if ratio.size and float(ratio.max()) > 1.0:
        index = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        raise ReturnedWrong(
            "nope",
            f"{_where(index, name)}: got {out[index]:.6g}, expected saturate({name.removesuffix('_out')} * "
            f"{which} = {scale:.6g}) = {expected[index]:.6g} in {fmt.name} (allowed {bound[index]:.3g}; "
            f"{int(np.count_nonzero(ratio > 1.0))} of {ratio.size} values outside): the features past the rotary "
            "dimension come out scaled by their tensor's scale and quantized, not rotated",
        )


def stages(call, hq: int, q: torch.Tensor, k: torch.Tensor):
    """The staged call (``forms.drive``) through ``call``'s quantizing preset
    (``api_call._Call``) on q and k (canonical views of x): (canonical y, what the target
    returned)."""
    r = call.rotary_dim
    q_api, k_api = call.to_api(q), call.to_api(k)
    fmt = FORMATS[call.preset.interface.output_format(call.form.choices)]
    saturating = SATURATING in call.form.choices
    scale_q, scale_kv = scales(_host64(q_api), _host64(k_api), fmt, saturating)
    given = {
        "q_rope": q_api[..., :r],
        "k_rope": k_api[..., :r],
        "q_nope": q_api[..., r:],
        "k_nope": k_api[..., r:],
    }
    values = {"quantize_dtype": fmt.dtype, "quant_scale_q": scale_q, "quant_scale_kv": scale_kv}
    args, kwargs = call.arguments({**given, **values})
    out = yield TargetCall(args, kwargs)
    call._after()
    out = _outputs(out, given, fmt)
    host = {name: _host64(t) for name, t in zip(OUTPUTS, out)}
    for name in OUTPUTS:
        _finite(name, host[name], fmt, saturating)
    _nope_promise("q_nope_out", host["q_nope_out"], given["q_nope"], scale_q, fmt, "quant_scale_q")
    _nope_promise("k_nope_out", host["k_nope_out"], given["k_nope"], scale_kv, fmt, "quant_scale_kv")

    def dequantized(part: str, scale: float, like: torch.Tensor) -> torch.Tensor:
        rope, nope = (torch.from_numpy(host[f"{part}_{kind}_out"] / scale) for kind in ("rope", "nope"))
        whole = torch.cat((rope, nope), dim=-1).to(device=like.device, dtype=like.dtype)
        return call.from_api(whole, like)

    q_c = dequantized("q", scale_q, q)
    if hq == call.x.shape[2]:  # the smallest call: k is q's own copy, q's result is the call's
        return q_c, out
    return torch.cat((q_c, dequantized("k", scale_kv, k)), dim=2), out
