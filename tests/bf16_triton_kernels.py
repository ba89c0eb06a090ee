"""A Triton RoPE that computes in its input's dtype, as liger-kernel's does, in the ``x``
call form rope(x, positions): half layout, base 10000, full rotary, any head size (masked
power-of-two blocks). In bfloat16 its products and sums are bfloat16 operations, which
Triton's interpreter computes on bit patterns unless ropecheck puts values under them
(``ropecheck.kernels.triton_interpreter``); on CPU this file's kernel runs there.

- ``rope``: right: angles m * theta_i in float32, cos/sin cast to x's dtype, the rotation
  in x's dtype (one rounding per product and per sum).
- ``bf16_angles``: the positions cast to x's dtype before the angles are formed (in
  bfloat16 every position past 256 rounds to a multiple of 2, past 512 of 4 ...), a bug of
  the real world (Flux's position ids stored in the model's dtype).

    ropecheck check tests/bf16_triton_kernels.py:rope --layout half --dtype bfloat16
"""

from __future__ import annotations

import torch

from ropecheck.kernels.triton_env import import_triton

triton = import_triton()
tl = triton.language
ROWS = tl.constexpr(64)  # (token, head) rows a program rotates


@triton.jit
def _rotate(x_ptr, c_ptr, s_ptr, o_ptr, x_token, x_head, heads, rows, PAIRS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]  # ROWS (token, head) rows a program
    token, head = row // heads, row % heads
    p = tl.arange(0, BLOCK)[None, :]
    mask = (p < PAIRS) & (row < rows)
    x = x_ptr + token.to(tl.int64) * x_token + head * x_head
    x1 = tl.load(x + p, mask=mask, other=0)
    x2 = tl.load(x + PAIRS + p, mask=mask, other=0)
    c = tl.load(c_ptr + token.to(tl.int64) * PAIRS + p, mask=mask, other=0).to(x1.dtype)
    s = tl.load(s_ptr + token.to(tl.int64) * PAIRS + p, mask=mask, other=0).to(x1.dtype)
    o = o_ptr + row.to(tl.int64) * 2 * PAIRS
    tl.store(o + p, x1 * c - x2 * s, mask=mask)
    tl.store(o + PAIRS + p, x2 * c + x1 * s, mask=mask)



def _apply(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    b, s, h, d = x.shape
    pairs = d // 2
    cos = angles.cos().reshape(b * s, pairs).contiguous()
    sin = angles.sin().reshape(b * s, pairs).contiguous()
    flat = x.reshape(b * s, h, d)  # a view where x's layout allows, else a copy
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = torch.empty((b * s, h, d), dtype=x.dtype, device=x.device)
    rows = b * s * h
    if rows:
        grid = (triton.cdiv(rows, ROWS.value),)
        _rotate[grid](
            flat, cos, sin, out, flat.stride(0), flat.stride(1), h, rows, PAIRS=pairs,
            BLOCK=triton.next_power_of_2(pairs),
        )
    return out.reshape(b, s, h, d)


def _inv_freq(d: int, device) -> torch.Tensor:
    return 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    angles = positions.to(torch.float32)[..., None] * _inv_freq(x.shape[-1], x.device)
    return _apply(x, angles)


def bf16_angles(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    angles = positions.to(x.dtype).to(torch.float32)[..., None] * _inv_freq(x.shape[-1], x.device)
    return _apply(x, angles)
