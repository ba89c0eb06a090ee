"""Fused QK-RMSNorm + RoPE kernels written to the exact signatures of vLLM's and SGLang's
``fused_qk_norm_rope`` (``--api vllm-qk-norm-rope``, ``--api sglang-qk-norm-rope``), each
correct one beside the real bugs of that interface ropecheck must catch (issue 45). Plain
torch in float32, written from each library's documented semantics (not copied): qkv
(T, (Hq + Hk + Hv) * D) in place, each q and k head RMS-normalised over D with its
weights and eps, then its first rotary_dim features rotated; v untouched.

    ropecheck check tests/qk_norm_kernels.py:vllm_correct --api vllm-qk-norm-rope --layout half
"""

from __future__ import annotations

import torch

from tests.preset_kernels import _rotate as rotated

# vLLM's fused_qk_norm_rope processes 4 or 8 token-heads per warp from this many on (SM90)
CHUNKED_TOKEN_HEADS = 10240
CHUNK = 4


def _rotate(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """v (T, H, D) float32 rotated in its first r = 2 cos.shape[-1] features (cos, sin (T, r/2))."""
    return rotated(v, cos[:, None, :], sin[:, None, :], neox)


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each head (T, H, D) over D in float32."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def _fused(qkv, hq, hk, hv, head_dim, eps, q_weight, k_weight, cos, sin, is_neox, **bug):
    """The fused op on qkv in place with per-token cos and sin (T, r/2)."""
    t = qkv.shape[0]
    heads = qkv.view(t, hq + hk + hv, head_dim)
    count = hq + hk + (hv if bug.get("writes_v") else 0)
    x = heads[:, :count].float()
    weights = [q_weight] * hq + [q_weight if bug.get("k_uses_q_weight") else k_weight] * hk + [k_weight] * (count - hq - hk)
    w = torch.stack([wt.float() for wt in weights])  # (heads, D)
    mean = x.pow(2).mean(-1, keepdim=True)
    if bug.get("chunk_rms") and t * (hq + hk) >= CHUNKED_TOKEN_HEADS:
        # the warp's later heads read the first head's reduction (vLLM #51049)
        first = (torch.arange(count) // CHUNK) * CHUNK
        mean = mean[:, first]
    normed = x * torch.rsqrt(mean + (0.0 if bug.get("no_eps") else eps)) * w
    if bug.get("norm_after_rotation"):
        normed = _rotate(x * torch.rsqrt(mean + eps), cos, sin, is_neox) * w
    else:
        normed = _rotate(normed, cos, sin, is_neox)
    heads[:, :count] = normed.to(qkv.dtype)


def _rows(cos_sin_cache: torch.Tensor, positions: torch.Tensor):
    rows = cos_sin_cache[positions.long()].float()
    half = rows.shape[-1] // 2
    return rows[:, :half], rows[:, half:]


# --- vLLM: fn(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight,
#              cos_sin_cache, is_neox, position_ids), in place ---------------------------------


def vllm_correct(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, cos_sin_cache, is_neox,
                 position_ids):  # fmt: skip
    cos, sin = _rows(cos_sin_cache, position_ids)
    _fused(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, cos, sin, is_neox)


def _vllm_bug(**bug):
    def kernel(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, cos_sin_cache,
               is_neox, position_ids):  # fmt: skip
        cos, sin = _rows(cos_sin_cache, position_ids)
        if bug.get("partial_neox_chunks"):  # only where vLLM's bug lives: partial rotary, neox, chunked heads
            bug["chunk_rms"] = is_neox and cos.shape[-1] * 2 < head_dim
        _fused(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, cos, sin, is_neox, **bug)

    return kernel


# vLLM #51049 / PR #50903, #57681: from 10240 token-heads on, with rotary_dim < head_dim and
# neox pairing, every head after the first of a warp's chunk is wrong
vllm_partial_neox_chunks = _vllm_bug(partial_neox_chunks=True)
vllm_writes_v = _vllm_bug(writes_v=True)  # v's heads normalised (and rotated) with k's
vllm_k_uses_q_weight = _vllm_bug(k_uses_q_weight=True)
vllm_no_eps = _vllm_bug(no_eps=True)  # eps left out of the reciprocal square root
vllm_norm_after_rotation = _vllm_bug(norm_after_rotation=True)  # the weights applied to the rotated head


def vllm_rotary_dim_ignored(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight,
                            cos_sin_cache, is_neox, position_ids):  # fmt: skip
    """Reads the cache's rotary_dim columns as if they were the whole head's half."""
    rows = cos_sin_cache[position_ids.long()].float()
    half = head_dim // 2
    width = rows.shape[-1] // 2
    cos = torch.cat((rows[:, :width], torch.ones(rows.shape[0], half - width)), -1)
    sin = torch.cat((rows[:, width:], torch.zeros(rows.shape[0], half - width)), -1)
    _fused(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, cos, sin, is_neox)


# --- SGLang: fn(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight,
#               base, is_neox, position_ids, factor, low, high, attention_factor, rotary_dim=None) ---


def _sglang_freqs(base, rotary_dim, factor, low, high):
    """YaRN-aware float32 frequencies of the rotary dim's pairs (factor 1: plain RoPE)."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float32)
    freq = torch.pow(torch.tensor(base, dtype=torch.float32), -2.0 * i / rotary_dim)
    if factor != 1.0:
        high = high + 0.001 if abs(low - high) <= 1e-6 else high
        ramp = ((i - low) / (high - low)).clamp(0.0, 1.0)
        extrapolate = 1.0 - ramp
        freq = freq / factor * (1.0 - extrapolate) + freq * extrapolate
    return freq


def _sglang(qkv, hq, hk, hv, head_dim, eps, q_weight, k_weight, base, is_neox, position_ids, factor, low, high,
            attention_factor, rotary_dim, **bug):  # fmt: skip
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    freq = _sglang_freqs(base, rotary_dim, factor, low, high)
    angle = position_ids.float()[:, None] * freq
    scale = 1.0 if bug.get("attention_factor_ignored") else attention_factor
    cos, sin = torch.cos(angle) * scale, torch.sin(angle) * scale
    if bug.get("attention_factor_on_whole_head"):
        cos, sin = torch.cos(angle), torch.sin(angle)
    t = qkv.shape[0]
    heads = qkv.view(t, hq + hk + hv, head_dim)
    before = heads[:, : hq + hk].float()
    w = torch.stack([q_weight.float()] * hq + [k_weight.float()] * hk)
    normed = _rotate(before * torch.rsqrt(before.pow(2).mean(-1, keepdim=True) + eps) * w, cos, sin, is_neox)
    if bug.get("attention_factor_on_whole_head"):
        normed = normed * attention_factor
    heads[:, : hq + hk] = normed.to(qkv.dtype)


def sglang_correct(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, base, is_neox,
                   position_ids, factor, low, high, attention_factor, rotary_dim=None):  # fmt: skip
    _sglang(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, base, is_neox,
            position_ids, factor, low, high, attention_factor, rotary_dim)  # fmt: skip


def sglang_attention_factor_ignored(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight,
                                    base, is_neox, position_ids, factor, low, high, attention_factor,
                                    rotary_dim=None):  # fmt: skip
    _sglang(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, base, is_neox,
            position_ids, factor, low, high, attention_factor, rotary_dim, attention_factor_ignored=True)  # fmt: skip


def sglang_attention_factor_on_whole_head(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight,
                                          k_weight, base, is_neox, position_ids, factor, low, high, attention_factor,
                                          rotary_dim=None):  # fmt: skip
    """SGLang scales only the rotated features: this one scales the pass-through ones too."""
    _sglang(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, base, is_neox,
            position_ids, factor, low, high, attention_factor, rotary_dim,
            attention_factor_on_whole_head=True)  # fmt: skip




def vllm_row_stride_ignored(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight,
                            cos_sin_cache, is_neox, position_ids):  # fmt: skip
    """Walks qkv's storage as if its rows were packed (a kernel that takes qkv.data_ptr() and
    the heads' width): right on a contiguous qkv, wrong on a row-strided one."""
    packed = torch.as_strided(qkv, qkv.shape, (qkv.shape[1], 1))
    cos, sin = _rows(cos_sin_cache, position_ids)
    _fused(packed, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, cos, sin, is_neox)


def vllm_zero_head_as_weights(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight,
                              cos_sin_cache, is_neox, position_ids):  # fmt: skip
    """Guards an all-zero head's 0 / 0 by taking it as normalised to ones: a padding token's q
    and k heads come out as their weights (its position 0 turns nothing), where the norm of
    an all-zero head is zero."""
    t = qkv.shape[0]
    heads = qkv.view(t, num_heads_q + num_heads_k + num_heads_v, head_dim)[:, : num_heads_q + num_heads_k]
    zero = (heads == 0).all(-1)
    vllm_correct(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, cos_sin_cache,
                 is_neox, position_ids)  # fmt: skip
    weights = torch.stack([q_weight] * num_heads_q + [k_weight] * num_heads_k).expand(t, -1, -1)
    heads[zero] = weights[zero].to(qkv.dtype)


def vllm_contiguous_only(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight,
                         cos_sin_cache, is_neox, position_ids):  # fmt: skip
    """vLLM's own check (CHECK_INPUT(qkv)): a row-strided qkv is refused."""
    if not qkv.is_contiguous():
        raise RuntimeError("qkv must be contiguous")
    vllm_correct(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, cos_sin_cache,
                 is_neox, position_ids)  # fmt: skip
