"""RoPE of image and video models on coordinates, written here in the style of the real
code (each names the model whose convention it follows), right and with the real bugs of
that world, for tests/test_nd_coordinates.py. Every kernel takes x (batch, seq, heads,
head_dim) and positions (batch, seq, n_axes): int64 patch indices or float32 coordinates.
"""

import math

import torch


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _apply_half(x, angles):
    """rotate_half of the whole head with angles (b, s, head_dim / 2), in float32."""
    emb = torch.cat((angles, angles), dim=-1)[:, :, None, :]
    xf = x.float()
    return (xf * emb.cos() + _rotate_half(xf) * emb.sin()).to(x.dtype)


def _apply_interleaved(x, angles):
    """Adjacent pairs (2i, 2i + 1) turned by angles (b, s, head_dim / 2), as complex numbers."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    rot = torch.polar(torch.ones_like(angles), angles)[:, :, None, :]
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)


# --- DINOv3: coordinates in [-1, 1], angles 2 pi x / period, pairs across the head -------------
DINO_BASE = 100.0


def _dino_angles(coords, head_dim, dtype=torch.float32):
    periods = DINO_BASE ** (2 * torch.arange(head_dim // 4, dtype=dtype) / (head_dim // 2))
    angles = 2 * math.pi * coords.to(dtype)[..., None] / periods  # (b, s, 2, head_dim / 4)
    return angles.flatten(-2).float()  # h's frequencies, then w's


def dinov3(x, coords):
    return _apply_half(x, _dino_angles(coords, x.shape[-1]))


def dinov3_bf16_angles(x, coords):
    """dinov3 #243: the periods and angles computed in bfloat16 whatever the model's dtype."""
    return _apply_half(x, _dino_angles(coords, x.shape[-1], torch.bfloat16))


# --- frequencies far above 1 rad per unit: coordinates of size 1, frequencies up to 1e4 ------
FAST = 10000.0  # rad per unit coordinate of the fastest pair


def fast_axial(x, coords):
    """Two axes, each a half block, theta_j = 10000^(-2j/w), coordinates scaled by FAST."""
    d = x.shape[-1] // 2
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    outs = []
    for k, block in enumerate(x.split(d, dim=-1)):
        angles = (coords[..., k].float() * FAST)[..., None] * theta
        outs.append(_apply_half(block, angles))
    return torch.cat(outs, dim=-1)


def fast_axial_bf16_angles(x, coords):
    d = x.shape[-1] // 2
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    outs = []
    for k, block in enumerate(x.split(d, dim=-1)):
        angles = ((coords[..., k].float() * FAST)[..., None] * theta).bfloat16().float()
        outs.append(_apply_half(block, angles))
    return torch.cat(outs, dim=-1)


# --- Qwen2.5-VL's vision tower: (h, w) patch indices, rotate_half over the head -----------------
def qwen25vl_vision(x, positions):
    """inv_freq over head_dim / 2 features (each axis' frequencies), h's then w's, cat twice."""
    dim = x.shape[-1] // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = (positions.float()[..., None] * inv_freq).flatten(-2)  # (b, s, 2 * dim / 2)
    return _apply_half(x, freqs)


# --- Qwen-Image: a centred grid (negative rows and columns), complex pairs per axis -------------
QWEN_IMAGE_AXES = (16, 56, 56)  # frame, height, width features


def _axis_freqs(width, base=10000.0):
    return 1.0 / base ** (torch.arange(0, width, 2, dtype=torch.float64) / width)


def qwen_image(x, positions):
    angles = torch.cat(
        [positions[..., k].double()[..., None] * _axis_freqs(w) for k, w in enumerate(QWEN_IMAGE_AXES)], -1
    )
    return _apply_interleaved(x, angles.float())


def qwen_image_table_wraps(x, positions):
    """The angles looked up in a table of positions 0 .. 4095: a negative row indexes it from
    its end (torch's negative indexing), the position 4096 + p instead of p."""
    table = torch.cat([torch.arange(4096, dtype=torch.float64)[:, None] * _axis_freqs(w) for w in QWEN_IMAGE_AXES], -1)
    starts = [0, 8, 36]
    angles = torch.cat(
        [table[positions[..., k]][..., s : s + w // 2] for k, (s, w) in enumerate(zip(starts, QWEN_IMAGE_AXES))], -1
    )
    return _apply_interleaved(x, angles.float())


# --- Flux: float position ids (text ids 0, image ids the patch grid), complex pairs per axis -----
def flux(x, ids):
    """axes_dim 16, 56, 56 at theta 10000 on float32 ids, in float64 as FluxPosEmbed computes."""
    angles = torch.cat([ids[..., k].double()[..., None] * _axis_freqs(w) for k, w in enumerate(QWEN_IMAGE_AXES)], -1)
    return _apply_interleaved(x, angles.float())


def flux_ids_in_bf16(x, ids):
    """The position ids stored in the model's dtype (bf16): ids above 256 round to even ones."""
    return flux(x, ids.bfloat16().float())


# --- CogVideoX-like: a crop grid that starts at an offset ----------------------------------
OFFSET = 8.0


def offset_grid(x, positions):
    """Two axes, interleaved blocks, angles theta_j (x + 8)."""
    d = x.shape[-1] // 2
    angles = torch.cat([(positions[..., k].double() + OFFSET)[..., None] * _axis_freqs(d) for k in range(2)], -1)
    return _apply_interleaved(x, angles.float())


# --- LTX-Video: RoPE over all of a token's heads before the head split, pairs dealt round robin ---
LTX_THETA = 10000.0


def ltx_frequencies(dim):
    """dim // 6 frequencies from pi / 2 to theta pi / 2, log-spaced, for a token's dim features."""
    n = dim // 6
    exponents = torch.linspace(0.0, 1.0, n, dtype=torch.float64)
    return LTX_THETA**exponents * math.pi / 2


def _ltx(x, coords, dim):
    b, s = x.shape[:2]
    freqs = (coords.double()[..., None] * 2 - 1) * ltx_frequencies(dim)  # (b, s, 3, n): turns by f (2x - 1)
    freqs = freqs.transpose(-1, -2).flatten(2)  # (b, s, 3n): frame, row, column of frequency 0, then 1 ...
    pad = dim // 2 - freqs.shape[-1]  # the first pairs pass through (cos 1, sin 0)
    angles = torch.cat([torch.zeros(b, s, pad, dtype=freqs.dtype), freqs], -1)
    return _apply_interleaved(x.reshape(b, s, 1, dim), angles.float())


def ltx(x, coords):
    """x (batch, seq, heads, head_dim) rotated as one vector of heads x head_dim features."""
    b, s, h, d = x.shape
    return _ltx(x, coords, h * d).reshape(b, s, h, d)


def ltx_per_head(x, coords):
    """The same rotation applied to each head after the split: another map."""
    b, s, h, d = x.shape
    return _ltx(x.reshape(b * s, 1, h, d).transpose(1, 2).reshape(b, s * h, 1, d), coords.repeat_interleave(h, 1), d).reshape(b, s, h, d)


def ltx_table(heads, head_dim):
    """The pair table of ``ltx`` (docs/families.md, --family pairs): pair k of the rotated ones
    turns by 2 f x - f, f its frequency, x its axis' coordinate."""
    dim = heads * head_dim
    freqs = ltx_frequencies(dim).tolist()
    pad = dim // 2 - 3 * len(freqs)
    pairs = [[2 * (pad + k), 2 * (pad + k) + 1, k % 3, 2 * freqs[k // 3], -freqs[k // 3]] for k in range(3 * len(freqs))]
    return {"heads": heads, "head_dim": head_dim, "n_axes": 3, "pairs": pairs}


# --- diffusers' applier: apply_rotary_emb(x, (cos, sin), use_real=True, ...) ---------------------
def apply_rotary_emb(x, freqs_cis, use_real=True, use_real_unbind_dim=-1, sequence_dim=2):
    """x (B, H, S, D) (sequence_dim 2) or (B, S, H, D) (1); cos, sin (S, D)."""
    cos, sin = freqs_cis
    shape = (None, None, slice(None), slice(None)) if sequence_dim == 2 else (None, slice(None), None, slice(None))
    cos, sin = cos[shape].to(x.device), sin[shape].to(x.device)
    if use_real_unbind_dim == -1:  # adjacent pairs: (real, imag) interleaved
        x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    else:  # -2: the halves of the head
        x_real, x_imag = x.reshape(*x.shape[:-1], 2, -1).unbind(-2)
        x_rotated = torch.cat([-x_imag, x_real], dim=-1)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def apply_rotary_emb_unbind_ignored(x, freqs_cis, use_real=True, use_real_unbind_dim=-1, sequence_dim=2):
    """Always the interleaved rotation: a half-layout table applied with the wrong one (timm PR #2692)."""
    return apply_rotary_emb(x, freqs_cis, use_real, -1, sequence_dim)


def apply_rotary_emb_sequence_dim_ignored(x, freqs_cis, use_real=True, use_real_unbind_dim=-1, sequence_dim=2):
    """Always (B, H, S, D): on (B, S, H, D) the tables meet the heads."""
    cos, sin = freqs_cis
    if x.shape[2] != cos.shape[0]:
        cos, sin = cos[: x.shape[2]], sin[: x.shape[2]]
        if cos.shape[0] != x.shape[2]:  # fewer tokens than heads: the rows repeat
            reps = -(-x.shape[2] // cos.shape[0])
            cos, sin = cos.repeat(reps, 1)[: x.shape[2]], sin.repeat(reps, 1)[: x.shape[2]]
    return apply_rotary_emb(x, (cos, sin), use_real, use_real_unbind_dim, 2)
