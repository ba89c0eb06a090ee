"""A plain torch rotate-half RoPE in a file, angles in float32 as HF forms them: the kernel
benchmarks/side_by_side.sh times verdicts of (--layout half --base 10000)."""

import torch

def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)

def rope(x, positions, base=10000.0):
    d = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = positions.to(torch.float32)[..., None] * inv
    emb = torch.cat((ang, ang), dim=-1)[:, :, None, :]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return x * cos + rotate_half(x) * sin
