"""Kernels written to FlashInfer's ``rope_quantize_fp8`` signature (``--api
flashinfer-rope-fp8``, issue 26): a correct one beside the defects ropecheck must catch.
Plain torch, written from FlashInfer's documented semantics (the rotated q_rope and k_rope
and the unrotated q_nope and k_nope, each multiplied by its tensor's scale in float32 and
converted to fp8 with saturation), not copied from it.

    ropecheck check tests/fp8_kernels.py:fp8_correct --api flashinfer-rope-fp8 --layout half --rotary-dim 8
"""

from __future__ import annotations

import torch

MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def _rotate(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """v (T, H, r) rotated in float32 by cos/sin (T, r/2)."""
    half = cos.shape[-1]
    c, s = cos[:, None].float(), sin[:, None].float()
    v = v.float()
    if neox:
        x1, x2 = v[..., :half], v[..., half:]
    else:
        x1, x2 = v[..., 0::2], v[..., 1::2]
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    return torch.cat((o1, o2), -1) if neox else torch.stack((o1, o2), -1).flatten(-2)


def _to_fp8(v: torch.Tensor, dtype: torch.dtype, saturate: bool = True) -> torch.Tensor:
    """v (float32) in fp8, saturating past the format's maximum as __NV_SATFINITE does; with
    ``saturate`` off, as a conversion without it: NaN for e4m3fn (it has no inf), inf for e5m2."""
    top = MAX[dtype]
    if saturate:
        return v.clamp(-top, top).to(dtype)
    overflow = v.abs() > top * (1.0 + 2.0**-5)  # past what rounds to the maximum
    past = torch.full_like(v, float("nan")) if dtype == torch.float8_e4m3fn else v.sign() * float("inf")
    return torch.where(overflow, past, v).to(dtype)


def _rope_fp8(
    q_rope,
    k_rope,
    q_nope,
    k_nope,
    cos_sin_cache,
    pos_ids,
    is_neox=True,
    quantize_dtype=None,
    quant_scale_q=1.0,
    quant_scale_kv=1.0,
    scale_twice=False,
    q_scale_for_k=False,
    rotate_nope=False,
    nope_unscaled=False,
    saturate=True,
    out_dtype: object = "",
    in_input_dtype=False,
):
    """The four fp8 outputs, computed in float32 (``in_input_dtype``: the rotation rounded
    to the input's dtype and the products in it, as FlashInfer's own reference does), with
    the defects asked for."""
    dtype = quantize_dtype or torch.float8_e4m3fn
    half = cos_sin_cache.shape[1] // 2
    rows = cos_sin_cache[pos_ids.long()]
    cos, sin = rows[:, :half], rows[:, half:]
    scale_kv = quant_scale_q if q_scale_for_k else quant_scale_kv

    def scaled(v, given, scale):
        return (v.to(given.dtype) * scale).float() if in_input_dtype else v * scale

    def rope(v, scale):
        out = scaled(_rotate(v, cos, sin, is_neox), v, scale)
        return out * scale if scale_twice else out

    def nope(v, scale):
        given, v = v, v.float()
        if rotate_nope and v.shape[-1] >= 2 * half:  # the cos/sin of the rotated part applied here too
            v = torch.cat((_rotate(v[..., : 2 * half], cos, sin, is_neox), v[..., 2 * half :]), -1)
        return v if nope_unscaled else scaled(v, given, scale)

    outs = (rope(q_rope, quant_scale_q), rope(k_rope, scale_kv), nope(q_nope, quant_scale_q), nope(k_nope, scale_kv))
    if out_dtype == "input":
        return tuple(o.to(q_rope.dtype) for o in outs)
    return tuple(_to_fp8(o, out_dtype or dtype, saturate) for o in outs)


# fn(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True,
#    quantize_dtype=None, quant_scale_q=1.0, quant_scale_kv=1.0) -> 4 fp8 tensors


def _with(**defect):
    """A kernel of the interface's signature with one defect of ``_rope_fp8``."""

    def kernel(
        q_rope,
        k_rope,
        q_nope,
        k_nope,
        cos_sin_cache,
        pos_ids,
        is_neox=True,
        quantize_dtype=None,
        quant_scale_q=1.0,
        quant_scale_kv=1.0,
    ):
        return _rope_fp8(
            q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype, quant_scale_q,
            quant_scale_kv, **defect,
        )  # fmt: skip

    return kernel


fp8_correct = _with()
fp8_rounds_to_input_dtype = _with(in_input_dtype=True)  # correct too: FlashInfer's reference's roundings
fp8_scale_twice = _with(scale_twice=True)  # quant_scale applied twice to the rotated parts
fp8_q_scale_for_k = _with(q_scale_for_k=True)  # quant_scale_kv ignored: k scaled by quant_scale_q
fp8_nope_rotated = _with(rotate_nope=True)  # the nope parts rotated with the rope part's cos/sin
fp8_nope_unscaled = _with(nope_unscaled=True)  # the nope parts converted without their scale
fp8_no_saturation = _with(saturate=False)  # a conversion without __NV_SATFINITE
fp8_returns_input_dtype = _with(out_dtype="input")  # scaled, not converted to fp8
fp8_e4m3_always = _with(out_dtype=torch.float8_e4m3fn)  # quantize_dtype ignored


def fp8_rotates_in_place(
    q_rope,
    k_rope,
    q_nope,
    k_nope,
    cos_sin_cache,
    pos_ids,
    is_neox=True,
    quantize_dtype=None,
    quant_scale_q=1.0,
    quant_scale_kv=1.0,
):
    """Correct outputs, but q_rope overwritten with its rotation (the caller's q)."""
    outs = fp8_correct(
        q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype, quant_scale_q, quant_scale_kv
    )
    half = cos_sin_cache.shape[1] // 2
    rows = cos_sin_cache[pos_ids.long()]
    q_rope.copy_(_rotate(q_rope, rows[:, :half], rows[:, half:], is_neox))
    return outs
