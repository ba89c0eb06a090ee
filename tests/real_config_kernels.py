"""Correct RoPE kernels at the configurations real models ship, each written as its library
writes it (torch, float32 frequencies and angles, cos/sin cast to the input's dtype where
the library casts them), for tests/test_real_configs.py and the acceptance corpus.

Each kernel is a target in its family's call form; ``CONFIGS`` says, per kernel, the family
and the flags a user gives for it (``ropecheck.check`` keywords; the acceptance corpus
writes the same as command-line flags). Settings, from the models' published configs:

| kernel | model | settings |
|---|---|---|
| llama31 | Llama-3.1 | head 128, base 5e5, llama3 scaling factor 8, low 1, high 4, original 8192 |
| llama32 | Llama-3.2 1B / 3B | head 64, base 5e5, llama3 factor 32 |
| phi35_longrope | Phi-3.5-mini | head 96, base 1e4, longrope (48 short / long factors), original 4096, max 131072 |
| deepseek_v3_yarn | DeepSeek-V3 | rope head 64, interleaved (complex), base 1e4, yarn factor 40, original 4096, mscale 1 / 1 |
| gpt_oss_yarn | gpt-oss | head 64, base 150000, yarn factor 32, original 4096, beta 32 / 1, not truncated |
| dynamic_ntk | a Llama-2 7B with HF's dynamic NTK | head 128, base 1e4, dynamic factor 2, max_position_embeddings 4096 |
| gemma3_global, gemma3_local | Gemma 3 | head 256; global base 1e6 with linear factor 8, local base 1e4 |
| qwen2vl_mrope_vllm, qwen2vl_mrope_megatron | Qwen2-VL, Qwen2.5-VL | head 128, M-RoPE sections 16,24,24, base 1e6 |
| qwen3vl_mrope | Qwen3-VL | head 128, interleaved M-RoPE sections 24,20,20, base 5e6 |
| glm4v_mrope | GLM-4.1V / GLM-4.5V | head 128, rotary 64 (partial factor 0.5), interleaved pairs, sections 8,12,12, base 1e4 |
| xpos_128 | xPos (x-transformers) | head 128, scale base 512, gamma 0.4, base 1e4 |

The file imports torch only: ropecheck loads its kernels as targets in a worker process.
"""

from __future__ import annotations

import math

import torch

# --- frequencies, as HF's rope init functions compute them (float32) ------------------------


def default_inv_freq(dim: int, base: float) -> torch.Tensor:
    """1 / base^(2i/dim), i = 0 .. dim/2 - 1, in float32."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(dim, base, factor, low_freq_factor, high_freq_factor, original) -> torch.Tensor:
    """Llama 3.1: wavelengths past original / low_freq_factor divided by factor, shorter than
    original / high_freq_factor kept, a smooth mix between."""
    inv_freq = default_inv_freq(dim, base)
    low_wavelen, high_wavelen = original / low_freq_factor, original / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _correction_dim(rotations, dim, base, original):
    return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_inv_freq(dim, base, factor, original, beta_fast=32.0, beta_slow=1.0, truncate=True, slip=0) -> torch.Tensor:
    """YaRN: interpolated (theta / factor) and original frequencies mixed by a ramp over the
    pair index between the dims where a wavelength fits beta_fast and beta_slow times in the
    original context. ``slip``: the ramp starts that many pairs early (an off-by-one end)."""
    low, high = _correction_dim(beta_fast, dim, base, original), _correction_dim(beta_slow, dim, base, original)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low -= slip
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def longrope_inv_freq(dim, base, factors) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * base**exponents)


# --- appliers --------------------------------------------------------------------------------


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _partial(x, rotary_dim, rotate):
    """rotate(first rotary_dim features) with the rest passed through (HF, NeoX, Phi)."""
    return torch.cat((rotate(x[..., :rotary_dim]), x[..., rotary_dim:]), dim=-1)


def apply_half(x, angles, scale=1.0):
    """HF's LlamaRotaryEmbedding + apply_rotary_pos_emb on x (b, s, h, r): angles (b, s, r/2)
    in float32, cos/sin times the attention factor cast to x's dtype, products in x's dtype."""
    emb = torch.cat((angles, angles), dim=-1)[:, :, None, :]
    cos, sin = (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)
    return x * cos + rotate_half(x) * sin


def _angles(positions, inv_freq):
    return positions.float()[..., None] * inv_freq


# --- 1-D configurations ---------------------------------------------------------------------

LLAMA31 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original=8192)


def llama31(x, positions):
    inv = llama3_inv_freq(128, 500000.0, **LLAMA31)
    return _partial(x, 128, lambda r: apply_half(r, _angles(positions, inv)))


def llama32(x, positions):
    inv = llama3_inv_freq(64, 500000.0, **{**LLAMA31, "factor": 32.0})
    return _partial(x, 64, lambda r: apply_half(r, _angles(positions, inv)))


# Phi-3.5-mini-instruct's rope_scaling (config.json), as the adapter of HF's module holds it
from ropecheck.adapters.hf_real import PHI35_LONG, PHI35_SHORT  # noqa: E402

PHI35_ORIGINAL, PHI35_MAX = 4096, 131072


def longrope_switch(positions, original=PHI35_ORIGINAL, slip: str = "") -> bool:
    """Whether a call uses the long factors: HF / Phi-3's seq_len = max(position_ids) + 1 >
    original. ``slip``: ">=" compares with >=; "max-position" takes seq_len = max position
    (vLLM's ``any(positions > original)``)."""
    top = int(positions.max())
    if slip == ">=":
        return top + 1 >= original
    if slip == "max-position":
        return top > original
    return top + 1 > original


def _phi35(x, positions, slip=""):
    factors = PHI35_LONG if longrope_switch(positions, slip=slip) else PHI35_SHORT
    scale = math.sqrt(1 + math.log(PHI35_MAX / PHI35_ORIGINAL) / math.log(PHI35_ORIGINAL))
    inv = longrope_inv_freq(96, 10000.0, factors)
    return _partial(x, 96, lambda r: apply_half(r, _angles(positions, inv), scale))


def phi35_longrope(x, positions):
    return _phi35(x, positions)


def phi35_longrope_ge(x, positions):  # the switch written seq_len >= original: wrong at exactly 4096 tokens
    return _phi35(x, positions, ">=")


def phi35_longrope_max_position(x, positions):  # seq_len = max position (vLLM's rule): wrong at 4097 tokens
    return _phi35(x, positions, "max-position")


DEEPSEEK_V3 = dict(factor=40.0, original=4096, beta_fast=32.0, beta_slow=1.0)


def deepseek_v3_yarn(x, positions, slip=0):
    """DeepSeek-V3's own inference code: freqs_cis = polar(1, m theta) with the YaRN theta,
    x as complex pairs (2i, 2i + 1) times freqs_cis; the attention factor is
    mscale / mscale_all_dim = 1 (its mscale goes into the softmax scale)."""
    inv = yarn_inv_freq(64, 10000.0, **DEEPSEEK_V3, slip=slip)
    freqs = _angles(positions, inv)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)[:, :, None, :]
    xr = x[..., :64]
    xc = torch.view_as_complex(xr.float().reshape(*xr.shape[:-1], -1, 2))
    y = torch.view_as_real(xc * freqs_cis).flatten(3).to(x.dtype)
    return torch.cat((y, x[..., 64:]), dim=-1)


GPT_OSS = dict(factor=32.0, original=4096, beta_fast=32.0, beta_slow=1.0, truncate=False)


def gpt_oss_yarn(x, positions):
    """gpt-oss: YaRN frequencies (not truncated), cos/sin times the concentration
    0.1 ln(32) + 1, halves of the head (torch.chunk) rotated in x's dtype."""
    inv = yarn_inv_freq(64, 150000.0, **GPT_OSS)
    concentration = yarn_mscale(GPT_OSS["factor"])
    angles = _angles(positions, inv)[:, :, None, :]
    cos, sin = (angles.cos() * concentration).to(x.dtype), (angles.sin() * concentration).to(x.dtype)

    def rotate(r):
        x1, x2 = torch.chunk(r, 2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    return _partial(x, 64, rotate)


# a Llama-2 7B with HF's dynamic NTK scaling: factor 2, max_position_embeddings 4096
DYNAMIC_FACTOR, DYNAMIC_ORIGINAL = 2.0, 4096


def _dynamic_ntk(x, positions, slip=""):
    """HF's _compute_dynamic_ntk_parameters per call: seq_len = max(position_ids) + 1, the
    base grows past max_position_embeddings. ``slip`` "max-position": seq_len taken as the
    largest position (one short)."""
    seq_len = int(positions.max()) + (0 if slip == "max-position" else 1)
    seq_len = max(seq_len, DYNAMIC_ORIGINAL)
    base = 10000.0 * ((DYNAMIC_FACTOR * seq_len / DYNAMIC_ORIGINAL) - (DYNAMIC_FACTOR - 1)) ** (128 / 126)
    inv = default_inv_freq(128, base)
    return _partial(x, 128, lambda r: apply_half(r, _angles(positions, inv)))


def dynamic_ntk(x, positions):
    return _dynamic_ntk(x, positions)


def gemma3_global(x, positions):
    inv = default_inv_freq(256, 1000000.0) / 8.0  # linear scaling, factor 8
    return _partial(x, 256, lambda r: apply_half(r, _angles(positions, inv)))


def gemma3_local(x, positions):
    inv = default_inv_freq(256, 10000.0)
    return _partial(x, 256, lambda r: apply_half(r, _angles(positions, inv)))


# --- M-RoPE configurations -------------------------------------------------------------------


def qwen2vl_mrope_vllm(x, positions, sections=(16, 24, 24), base=1000000.0):
    """vLLM's MRotaryEmbedding.forward_native: a cos|sin cache (float32, cast to the model's
    dtype) gathered at each axis' positions, the sections' chunks picked from their axis,
    then the NeoX rotation of the halves in x's dtype."""
    d = x.shape[-1]
    inv = default_inv_freq(d, base)
    top = int(positions.max()) + 1
    freqs = torch.einsum("i,j->ij", torch.arange(top, dtype=torch.float), inv)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(x.dtype)  # (top, d)
    cos_sin = cache[positions.permute(2, 0, 1)]  # (3, b, s, d)
    cos, sin = cos_sin.chunk(2, dim=-1)
    cos = torch.cat([m[i] for i, m in enumerate(cos.split(list(sections), dim=-1))], dim=-1)
    sin = torch.cat([m[i] for i, m in enumerate(sin.split(list(sections), dim=-1))], dim=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def qwen2vl_mrope_megatron(x, positions, sections=(16, 24, 24), base=1000000.0):
    """Megatron-core's MultimodalRotaryEmbedding + apply_rotary_pos_emb_bshd: per-axis angles
    in float32, both halves, the doubled sections' chunks from their axis (i % 3), cos/sin
    cast to x's dtype."""
    inv = default_inv_freq(x.shape[-1], base)
    freqs = positions.permute(2, 0, 1).float()[..., None] * inv  # (3, b, s, d/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    emb = torch.cat([m[i % 3] for i, m in enumerate(emb.split(list(sections) * 2, dim=-1))], dim=-1)
    emb = emb[:, :, None, :]
    return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)


def qwen3vl_mrope(x, positions, sections=(24, 20, 20), base=5000000.0):
    """HF Qwen3VLTextRotaryEmbedding (apply_interleaved_mrope) + apply_rotary_pos_emb: pair i
    from axis i % 3 within each section's reach, the rest from t."""
    inv = default_inv_freq(x.shape[-1], base)
    freqs = positions.permute(2, 0, 1).float()[..., None] * inv  # (3, b, s, d/2)
    f = freqs[0].clone()
    for axis in (1, 2):
        idx = slice(axis, sections[axis] * 3, 3)
        f[..., idx] = freqs[axis][..., idx]
    return apply_half(x, f)


def glm4v_mrope(x, positions, sections=(8, 12, 12), base=10000.0, rotary_dim=64):
    """HF Glm4vTextRotaryEmbedding + apply_rotary_pos_emb: the first rotary_dim features
    (partial_rotary_factor 0.5 of head 128) in pairs (2i, 2i + 1) (rotate_half_llm), each
    section's frequencies from its axis (i % 3), cos/sin repeated per pair and cast to x's
    dtype; the other features pass through."""
    inv = default_inv_freq(rotary_dim, base)
    freqs = positions.permute(2, 0, 1).float()[..., None] * inv  # (3, b, s, r/2)

    def recompose(t):
        t = torch.cat([m[i % 3] for i, m in enumerate(t.split(list(sections), dim=-1))], dim=-1)
        return t.repeat_interleave(2, dim=-1)[:, :, None, :]

    cos, sin = recompose(freqs.cos()).to(x.dtype), recompose(freqs.sin()).to(x.dtype)
    return _partial(x, rotary_dim, lambda r: r * cos + rotate_every_two(r) * sin)


# --- xPos ------------------------------------------------------------------------------------


def xpos_128(q, k, positions, scale_base=512.0, gamma=0.4):
    """x-transformers' xPos: interleaved rotation, q scaled by zeta^((m - c)/s) and k by its
    inverse, c = (max position + 1) // 2, in float32, cast back."""
    d = q.shape[-1]
    pos = positions.float()
    angle = (pos[..., None] * default_inv_freq(d, 10000.0)).repeat_interleave(2, -1)[:, :, None, :]
    zeta = ((torch.arange(0, d, 2, dtype=torch.float32) / d + gamma) / (1 + gamma)).repeat_interleave(2)
    power = ((pos - (pos.max() + 1).floor_divide(2)) / scale_base)[..., None, None]

    def rotate(t, scale):
        tf = t.float()
        return ((tf * angle.cos() + rotate_every_two(tf) * angle.sin()) * scale).to(t.dtype)

    return rotate(q, zeta**power), rotate(k, zeta**-power)


# --- the flags a user gives for each -----------------------------------------------------------

LLAMA3_FLAG = "llama3:factor={factor:g},low_freq_factor=1,high_freq_factor=4,original_max_position_embeddings=8192"
PHI35_SCALING = {
    "rope_type": "longrope",
    "short_factor": list(PHI35_SHORT),
    "long_factor": list(PHI35_LONG),
    "original_max_position_embeddings": PHI35_ORIGINAL,
    "max_position_embeddings": PHI35_MAX,
}
MROPE_QWEN2 = dict(family="mrope", sections="16,24,24", layout="half", base="1000000")

# kernel name -> the ropecheck.check keywords a user gives for it
CONFIGS: dict[str, dict] = {
    "llama31": dict(layout="half", base="500000", rotary_dim=128, scaling=LLAMA3_FLAG.format(factor=8)),
    "llama32": dict(layout="half", base="500000", rotary_dim=64, scaling=LLAMA3_FLAG.format(factor=32)),
    "phi35_longrope": dict(layout="half", base="10000", rotary_dim=96, scaling=PHI35_SCALING),
    "deepseek_v3_yarn": dict(
        layout="interleaved",
        base="10000",
        rotary_dim=64,
        scaling="yarn:factor=40,original_max_position_embeddings=4096,beta_fast=32,beta_slow=1,mscale=1,"
        "mscale_all_dim=1",
    ),
    "gpt_oss_yarn": dict(
        layout="half",
        base="150000",
        rotary_dim=64,
        scaling="yarn:factor=32,original_max_position_embeddings=4096,beta_fast=32,beta_slow=1,truncate=false",
    ),
    "dynamic_ntk": dict(
        layout="half", base="10000", rotary_dim=128, scaling="dynamic:factor=2,max_position_embeddings=4096"
    ),
    "gemma3_global": dict(layout="half", base="1000000", rotary_dim=256, scaling="linear:factor=8"),
    "gemma3_local": dict(layout="half", base="10000", rotary_dim=256),
    "qwen2vl_mrope_vllm": MROPE_QWEN2,
    "qwen2vl_mrope_megatron": MROPE_QWEN2,
    "qwen3vl_mrope": dict(family="mrope", sections="24,20,20", mrope_interleaved=True, layout="half", base="5000000"),
    "glm4v_mrope": dict(family="mrope", sections="8,12,12", layout="interleaved", base="10000", rotary_dim=64),
    "xpos_128": dict(family="xpos"),
}


# --- broken on purpose: what the checks at these settings must catch ---------------------------


def qwen2vl_mrope_w_ignored(x, positions):  # the w axis drives nothing: its pairs take h's positions
    return qwen2vl_mrope_vllm(x, positions[..., [0, 1, 1]])


def dynamic_ntk_max_position(x, positions):  # seq_len = max position: the original base at 4097 tokens
    return _dynamic_ntk(x, positions, "max-position")


def deepseek_v3_yarn_ramp_early(x, positions):  # YaRN's ramp starting one pair early (low - 1)
    return deepseek_v3_yarn(x, positions, slip=1)


def gemma3_global_frozen(x, positions):  # every position treated as 0: the position is lost
    return gemma3_global(x, positions * 0)
