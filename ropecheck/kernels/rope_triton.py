"""The fused Triton RoPE kernel and its launcher.

One launch rotates q and k. A program owns BLOCK_T tokens of one sequence: it reads their
positions once, computes cos/sin once per (token, frequency) and reuses them for every
q head and every k head of those tokens.

Angles (error model). m * theta_i is formed and reduced modulo pi/2 in float64 with the
splits of ``angle_table`` (theta = hi + lo, pi/2 = C1 + C2 + C3, Cody-Waite):
    a = m * hi (exact for |m| < 2^27),  b = m * lo,  k = rint((a + b) * 2/pi),
    r = (((a - k C1) - k C2) + b) - k C3,   |r| <= pi/4.
For |m| < 2^27 every step is exact or rounds a quantity of size <= pi/4 (or far smaller),
so r is within a few 2^-53 of the exact reduced angle, whatever m: the float64 product
error 2^-53 |m theta| of a plain float64 angle (2^-29 rad at m = 2^24) does not even
arise. r is then rounded to float32 (<= 2^-24 pi/4 rad, the only angle error left) and
cos r, sin r are evaluated in float32 with Taylor polynomials on [-pi/4, pi/4]
(truncation < 1e-11, about 1 ulp of rounding) and mapped to the quadrant k mod 4. Past
2^27 the error grows as 2^-53 |m theta|, still below the float32 rounding of r up to
|m theta| ~ 2^29. Libraries that form m * theta in float32 err by 2^-24 |m theta| (about
6e-2 rad at m = 1e6).

Arithmetic is float32 (float64 for float64 tensors), each operation rounded once (no fused
multiply-add contraction), one rounding to the output dtype.
"""

from __future__ import annotations

import torch

from ropecheck.kernels.triton_env import import_triton

triton = import_triton()
tl = triton.language


@triton.jit
def _cos_sin(m, theta_ptr, consts_ptr, p, pmask, n_pairs):
    """cos and sin (float32, shape (BLOCK_T, BLOCK_P)) of m * theta_p, m int64 (BLOCK_T,)."""
    hi = tl.load(theta_ptr + p, mask=pmask, other=0.0)
    lo = tl.load(theta_ptr + n_pairs + p, mask=pmask, other=0.0)
    two_over_pi = tl.load(consts_ptr)
    c1 = tl.load(consts_ptr + 1)
    c2 = tl.load(consts_ptr + 2)
    c3 = tl.load(consts_ptr + 3)
    mf = m.to(tl.float64)[:, None]
    a = mf * hi[None, :]
    b = mf * lo[None, :]
    k = tl.floor((a + b) * two_over_pi + 0.5)
    r = ((((a - k * c1) - k * c2) + b) - k * c3).to(tl.float32)
    z = r * r
    sin_r = r + r * z * (-1.0 / 6 + z * (1.0 / 120 + z * (-1.0 / 5040 + z * (1.0 / 362880 + z * (-1.0 / 39916800)))))
    cos_r = (
        1.0
        - 0.5 * z
        + z * z * (1.0 / 24 + z * (-1.0 / 720 + z * (1.0 / 40320 + z * (-1.0 / 3628800 + z * (1.0 / 479001600)))))
    )
    quadrant = k.to(tl.int64) & 3
    odd = (quadrant & 1) == 1
    cos = tl.where(odd, sin_r, cos_r)
    sin = tl.where(odd, cos_r, sin_r)
    cos = tl.where((quadrant == 1) | (quadrant == 2), -cos, cos)
    sin = tl.where(quadrant >= 2, -sin, sin)
    return cos, sin


@triton.jit
def _rotate_heads(
    x_ptr,
    o_ptr,
    sxb,
    sxs,
    sxh,
    sxd,
    sob,
    sos,
    soh,
    sod,
    b,
    rows,
    tmask,
    n_heads,
    head_dim,
    n_pairs,
    cos,
    sin,
    p,
    pmask,
    INTERLEAVED: tl.constexpr,
    COPY_TAIL: tl.constexpr,
    F64: tl.constexpr,
    ALIGNED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
):
    """Rotate every head of the program's tokens: x (.., heads, head_dim) -> o. ALIGNED:
    the batch, token and head strides came divided by 16 (all are multiples of 16)."""
    if ALIGNED:  # multiplied back here, so that the compiler knows them to be multiples of 16
        sxb = sxb * 16
        sxs = sxs * 16
        sxh = sxh * 16
        sob = sob * 16
        sos = sos * 16
        soh = soh * 16
    rows = rows.to(tl.int64)
    tok_x = (b * sxb + rows * sxs)[:, None, None]
    tok_o = (b * sob + rows * sos)[:, None, None]
    if INTERLEAVED:
        d1 = 2 * p
        d2 = d1 + 1
    else:
        d1 = p
        d2 = p + n_pairs
    if F64:
        c = cos.to(tl.float64)[:, None, :]
        s = sin.to(tl.float64)[:, None, :]
    else:
        c = cos[:, None, :]
        s = sin[:, None, :]
    for h0 in range(0, n_heads, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
        mask = tmask[:, None, None] & (h < n_heads)[None, :, None] & pmask[None, None, :]
        x_row = x_ptr + tok_x + (h * sxh)[None, :, None]
        o_row = o_ptr + tok_o + (h * soh)[None, :, None]
        x1 = tl.load(x_row + (d1 * sxd)[None, None, :], mask=mask, other=0.0)
        x2 = tl.load(x_row + (d2 * sxd)[None, None, :], mask=mask, other=0.0)
        if F64:
            x1 = x1.to(tl.float64)
            x2 = x2.to(tl.float64)
        else:
            x1 = x1.to(tl.float32)
            x2 = x2.to(tl.float32)
        y1 = x1 * c - x2 * s
        y2 = x1 * s + x2 * c
        tl.store(o_row + (d1 * sod)[None, None, :], y1.to(o_ptr.dtype.element_ty), mask=mask)
        tl.store(o_row + (d2 * sod)[None, None, :], y2.to(o_ptr.dtype.element_ty), mask=mask)
        if COPY_TAIL:  # out of place with partial rotary: features 2 * n_pairs .. head_dim
            head_mask = tmask[:, None, None] & (h < n_heads)[None, :, None]
            for d0 in range(2 * n_pairs, head_dim, BLOCK_TAIL):
                d = (d0 + tl.arange(0, BLOCK_TAIL)).to(tl.int64)
                tail_mask = head_mask & (d < head_dim)[None, None, :]
                tail = tl.load(x_row + (d * sxd)[None, None, :], mask=tail_mask)
                tl.store(o_row + (d * sod)[None, None, :], tail, mask=tail_mask)


# Integers that need not specialize the compiled kernel. Triton compiles a kernel for each
# class of every integer argument (divisible by 16, equal to 1, other): left to specialize,
# the positions' offset, the sequence length and its block count, the head counts, the
# direction (sign) and the strides multiply the kernels a run compiles (a second or more
# each on a GPU) by every shape and layout a check draws. What the compiler needs of the
# strides to emit vector loads and stores, that they are multiples of 16, is one constexpr
# (ALIGNED: the launcher then passes them divided by 16); the feature strides (1: the
# features are contiguous), the pair count (where the second half starts) and the head
# size (the tail copy's mask) keep their classes.
_STRIDES = tuple(f"s{t}{d}" for t in ("q", "qo", "k", "ko") for d in ("b", "s", "h"))
DO_NOT_SPECIALIZE = ("offset", "seqlen", "blocks", "n_heads_q", "n_heads_k", "spb", "sps", "sign") + _STRIDES


@triton.jit(do_not_specialize=DO_NOT_SPECIALIZE)
def rope_kernel(
    q_ptr,
    k_ptr,
    qo_ptr,
    ko_ptr,
    pos_ptr,
    off_ptr,
    cu_ptr,
    theta_ptr,
    consts_ptr,
    offset,
    seqlen,
    blocks,
    n_heads_q,
    n_heads_k,
    head_dim,
    n_pairs,
    sqb,
    sqs,
    sqh,
    sqd,
    sqob,
    sqos,
    sqoh,
    sqod,
    skb,
    sks,
    skh,
    skd,
    skob,
    skos,
    skoh,
    skod,
    spb,
    sps,
    sign,
    INTERLEAVED: tl.constexpr,
    HAS_K: tl.constexpr,
    EXPLICIT_POSITIONS: tl.constexpr,
    OFFSET_TENSOR: tl.constexpr,
    VARLEN: tl.constexpr,
    COPY_TAIL: tl.constexpr,
    F64: tl.constexpr,
    ALIGNED: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
):
    """Grid (blocks x sequences,), ``blocks`` of BLOCK_T tokens of the longest sequence per
    sequence. Tensors are addressed as (batch, token, head, feature) with strides; packed
    varlen tensors have batch stride 0 and their sequences start at cu_seqlens[b]."""
    # one grid axis (CUDA allows 2^31 - 1 programs on x, 65535 on y and z): program
    # b * blocks + i owns token block i of sequence b
    program = tl.program_id(0).to(tl.int64)
    b = program // blocks
    local = (program % blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    if VARLEN:
        start = tl.load(cu_ptr + b).to(tl.int64)
        length = tl.load(cu_ptr + b + 1).to(tl.int64) - start
    else:
        start = 0
        length = seqlen
    tmask = local < length
    rows = start + local
    if EXPLICIT_POSITIONS:
        m = tl.load(pos_ptr + b * spb + rows * sps, mask=tmask, other=0).to(tl.int64)
    elif OFFSET_TENSOR:
        m = local + tl.load(off_ptr + b).to(tl.int64)
    else:
        m = local + offset
    p = tl.arange(0, BLOCK_P)
    pmask = p < n_pairs
    cos, sin = _cos_sin(m, theta_ptr, consts_ptr, p, pmask, n_pairs)
    sin = sin * sign  # 1: the rotation by m; -1: by -m (the backward pass)
    _rotate_heads(
        q_ptr,
        qo_ptr,
        sqb,
        sqs,
        sqh,
        sqd,
        sqob,
        sqos,
        sqoh,
        sqod,
        b,
        rows,
        tmask,
        n_heads_q,
        head_dim,
        n_pairs,
        cos,
        sin,
        p,
        pmask,
        INTERLEAVED,
        COPY_TAIL,
        F64,
        ALIGNED,
        BLOCK_HQ,
        BLOCK_TAIL,
    )
    if HAS_K:
        _rotate_heads(
            k_ptr,
            ko_ptr,
            skb,
            sks,
            skh,
            skd,
            skob,
            skos,
            skoh,
            skod,
            b,
            rows,
            tmask,
            n_heads_k,
            head_dim,
            n_pairs,
            cos,
            sin,
            p,
            pmask,
            INTERLEAVED,
            COPY_TAIL,
            F64,
            ALIGNED,
            BLOCK_HK,
            BLOCK_TAIL,
        )


# Elements of one (tokens x heads x pairs) tile: large enough to keep memory busy,
# small enough for registers.
TILE_PAIRS = 2048
HEAD_BLOCK = 8  # heads rotated together (a loop over blocks of them)
TAIL_BLOCK = 64  # features past the rotary ones copied together (partial rotary, out of place)


# No fused multiply-adds: each product and sum rounds once, as the error model above and the
# interpreter do, so that every specialization of the kernel computes the same bits (on an
# H100, with the compiler's default contraction, offsets and explicit positions differed
# in the last bit of 87 of 480 float32 outputs). The kernel is bound by memory, not FLOPs.
FP_FUSION = False


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def launch(
    q, k, q_out, k_out, *, positions, offsets, cu_seqlens, max_seqlen, theta, consts, n_pairs, interleaved, sign
):
    """Run the kernel. q, k, q_out, k_out: 4-D (batch, seq, heads, head_dim) views (packed
    varlen tensors as (1, total, heads, head_dim)); k and k_out may be None. positions:
    None or an integer tensor addressed as (batch, seq) (or (1, total)); offsets: int or
    integer tensor (batch,); cu_seqlens: None or (sequences + 1,) integer tensor."""
    batch, seqlen, n_heads_q, head_dim = q.shape
    n_heads_k = k.shape[2] if k is not None else 0
    varlen = cu_seqlens is not None
    sequences = cu_seqlens.numel() - 1 if varlen else batch
    longest = max_seqlen if varlen else seqlen
    block_p = _pow2(n_pairs)
    # heads in blocks of HEAD_BLOCK (or fewer where a pair block is wider), whatever the
    # head counts (masked past the last head): block sizes from the counts would make each
    # drawn count class a kernel of its own
    block_h = min(HEAD_BLOCK, max(1, TILE_PAIRS // block_p))
    # the tile's tokens, whatever the sequence's length (masked past its end): a block size
    # from the length would make every drawn length class a kernel of its own
    block_t = max(1, TILE_PAIRS // (block_h * block_p))
    copy_tail = head_dim > 2 * n_pairs and q_out.data_ptr() != q.data_ptr()
    dummy = theta  # any tensor for unused pointer arguments
    k_, ko_ = (k, k_out) if k is not None else (q, q_out)
    pos_strides = (0 if varlen else positions.stride(0), positions.stride(1)) if positions is not None else (0, 0)
    offset_tensor = isinstance(offsets, torch.Tensor)
    blocks = triton.cdiv(max(longest, 1), block_t)  # token blocks of the longest sequence
    grid = (blocks * sequences,)
    strides = [
        stride
        for t in (q, q_out, k_, ko_)
        for stride in (0 if varlen else t.stride(0), t.stride(1), t.stride(2), t.stride(3))
    ]
    aligned = all(stride % 16 == 0 for i, stride in enumerate(strides) if i % 4 != 3)
    if aligned:  # the batch, token and head strides as multiples of 16 (rope_kernel's ALIGNED)
        strides = [stride if i % 4 == 3 else stride // 16 for i, stride in enumerate(strides)]
    rope_kernel[grid](
        q,
        k_,
        q_out,
        ko_,
        positions if positions is not None else dummy,
        offsets if offset_tensor else dummy,
        cu_seqlens if varlen else dummy,
        theta,
        consts,
        0 if offset_tensor else int(offsets),
        seqlen,
        blocks,
        n_heads_q,
        n_heads_k,
        head_dim,
        n_pairs,
        *strides,
        *pos_strides,
        sign,
        INTERLEAVED=interleaved,
        HAS_K=k is not None,
        EXPLICIT_POSITIONS=positions is not None,
        OFFSET_TENSOR=offset_tensor,
        VARLEN=varlen,
        COPY_TAIL=copy_tail,
        F64=q.dtype == torch.float64,
        ALIGNED=aligned,
        BLOCK_T=block_t,
        BLOCK_HQ=block_h,
        BLOCK_HK=block_h,
        BLOCK_P=block_p,
        BLOCK_TAIL=TAIL_BLOCK if copy_tail else 1,
        enable_fp_fusion=FP_FUSION,
    )
