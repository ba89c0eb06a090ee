"""N-D, M-RoPE and xPos kernels for the acceptance corpus, written as their libraries write
them (torch, float32 angles), correct and broken."""
import torch


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _inv_freq(d, base):
    return 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))


def _mrope(x, positions, sections, base, interleaved=False):
    """HF Qwen2-VL apply_multimodal_rotary_pos_emb (chunks) / Qwen3-VL (interleaved), on
    positions (batch, seq, 3)."""
    d = x.shape[-1]
    inv = _inv_freq(d, base)
    freqs = positions.permute(2, 0, 1).float()[..., None] * inv  # (3, b, s, d/2)
    if interleaved:  # Qwen3-VL: pair i from axis i % 3 within each section's reach, the rest t
        f = freqs[0].clone()
        for axis, length in ((1, sections[1]), (2, sections[2])):
            idx = torch.arange(axis, length * 3, 3)
            f[..., idx] = freqs[axis][..., idx]
        emb = torch.cat((f, f), dim=-1)
        cos, sin = emb.cos(), emb.sin()
    else:
        emb = torch.cat((freqs, freqs), dim=-1)  # (3, b, s, d)
        cos, sin = emb.cos(), emb.sin()
        chunks = list(sections) * 2
        cos = torch.cat([c[i % 3] for i, c in enumerate(cos.split(chunks, dim=-1))], dim=-1)
        sin = torch.cat([c[i % 3] for i, c in enumerate(sin.split(chunks, dim=-1))], dim=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    xf = x.float()
    return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)


def qwen2vl_mrope(x, positions):  # sections 16,24,24, base 1e6, head_dim 128 (Qwen2-VL-7B)
    return _mrope(x, positions, (16, 24, 24), 1e6)


def qwen3vl_mrope(x, positions):  # interleaved 24,20,20, base 5e6, head_dim 128 (Qwen3-VL)
    return _mrope(x, positions, (24, 20, 20), 5e6, interleaved=True)


def mrope_toy(x, positions):  # sections 2,3,3, base 10000 (head_dim 16)
    return _mrope(x, positions, (2, 3, 3), 10000.0)


def mrope_toy_axes_swapped(x, positions):  # h and w exchanged
    return _mrope(x, positions[..., [0, 2, 1]], (2, 3, 3), 10000.0)


def mrope_toy_text_only(x, positions):  # every pair driven by t
    return _mrope(x, positions[..., [0, 0, 0]], (2, 3, 3), 10000.0)


def _axial(x, positions, base=10000.0, interleaved=True, sum_axes=False):
    """An axial 2-D RoPE (rotary-embedding-torch style): features split in two blocks, a
    1-D RoPE per block driven by its axis; ``sum_axes``: the seed's lossy R_{x+y}."""
    d = x.shape[-1]
    half = d // 2
    out = []
    for k in range(2):
        block = x[..., k * half:(k + 1) * half].float()
        p = positions.sum(-1) if sum_axes else positions[..., k]
        ang = p.float()[..., None] * _inv_freq(half, base)  # (b, s, half/2)
        if interleaved:
            ang = ang.repeat_interleave(2, dim=-1)[:, :, None, :]
            a, b = block[..., 0::2], block[..., 1::2]
            rot = torch.stack((-b, a), dim=-1).flatten(-2)
        else:
            ang = torch.cat((ang, ang), dim=-1)[:, :, None, :]
            rot = _rotate_half(block)
        out.append(block * ang.cos() + rot * ang.sin())
    return torch.cat(out, dim=-1).to(x.dtype)


def axial_interleaved(x, positions):
    return _axial(x, positions)


def axial_summed_positions(x, positions):
    return _axial(x, positions, sum_axes=True)


def _xpos(q, k, positions, key_sign=-1.0, scale_dtype=torch.float32):
    """x-transformers style xPos (interleaved, gamma 0.4, scale base 512, centred)."""
    d = q.shape[-1]
    pos = positions.float()
    angle = (pos[..., None] * _inv_freq(d, 10000.0)).repeat_interleave(2, -1)[:, :, None, :]
    zeta = ((torch.arange(0, d, 2, dtype=torch.float32) / d + 0.4) / 1.4).repeat_interleave(2)
    power = ((pos - (pos.max() + 1).floor_divide(2)) / 512.0)[..., None, None]
    scale_q = (zeta ** power).to(scale_dtype).float()
    scale_k = (zeta ** (key_sign * power)).to(scale_dtype).float()

    def rotate(x, scale):
        xf = x.float()
        a, b = xf[..., 0::2], xf[..., 1::2]
        rot = torch.stack((-b, a), dim=-1).flatten(-2)
        return ((xf * angle.cos() + rot * angle.sin()) * scale).to(x.dtype)

    return rotate(q, scale_q), rotate(k, scale_k)


def xpos_correct(q, k, positions):
    return _xpos(q, k, positions)


def xpos_key_upscaled(q, k, positions):  # the key scaled by zeta^(+n/s)
    return _xpos(q, k, positions, key_sign=1.0)


def xpos_scale_in_bf16(q, k, positions):
    return _xpos(q, k, positions, scale_dtype=torch.bfloat16)
