"""RoPE targets for the GPU run (ci/gpu-run.sh), in the ``x`` call form rope(x, positions).

Two planted Triton kernels that are numerically right and memory-unsafe, for the
sanitizer step: every value they return is right (``ropecheck check`` passes them, on CPU
under the Triton interpreter and on a GPU), but on a GPU they touch memory outside the
tensors they were given, which only compute-sanitizer's memcheck reports:

- ``past_row_read``: the masked load of the second half of each head reads one element
  too many (``p <= n_pairs``): one element past the head's row. The extra element only
  feeds a lane whose result is never stored. On the last head of the last token of a
  contiguous input that element lies past the end of the allocation.
- ``past_head_store``: the store of the second half is masked by the power-of-two block
  instead of the number of pairs, so at a non-power-of-two head size (80: 40 pairs in a
  block of 64) it writes 24 elements past the head, into the next head's first
  features. The first half is stored after a barrier, so the next head's right values
  overwrite the stray ones; one program walks the tokens in order for the same reason.
  Past the last head of the last token the stray store lands past the output's
  allocation. Under the interpreter (CPU) the output gets slack after it, so that the
  stray store cannot corrupt the host heap; on CUDA the output is exactly its size.

Both are half layout, base 10000, full rotary (rotary dim = head_dim), angles m * theta_i
in float32 as the libraries form them, arithmetic in float32, any input strides, and
autograd (the backward pass is the same kernel rotating by -m).

    ropecheck check tests/gpu_kernels.py:past_row_read --layout half
    ropecheck check tests/gpu_kernels.py:past_head_store --layout half --device cuda --sanitize

``flashinfer_rope`` brings FlashInfer's ``apply_rope_pos_ids`` to the same call, for the
GPU run where its wheel could be brought (CUDA only; fp16 / bf16).

The file imports torch and ropecheck's Triton import only: ropecheck loads it in its
worker process.
"""

from __future__ import annotations

import torch

from ropecheck.kernels.triton_env import import_triton, interpreted

triton = import_triton()
tl = triton.language

BASE = 10000.0


def _inv_freq(head_dim: int, device) -> torch.Tensor:
    """theta_i = base^(-2i/d), computed in float64 and rounded to float32 (HF's table)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (BASE ** -exponent).to(torch.float32).to(device)


TILE = 2048  # elements of one (tokens x heads x pairs) tile


@triton.jit
def _rotate_tile(x_ptr, pos_ptr, inv_ptr, r, rows, seq, heads, n_pairs, sxb, sxs, sxh, sxd,
                 spb, sps, sign, p, h, X2_PAST_ROW: tl.constexpr):
    """(y1, y2) float32 of the tokens ``r`` (flat row indices b * seq + s), heads ``h`` and
    pairs ``p``; with X2_PAST_ROW the planted over-read."""
    tok = r < rows
    b = r // seq
    s = r % seq
    m = tl.load(pos_ptr + b * spb + s * sps, mask=tok, other=0).to(tl.float32)
    pairs = p < n_pairs
    inv = tl.load(inv_ptr + p, mask=pairs, other=0.0)
    angle = m[:, None] * inv[None, :]
    cos = tl.cos(angle)[:, None, :]
    sin = (tl.sin(angle) * sign)[:, None, :]
    x_row = x_ptr + (b * sxb + s * sxs)[:, None, None] + (h * sxh)[None, :, None]
    ok = tok[:, None, None] & (h < heads)[None, :, None]
    x1 = tl.load(x_row + (p * sxd)[None, None, :], mask=ok & pairs[None, None, :],
                 other=0.0).to(tl.float32)
    if X2_PAST_ROW:
        # PLANTED: "<=" reads one element past the head's row (feature 2 * n_pairs) in
        # lane p == n_pairs, whose result is never stored.
        x2_mask = ok & (p <= n_pairs)[None, None, :]
    else:
        x2_mask = ok & pairs[None, None, :]
    x2 = tl.load(x_row + ((p + n_pairs) * sxd)[None, None, :], mask=x2_mask, other=0.0).to(tl.float32)
    return x1 * cos - x2 * sin, x1 * sin + x2 * cos


@triton.jit
def _past_row_read_kernel(x_ptr, pos_ptr, inv_ptr, o_ptr, rows, seq, heads, n_pairs,
                          sxb, sxs, sxh, sxd, spb, sps, sign,
                          BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr):
    """A program rotates BLOCK_T tokens, every head. Output contiguous (batch, seq, heads, d)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    p = tl.arange(0, BLOCK_P)
    h = tl.arange(0, BLOCK_H).to(tl.int64)
    y1, y2 = _rotate_tile(x_ptr, pos_ptr, inv_ptr, r, rows, seq, heads, n_pairs, sxb, sxs, sxh,
                          sxd, spb, sps, sign, p, h, True)
    o_row = o_ptr + ((r[:, None] * heads + h[None, :]) * (2 * n_pairs))[:, :, None]
    store = (r < rows)[:, None, None] & (h < heads)[None, :, None] & (p < n_pairs)[None, None, :]
    tl.store(o_row + p[None, None, :], y1.to(o_ptr.dtype.element_ty), mask=store)
    tl.store(o_row + (p + n_pairs)[None, None, :], y2.to(o_ptr.dtype.element_ty), mask=store)


@triton.jit
def _past_head_store_kernel(x_ptr, pos_ptr, inv_ptr, o_ptr, rows, seq, heads, n_pairs,
                            sxb, sxs, sxh, sxd, spb, sps, sign,
                            BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr):
    """One program walks the tokens in order, BLOCK_T at a time (so that a stray store into
    the next token is overwritten later by the same program)."""
    p = tl.arange(0, BLOCK_P)
    h = tl.arange(0, BLOCK_H).to(tl.int64)
    for t0 in range(0, rows, BLOCK_T):
        r = t0 + tl.arange(0, BLOCK_T).to(tl.int64)
        y1, y2 = _rotate_tile(x_ptr, pos_ptr, inv_ptr, r, rows, seq, heads, n_pairs, sxb, sxs,
                              sxh, sxd, spb, sps, sign, p, h, False)
        o_row = o_ptr + ((r[:, None] * heads + h[None, :]) * (2 * n_pairs))[:, :, None]
        ok = (r < rows)[:, None, None] & (h < heads)[None, :, None]
        # PLANTED: masked by the block (p < BLOCK_P) instead of the pairs (p < n_pairs):
        # with n_pairs not a power of two, lanes p >= n_pairs store (zeros) past the head,
        # into the next head's first BLOCK_P - n_pairs features; past the output after
        # the last head of the last token.
        tl.store(o_row + (p + n_pairs)[None, None, :], y2.to(o_ptr.dtype.element_ty),
                 mask=ok & (p < BLOCK_P)[None, None, :])
        tl.debug_barrier()  # the stray stores land before the right ones below
        tl.store(o_row + p[None, None, :], y1.to(o_ptr.dtype.element_ty),
                 mask=ok & (p < n_pairs)[None, None, :])
        tl.debug_barrier()


def _launch(kernel_name: str, x: torch.Tensor, positions: torch.Tensor, sign: float,
            buffer: torch.Tensor = None) -> torch.Tensor:
    """Run a planted kernel; ``buffer`` (tests): the flat storage past_head_store writes
    its output at the start of, instead of a fresh one."""
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"x must be (batch, seq, heads, even head_dim), got {tuple(x.shape)}")
    if positions.shape != x.shape[:2]:
        raise ValueError(f"positions must be {tuple(x.shape[:2])}, got {tuple(positions.shape)}")
    batch, seq, heads, head_dim = x.shape
    n_pairs = head_dim // 2
    rows = batch * seq
    inv = _inv_freq(head_dim, x.device)
    block_h = triton.next_power_of_2(heads)
    # the over-reading kernel's block has room for one more pair (the planted off-by-one)
    block_p = triton.next_power_of_2(n_pairs + (kernel_name == "past_row_read"))
    block_t = min(triton.next_power_of_2(max(rows, 1)), max(1, TILE // (block_h * block_p)))
    args = (x, positions, inv)
    tail = (rows, seq, heads, n_pairs, *x.stride(), *positions.stride(), sign)
    blocks = dict(BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_P=block_p)
    if kernel_name == "past_row_read":
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if x.numel():
            _past_row_read_kernel[(triton.cdiv(rows, block_t),)](*args, out, *tail, **blocks)
        return out
    slack = block_p - n_pairs if interpreted() else 0  # see the module docstring
    flat = torch.empty(x.numel() + slack, dtype=x.dtype, device=x.device) if buffer is None else buffer
    out = flat[:x.numel()].view(x.shape)
    if x.numel():
        _past_head_store_kernel[(1,)](*args, out, *tail, **blocks)
    return out


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, positions, kernel_name):
        ctx.positions, ctx.kernel_name = positions, kernel_name
        return _launch(kernel_name, x, positions, 1.0)

    @staticmethod
    def backward(ctx, grad):
        """VJP of y = R_m x: R_m^T g = R_{-m} g, the same kernel with the sine negated."""
        return _launch(ctx.kernel_name, grad, ctx.positions, -1.0), None, None


def past_row_read(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Half-layout RoPE, numerically right; reads one element past each head's row."""
    return _Rope.apply(x, positions, "past_row_read")


def past_head_store(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Half-layout RoPE, numerically right; at a non-power-of-two head size it stores past
    each head into the next one (past the output after the last)."""
    return _Rope.apply(x, positions, "past_head_store")


def flashinfer_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """FlashInfer's ``apply_rope_pos_ids`` (half layout, base 10000, cos/sin computed in its
    kernel) in the x call form: x (batch, seq, heads, head_dim) as its ragged (tokens,
    heads, head_dim), positions as its pos_ids (tokens,). It rotates q and k in one call;
    x is passed as both and q's result returned. CUDA only; fp16 and bf16 only."""
    import flashinfer

    batch, seq, heads, head_dim = x.shape
    q = x.reshape(batch * seq, heads, head_dim)
    q_rope, _ = flashinfer.rope.apply_rope_pos_ids(
        q, q, positions.reshape(batch * seq).contiguous(), rotary_dim=head_dim,
        interleave=False, rope_theta=BASE)
    return q_rope.view(batch, seq, heads, head_dim)
