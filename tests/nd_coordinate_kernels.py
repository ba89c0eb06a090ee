"""RoPE of image and video models on coordinates, written here in the style of the real
code (each names the model whose convention it follows), right and with the real bugs of
that world, for tests/test_nd_coordinates.py. Every kernel takes x (batch, seq, heads,
head_dim) and positions (batch, seq, n_axes): int64 patch indices or float32 coordinates.
"""

import contextlib
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


# --- Wan 2.1 (diffusers WanRotaryPosEmbed): float64 tables per axis, split in the applier --------
# diffusers #12538 / PR #12594: the table builder sizes the axes t = D - 4 (D // 6), h = w = 2 (D // 6)
# features, its forward split the table at D - 2 (D // 3), D // 3, D // 3. The two agree at Wan's
# released head size 128 (44, 42, 42) and disagree at 64: a table of 24, 20, 20 cut at 22, 21, 21,
# so frame pair 11 turns with the row and one pair takes its cos from the row and its sin from
# the column. Wan's tables: theta 10000, 1024 rows (max_seq_len), cos and sin repeated per pair.
WAN_ROWS = 1024


def _wan_axis_dims(head_dim):
    h = w = 2 * (head_dim // 6)
    return [head_dim - h - w, h, w]


def _wan_tables(head_dim, theta=10000.0):
    """(cos, sin) (1024, head_dim) float64: each axis' angles of rows 0 .. 1023, every value twice."""
    cos, sin = [], []
    for dim in _wan_axis_dims(head_dim):
        freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = torch.outer(torch.arange(WAN_ROWS, dtype=torch.float64), freqs)
        cos.append(angles.cos().repeat_interleave(2, dim=1))
        sin.append(angles.sin().repeat_interleave(2, dim=1))
    return torch.cat(cos, dim=1), torch.cat(sin, dim=1)


def _wan(x, positions, split_sizes):
    table_cos, table_sin = _wan_tables(x.shape[-1])
    rows = [positions[..., k] for k in range(3)]  # frame, row, column of each token
    cos = torch.cat([part[r] for part, r in zip(table_cos.split(split_sizes, dim=1), rows)], -1)[:, :, None]
    sin = torch.cat([part[r] for part, r in zip(table_sin.split(split_sizes, dim=1), rows)], -1)[:, :, None]
    # the attention processor's applier: cos of a pair's first feature, sin of its second
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def wan(x, positions):
    """The fixed forward (PR #12594): the table cut at the sizes it was built with."""
    return _wan(x, positions, _wan_axis_dims(x.shape[-1]))


def wan_split_mismatch(x, positions):
    """diffusers #12538: the forward's own split, D - 2 (D // 3), D // 3, D // 3."""
    d = x.shape[-1]
    return _wan(x, positions, [d - 2 * (d // 3), d // 3, d // 3])


# --- V-JEPA 2 (facebookresearch/vjepa2 rotate_queries_or_keys): 3-D RoPE in consecutive blocks --
# vjepa2 PR #15: sin and cos expanded with .repeat(1, 1, 1, 2) ([f0 .. fn, f0 .. fn]) while the
# rotation pairs adjacent features (2i, 2i + 1): a pair's two features turn by different
# frequencies. The fix is repeat_interleave(2) (the released checkpoints keep the bug, the repo
# says). ViT-L: head 64, blocks of 2 ((64 // 3) // 2) = 20 features for frame, row and column,
# the last 4 features passed through; theta_j = 10000^(-j / 10) per block.
VJEPA2_BLOCK = 20


def _vjepa2_rotate(x, pos, expand):
    """x (b, s, h, D) rotated by positions pos (b, s), adjacent pairs, frequencies 10000^(-2j/D)."""
    d = x.shape[-1]
    omega = torch.arange(d // 2, dtype=torch.float32) / (d / 2.0)  # vjepa2 forms it in x.dtype
    omega = 1.0 / 10000**omega
    freq = pos.float()[..., None] * omega  # (b, s, D / 2)
    emb_sin, emb_cos = expand(freq.sin())[:, :, None], expand(freq.cos())[:, :, None]
    y1, y2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    y = torch.stack((-y2, y1), dim=-1).flatten(-2)
    return (x.float() * emb_cos + y * emb_sin).to(x.dtype)


def _vjepa2(x, positions, expand):
    s, parts = 0, []
    for k in range(3):  # depth (frame), height, width
        parts.append(_vjepa2_rotate(x[..., s : s + VJEPA2_BLOCK], positions[..., k], expand))
        s += VJEPA2_BLOCK
    return torch.cat([*parts, x[..., s:]], dim=-1)


def vjepa2(x, positions):
    return _vjepa2(x, positions, lambda t: t.repeat_interleave(2, dim=-1))


def vjepa2_repeat(x, positions):
    """vjepa2 PR #15: the frequencies tiled, not interleaved, for adjacent pairs."""
    return _vjepa2(x, positions, lambda t: t.repeat(1, 1, 2))


def vjepa2_table(head_dim=64):
    """The pair table of ``vjepa2`` (--family pairs): blocks of 20 features for frame, row and
    column, adjacent pairs, theta_j = 10000^(-j / 10); the rest of the head passes through."""
    half = VJEPA2_BLOCK // 2
    pairs = [[k * VJEPA2_BLOCK + 2 * j, k * VJEPA2_BLOCK + 2 * j + 1, k, 10000.0 ** (-j / half)]
             for k in range(3) for j in range(half)]
    return {"heads": None, "head_dim": head_dim, "n_axes": 3, "pairs": pairs}


# --- FLUX.2 (diffusers Flux2PosEmbed, FluxPosEmbed's successor): theta 2000, four axes of 32 ------
# diffusers #10111 / PR #10115: FluxPosEmbed did not hand its theta to get_1d_rotary_pos_embed,
# which then used its default 10000. Invisible at theta 10000 (FLUX.1, Chroma and the Flux
# ControlNet, every FluxPosEmbed of diffusers 0.42.1); FLUX.2 builds the same per-axis tables at
# theta 2000 (diffusers' Flux2PosEmbed: axes_dims_rope 32, 32, 32, 32, head 128), and ports of it
# build them with FluxPosEmbed(theta=2000, ...) itself: with the old class they turn at 10000. Position ids (t, h, w, l), float64 frequencies, cos and sin repeated per pair, applied
# by diffusers' apply_rotary_emb(use_real_unbind_dim=-1).
FLUX2_AXES = (32, 32, 32, 32)


def _get_1d_rotary_pos_embed(dim, pos, theta):
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[: dim // 2] / dim)
    freqs = pos.double()[..., None] * freqs  # (b, s, dim / 2)
    return freqs.cos().repeat_interleave(2, dim=-1).float(), freqs.sin().repeat_interleave(2, dim=-1).float()


def _flux2(x, ids, theta):
    tables = [_get_1d_rotary_pos_embed(dim, ids[..., k].float(), theta) for k, dim in enumerate(FLUX2_AXES)]
    cos = torch.cat([c for c, _ in tables], -1)[:, :, None]
    sin = torch.cat([s for _, s in tables], -1)[:, :, None]
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def flux2(x, ids):
    return _flux2(x, ids, 2000.0)


def flux2_theta_dropped(x, ids):
    """diffusers #10111: the configured theta not passed on, the builder's default 10000 used."""
    return _flux2(x, ids, 10000.0)


# --- DINOv3 in timm (RotaryEmbeddingDinoV3 + apply_rot_embed_cat): a half-layout sin/cos table ----
# timm PR #2692: NaFlexVit built from DINOv3 weights did not pass rope_rotate_half to EvaBlock, so
# the half-layout table ([f0 .. fn, f0 .. fn], rotate_half=True) was applied with the interleaved
# rot() (apply_rot_embed_cat(half=False)): pairs (i, i + 1) turned by the angles of (i, i + D/2).
# DINOv3 ViT-B: head 64, temperature 100, coordinates in [-1, 1] (the DINO flags above).
def _timm_dinov3_embed(coords, head_dim):
    """(b, s, 2 head_dim): cat(sin, cos), each in the half layout [h's, w's, h's, w's]."""
    angles = _dino_angles(coords, head_dim)
    angles = torch.cat([angles, angles], dim=-1)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def _rot(x):  # timm's rot: [-x1, x0, -x3, x2, ...]
    return torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)


def _apply_rot_embed_cat(x, emb, half):
    sin_emb, cos_emb = emb[:, :, None].chunk(2, -1)
    return (x * cos_emb + (_rotate_half(x) if half else _rot(x)) * sin_emb).to(x.dtype)


def timm_dinov3(x, coords):
    return _apply_rot_embed_cat(x, _timm_dinov3_embed(coords, x.shape[-1]), half=True)


def timm_dinov3_naflex_rot(x, coords):
    """timm PR #2692: EvaBlock's rotate_half left at False, the interleaved rot() applied."""
    return _apply_rot_embed_cat(x, _timm_dinov3_embed(coords, x.shape[-1]), half=False)


# --- Ideogram 4 (diffusers Ideogram4MRoPE): interleaved M-RoPE at image positions 65536 + (t, h, w) -
# diffusers #13920 / PR #13922: the frequencies came from a matmul, which torch.autocast runs in
# bfloat16 even on float32 operands: at 65536 bf16 steps by 512, so every image position of a
# grid under 512 wide got the same angles. The fix computes them with autocast disabled, as HF's
# RoPE modules do. Head 256, theta 5e6, mrope_section (24, 20, 20) interleaved over the 128
# frequencies (pair i is h's for i = 1 mod 3 below 60, w's for i = 2 mod 3 below 60, else t's:
# --sections 88,20,20 --mrope-interleaved), rotate_half.
IDEOGRAM4_SECTION = (24, 20, 20)


def _ideogram4(x, positions, guard):
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (5_000_000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    b, s, _ = positions.shape
    pos = positions.permute(2, 0, 1).to(torch.float32)  # (3, b, s)
    inv = inv_freq[None, None, :, None].expand(3, b, -1, 1)
    with torch.autocast(device_type=x.device.type, enabled=False) if guard else contextlib.nullcontext():
        freqs = inv @ pos.unsqueeze(2)  # (3, b, head_dim / 2, s)
    freqs = freqs.transpose(2, 3)
    freqs_t = freqs[0].clone()
    for axis in (1, 2):
        idx = torch.arange(axis, IDEOGRAM4_SECTION[axis] * 3, 3)
        freqs_t[..., idx] = freqs[axis][..., idx]
    emb = torch.cat((freqs_t, freqs_t), dim=-1)
    cos, sin = emb.cos().float()[:, :, None], emb.sin().float()[:, :, None]
    return (x * cos + _rotate_half(x) * sin).to(x.dtype)


def ideogram4(x, positions):
    return _ideogram4(x, positions, guard=True)


def ideogram4_autocast_angles(x, positions):
    """diffusers #13920: the frequency matmul left to an ambient autocast (bf16)."""
    return _ideogram4(x, positions, guard=False)


# --- table builders of N-D rotations (--call builder): build(positions (S, n_axes)) -> tables --
# As diffusers' FluxPosEmbed builds them: per axis get_1d_rotary_pos_embed(axes_dim[k], ids[:, k],
# theta, use_real=True, repeat_interleave_real=True, freqs_dtype=float64), the axes' cos and
# sin (S, axes_dim[k]) concatenated into (S, D) float32; applied by apply_rotary_emb with
# use_real_unbind_dim=-1 (adjacent pairs).
def _flux_tables(ids, axes_dim, theta, interleave=True):
    cos, sin = [], []
    for k, width in enumerate(axes_dim):
        freqs = 1.0 / theta ** (torch.arange(0, width, 2, dtype=torch.float64) / width)
        angles = ids[:, k].double()[:, None] * freqs
        widen = (lambda t: t.repeat_interleave(2, dim=1)) if interleave else (lambda t: torch.cat([t, t], dim=1))
        cos.append(widen(angles.cos()).float())
        sin.append(widen(angles.sin()).float())
    return torch.cat(cos, dim=-1), torch.cat(sin, dim=-1)


def flux_builder(ids):
    """FLUX.1: axes_dim (16, 56, 56), theta 10000, float ids."""
    return _flux_tables(ids, QWEN_IMAGE_AXES, 10000.0)


def flux_builder_complex(ids):
    """The same tables as diffusers' use_real=False returns them: complex (S, D/2)."""
    cos, sin = flux_builder(ids)
    return torch.complex(cos[:, 0::2], sin[:, 0::2])


def flux_builder_half_tables(ids):
    """repeat_interleave_real=False: each axis' table as cat(f, f), the half layout's, for an
    applier of adjacent pairs (the table-layout bug of timm PR #2692 and diffusers' Wan)."""
    return _flux_tables(ids, QWEN_IMAGE_AXES, 10000.0, interleave=False)


def flux_builder_ids_in_bf16(ids):
    """The ids stored in the model's dtype before the tables are built."""
    return flux_builder(ids.bfloat16().float())


FLUX2_AXES = (32, 32, 32, 32)


def flux2_builder(ids):
    """FLUX.2's tables: four axes of 32 at theta 2000 (diffusers' Flux2PosEmbed)."""
    return _flux_tables(ids, FLUX2_AXES, 2000.0)


def flux2_builder_theta_dropped(ids):
    """diffusers #10111: FluxPosEmbed did not pass its theta on: 10000 for FLUX.2's 2000."""
    return _flux_tables(ids, FLUX2_AXES, 10000.0)


def builder_wrong_shape(ids):
    """cos and sin (S, D/2): one column per pair, not the (S, D) feature tables declared."""
    cos, sin = flux_builder(ids)
    return cos[:, 0::2], sin[:, 0::2]
