"""ropecheck's table-fed Triton RoPE in the serving engines' signature (vLLM's
``ops.rotary_embedding``, FlashInfer's ``apply_rope_with_cos_sin_cache_inplace``):

    rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)

positions (T,) integer; query (T, Hq * head_size) or (T, Hq, head_size), any token and
head strides (a slice of a fused qkv projection, MLA's q_pe); key likewise, or None;
cos_sin_cache (P, rotary_dim), rows ``cat(cos, sin)`` indexed by position, in any float
dtype (the query's for vLLM, float32 for FlashInfer). The first rotary_dim features of
every head are rotated in place (is_neox: pairs (i, i + r/2), else (2i, 2i + 1)); the
features past rotary_dim are not touched.

One program owns BLOCK_T tokens: it reads their positions and cache rows once and rotates
every head of q, then of k, with them. Arithmetic in float32 (float64 for float64 tensors),
one rounding to the tensor's dtype: the error is the cache's rounding plus the arithmetic
(``properties/tolerance.py``, table-fed interfaces).
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from ropecheck.kernels.triton_env import import_triton

triton = import_triton()
tl = triton.language

# elements of one (tokens x heads x pairs) tile: registers on a GPU; under the Triton
# interpreter (no GPU) each program is numpy work with a fixed cost, so few large tiles
TILE = 4096
INTERPRETED_TILE = 2**18


def _tile() -> int:
    return INTERPRETED_TILE if os.environ.get("TRITON_INTERPRET") == "1" else TILE


@triton.jit
def cache_rope_kernel(
    pos_ptr,
    x_ptr,
    cache_ptr,
    n_tokens,
    n_heads,
    n_pairs,
    spt,
    sxt,
    sxh,
    sxd,
    sct,
    scd,
    NEOX: tl.constexpr,
    F64: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < n_tokens
    m = tl.load(pos_ptr + t * spt, mask=tmask, other=0).to(tl.int64)
    p = tl.arange(0, BLOCK_P)
    pmask = p < n_pairs
    row = cache_ptr + m[:, None] * sct
    tp = tmask[:, None] & pmask[None, :]
    cos = tl.load(row + p[None, :] * scd, mask=tp, other=0.0)
    sin = tl.load(row + (n_pairs + p[None, :]) * scd, mask=tp, other=0.0)
    if F64:
        cos = cos.to(tl.float64)
        sin = sin.to(tl.float64)
    else:
        cos = cos.to(tl.float32)
        sin = sin.to(tl.float32)
    if NEOX:
        i = p
        j = p + n_pairs
    else:
        i = 2 * p
        j = 2 * p + 1
    for h0 in range(0, n_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        mask = tmask[:, None, None] & (h < n_heads)[None, :, None] & pmask[None, None, :]
        base = x_ptr + t[:, None, None] * sxt + h[None, :, None] * sxh
        a_ptr = base + i[None, None, :] * sxd
        b_ptr = base + j[None, None, :] * sxd
        a = tl.load(a_ptr, mask=mask, other=0.0)
        b = tl.load(b_ptr, mask=mask, other=0.0)
        if F64:
            af = a.to(tl.float64)
            bf = b.to(tl.float64)
        else:
            af = a.to(tl.float32)
            bf = b.to(tl.float32)
        c = cos[:, None, :]
        s = sin[:, None, :]
        tl.store(a_ptr, (af * c - bf * s).to(a.dtype), mask=mask)
        tl.store(b_ptr, (bf * c + af * s).to(a.dtype), mask=mask)


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _heads(t: torch.Tensor, head_size: int) -> torch.Tensor:
    """(T, H * D) or (T, H, D) as a (T, H, D) view with t's strides."""
    if t.dim() == 3:
        return t
    if t.dim() != 2 or t.shape[1] % head_size:
        raise ValueError(
            f"expected (tokens, heads * {head_size}) or (tokens, heads, {head_size}), got {tuple(t.shape)}"
        )
    return t.unflatten(-1, (-1, head_size))


def _rotate(positions: torch.Tensor, t: torch.Tensor, head_size: int, cache: torch.Tensor, is_neox: bool) -> None:
    v = _heads(t, head_size)
    tokens, heads, _ = v.shape
    if tokens == 0 or heads == 0:
        return
    n_pairs = cache.shape[1] // 2
    block_p = _pow2(n_pairs)
    tile = _tile()
    block_h = min(_pow2(heads), max(1, tile // block_p))
    block_t = min(_pow2(tokens), max(1, tile // (block_h * block_p)))
    cache_rope_kernel[(triton.cdiv(tokens, block_t),)](
        positions,
        v,
        cache,
        tokens,
        heads,
        n_pairs,
        positions.stride(0),
        *v.stride(),
        *cache.stride(),
        NEOX=bool(is_neox),
        F64=v.dtype == torch.float64,
        BLOCK_T=block_t,
        BLOCK_H=block_h,
        BLOCK_P=block_p,
    )


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    """Rotate query and key (None: query only) in place by the cache rows of ``positions``."""
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] % 2 or cos_sin_cache.shape[1] > head_size:
        raise ValueError(
            f"cos_sin_cache must be (positions, rotary_dim <= {head_size}), got {tuple(cos_sin_cache.shape)}"
        )
    for t in (query, key):
        if t is not None:
            if t.shape[0] != positions.shape[0]:
                raise ValueError(f"{positions.shape[0]} positions for {t.shape[0]} tokens")
            _rotate(positions, t, head_size, cos_sin_cache, is_neox)
