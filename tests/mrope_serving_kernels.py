"""M-RoPE kernels written to the serving interfaces' signatures (``--family mrope --api``),
each correct one beside the real bugs of M-RoPE in serving kernels ropecheck must catch
(issue 45). Plain torch in float32, written from each library's documented semantics (not
copied): positions (3, T) (t, h, w); frequency pair i of the rotary dimension turns by
the position of the axis its section assigns it, in chunks (Qwen2-VL: the first s_t pairs
t's, the next s_h h's, the rest w's) or interleaved (Qwen3-VL: pair i is h's when
i = 1 (mod 3) and i < 3 s_h, w's when i = 2 (mod 3) and i < 3 s_w, else t's).

    ropecheck check tests/mrope_serving_kernels.py:vllm_correct --family mrope --sections 2,3,3 --api vllm
"""

from __future__ import annotations

import torch

from tests.preset_kernels import _heads, _rotate
from tests.qk_norm_kernels import _fused


def axes_of(sections, interleaved: bool, bug: str = "") -> torch.Tensor:
    """The axis (0 t, 1 h, 2 w) of each frequency pair."""
    pairs = sum(sections)
    if not interleaved:
        return torch.repeat_interleave(torch.arange(len(sections)), torch.tensor(list(sections)))
    axis = torch.zeros(pairs, dtype=torch.int64)
    for k in range(1, len(sections)):
        if bug == "selector":  # vLLM #40680: the interleaved selector without its bound n * s_k
            axis[k::3] = k
        else:
            axis[k : 3 * sections[k] : 3] = k
    return axis


def _cos_sin(cos_sin_cache, positions, sections, interleaved, bug=""):
    """Per token cos and sin (T, r/2) of each pair at its axis' position."""
    rows = positions.long()
    if rows.dim() == 1:  # text positions (T,): every axis the same
        rows = rows.expand(3, -1)
    if bug == "temporal":  # sglang #35744: only the temporal row read
        rows = rows[:1].expand(3, -1)
    half = cos_sin_cache.shape[-1] // 2
    axis = axes_of(sections, interleaved, bug)
    picked = cos_sin_cache[rows].float()  # (3, T, r): the rows read, in float32 (not the whole cache each call)
    index = torch.arange(half)
    cos = picked[axis, :, index].T  # (T, r/2): pair i from its axis' row
    sin = picked[axis, :, half + index].T
    return cos, sin


def _rotate_heads(t: torch.Tensor, head_size: int, cos, sin, neox: bool) -> None:
    """t (T, H*D) or (T, H, D) rotated in place in its first r features."""
    heads = _heads(t, head_size)
    heads.copy_(_rotate(heads, cos[:, None, :], sin[:, None, :], neox))


# --- vLLM's signature: fn(positions, query, key, head_size, cos_sin_cache, is_neox), the sections by name


def _vllm(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved, bug=""):
    if bug == "numel":  # sgl-kernel-xpu #202: the token count from the (3, T) positions' numel
        tokens = positions.numel()
        query.unflatten(0, (tokens, -1)) if query.shape[0] != tokens else None
    cos, sin = _cos_sin(cos_sin_cache, positions, mrope_section, mrope_interleaved, bug)
    _rotate_heads(query, head_size, cos, sin, is_neox)
    if key is not None:
        _rotate_heads(key, head_size, cos, sin, is_neox)


def vllm_correct(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section=None, mrope_interleaved=False):
    _vllm(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved)


def vllm_temporal_row_only(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section=None,
                           mrope_interleaved=False):  # fmt: skip
    _vllm(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved, "temporal")


def vllm_interleaved_selector(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section=None,
                              mrope_interleaved=False):  # fmt: skip
    _vllm(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved, "selector")


def vllm_token_count_from_numel(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section=None,
                                mrope_interleaved=False):  # fmt: skip
    _vllm(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved, "numel")


# --- SGLang's triton_mrope_fused(q, k, cos_sin_cache, positions, mrope_section, head_size, rotary_dim,
#     mrope_interleaved, is_neox_style), in place


def sglang_correct(q, k, cos_sin_cache, positions, mrope_section, head_size, rotary_dim, mrope_interleaved,
                   is_neox_style):  # fmt: skip
    cos, sin = _cos_sin(cos_sin_cache[:, :rotary_dim], positions, mrope_section, mrope_interleaved)
    _rotate_heads(q, head_size, cos, sin, is_neox_style)
    _rotate_heads(k, head_size, cos, sin, is_neox_style)


def sglang_temporal_row_only(q, k, cos_sin_cache, positions, mrope_section, head_size, rotary_dim, mrope_interleaved,
                             is_neox_style):  # fmt: skip
    cos, sin = _cos_sin(cos_sin_cache[:, :rotary_dim], positions, mrope_section, mrope_interleaved, "temporal")
    _rotate_heads(q, head_size, cos, sin, is_neox_style)
    _rotate_heads(k, head_size, cos, sin, is_neox_style)


# --- the fused QK-norm + M-RoPE (vLLM's fused_qk_norm_rope signature, positions (3, T))


def _qk_norm(qkv, hq, hk, hv, head_dim, eps, q_weight, k_weight, cos_sin_cache, is_neox, position_ids, sections,
             interleaved, bug=""):  # fmt: skip
    cos, sin = _cos_sin(cos_sin_cache, position_ids, sections, interleaved, bug)
    _fused(qkv, hq, hk, hv, head_dim, eps, q_weight, k_weight, cos, sin, is_neox)


def qk_norm_correct(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, cos_sin_cache,
                    is_neox, position_ids, mrope_section=None, mrope_interleaved=False):  # fmt: skip
    _qk_norm(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, cos_sin_cache, is_neox,
             position_ids, mrope_section, mrope_interleaved)  # fmt: skip


def qk_norm_temporal_row_only(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight,
                              cos_sin_cache, is_neox, position_ids, mrope_section=None,
                              mrope_interleaved=False):  # fmt: skip
    """sglang PR #35744: the fused kernel reads only the temporal row (every image token wrong)."""
    _qk_norm(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight, cos_sin_cache, is_neox,
             position_ids, mrope_section, mrope_interleaved, "temporal")  # fmt: skip


# --- FlashInfer's signature (every argument by name) and the KV-cache writes, positions (3, T)


def flashinfer_correct(positions, query, key, head_size, cos_sin_cache, is_neox=True, mrope_section=None,
                       mrope_interleaved=False):  # fmt: skip
    _vllm(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved)


def _cache_write(key, value, key_cache, value_cache, slots, head_size):
    k, v = (t if t.dim() == 3 else t.unflatten(-1, (-1, head_size)) for t in (key, value))
    keys, values = key_cache.view(-1, *k.shape[1:]), value_cache.view(-1, *k.shape[1:])
    cached = slots >= 0
    keys[slots[cached].long()] = k[cached].to(keys.dtype)
    values[slots[cached].long()] = v[cached].to(values.dtype)


def vllm_kv_correct(query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping,
                    k_scale, v_scale, kv_cache_dtype, mrope_section=None, mrope_interleaved=False):  # fmt: skip
    head_size = query.shape[-1]
    _vllm(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved)
    _cache_write(key, value, key_cache, value_cache, slot_mapping, head_size)


def sglang_kv_correct(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, *, is_neox, mrope_section=None,
                      mrope_interleaved=False):  # fmt: skip
    head_size = q.shape[-1]
    _vllm(positions, q, k, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved)
    _cache_write(k, v, k_cache, v_cache, out_loc, head_size)


def sglang_kv_temporal_row_only(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, *, is_neox,
                                mrope_section=None, mrope_interleaved=False):  # fmt: skip
    head_size = q.shape[-1]
    _vllm(positions, q, k, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved, "temporal")
    _cache_write(k, v, k_cache, v_cache, out_loc, head_size)
