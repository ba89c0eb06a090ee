"""Serving kernels: fused rope + KV-cache write kernels written to the exact signatures of vLLM's
``fused_rope_and_reshape_cache_flash`` (``--api vllm-kvcache``) and SGLang's
``apply_rope_inplace_with_kvcache`` (``--api sglang-kvcache``), each correct one beside the
defects of such kernels that ropecheck must catch (issue 26): the rotated k written only
into the cache, the slot off by one, a padding token (slot -1) written into the last slot,
v written rotated; and an MLA kernel in vLLM's ``rotary_embedding`` signature whose k_pe row
stride (the latent row's, kv_lora_rank + rope) is ignored. Plain torch from the documented
semantics, not copied from any of them.

    ropecheck check tests/serving_kernels.py:vllm_kv_correct --api vllm-kvcache --layout half
"""

from __future__ import annotations

import torch

from tests.preset_kernels import _cache_rotary, _heads


def _fused(
    query,
    key,
    value,
    positions,
    cos_sin_cache,
    is_neox,
    key_cache,
    value_cache,
    slots,
    k_only_in_cache=False,
    slot_shift=0,
    padding_written=False,
    value_rotated=False,
):
    head_size = query.shape[-1]
    k = _heads(key, head_size)
    if k_only_in_cache:  # the rotation of k lands in a copy (an SGLang fork's fused_rope_store)
        k = k.clone()
        _cache_rotary(positions, query, k, head_size, cos_sin_cache, is_neox)
    else:
        _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox)
    v = _heads(value, head_size)
    if value_rotated:
        v = v.clone()
        _cache_rotary(positions, v, None, head_size, cos_sin_cache, is_neox)
    keys = key_cache.view(-1, *k.shape[1:])  # paged (blocks, block_size, H, D) or slots (slots, H * D)
    values = value_cache.view(-1, *k.shape[1:])
    cached = torch.ones_like(slots, dtype=torch.bool) if padding_written else slots >= 0
    where = slots[cached] + slot_shift
    keys[where] = k[cached].to(keys.dtype)
    values[where] = v[cached].to(values.dtype)


# --- vLLM: fn(query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache,
#             slot_mapping, k_scale, v_scale, kv_cache_dtype), q and k in place -----------------


def vllm_kv_correct(
    query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping, k_scale, v_scale,
    kv_cache_dtype,
):  # fmt: skip
    assert kv_cache_dtype == "auto" and float(k_scale) == 1.0 and float(v_scale) == 1.0
    _fused(query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping)


def vllm_kv_key_only_in_cache(
    query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping, k_scale, v_scale,
    kv_cache_dtype,
):  # fmt: skip
    """Writes the rotated k into the cache and leaves the caller's key unrotated."""
    _fused(query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping, k_only_in_cache=True)


def vllm_kv_slot_off_by_one(
    query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping, k_scale, v_scale,
    kv_cache_dtype,
):  # fmt: skip
    """Writes each token into the slot after its own."""
    _fused(query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping, slot_shift=1)


def vllm_kv_padding_written(
    query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping, k_scale, v_scale,
    kv_cache_dtype,
):  # fmt: skip
    """Does not skip slot -1: a padding token lands in the cache's last slot."""
    _fused(query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping, padding_written=True)


def vllm_kv_value_rotated(
    query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping, k_scale, v_scale,
    kv_cache_dtype,
):  # fmt: skip
    """Caches v rotated like k."""
    _fused(query, key, value, positions, cos_sin_cache, is_neox, key_cache, value_cache, slot_mapping, value_rotated=True)


# --- SGLang: fn(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, *, is_neox) ------


def sglang_kv_correct(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, *, is_neox, rope_dim=0):
    """As SGLang declares it: is_neox keyword-only, rope_dim 0 (the cache's width)."""
    assert rope_dim == 0 and q.dim() == k.dim() == v.dim() == 3
    _fused(q, k, v, positions, cos_sin_cache, is_neox, k_cache, v_cache, out_loc)


def sglang_kv_key_only_in_cache(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox):
    """Writes the rotated k into the cache and leaves the caller's k as given: what SGLang's
    kernel does since its register_custom_op declares mutates_args q, k_cache, v_cache
    (python/sglang/jit_kernel/rope.py): correct."""
    _fused(q, k, v, positions, cos_sin_cache, is_neox, k_cache, v_cache, out_loc, k_only_in_cache=True)


def sglang_kv_slot_off_by_one(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox):
    """Writes each token into the slot after its own."""
    _fused(q, k, v, positions, cos_sin_cache, is_neox, k_cache, v_cache, out_loc, slot_shift=1)


def sglang_kv_padding_written(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox):
    """Stores every token at its out_loc, padding tokens included: SGLang gives them slot 0,
    which its KV pool reserves for them (python/sglang/srt/mem_cache/memory_pool.py): correct."""
    _fused(q, k, v, positions, cos_sin_cache, is_neox, k_cache, v_cache, out_loc, padding_written=True)


def sglang_kv_cached_unrotated(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox):
    """Rotates q and k in place but stores k as it was given (the store reads k before the
    rotation is written)."""
    head_size = q.shape[-1]
    given = _heads(k, head_size).clone()
    _cache_rotary(positions, q, k, head_size, cos_sin_cache, is_neox)
    keys, values = k_cache.view(-1, *given.shape[1:]), v_cache.view(-1, *given.shape[1:])
    keys[out_loc.long()] = given.to(keys.dtype)
    values[out_loc.long()] = _heads(v, head_size).to(values.dtype)


def sglang_kv_value_rotated(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox):
    """Caches v rotated like k."""
    _fused(q, k, v, positions, cos_sin_cache, is_neox, k_cache, v_cache, out_loc, value_rotated=True)


# --- MLA through vLLM's rotary_embedding: k_pe a slice of the latent row -------------------


def vllm_key_row_stride_ignored(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Walks key as if its tokens were heads * head_size apart: right for a contiguous key,
    wrong for MLA's k_pe, whose rows are the latent row's (kv_lora_rank + rope) apart."""
    k = _heads(key, head_size)
    T, H, D = k.shape
    packed = k.as_strided(k.shape, (H * D, k.stride(1), k.stride(2)), k.storage_offset())
    _cache_rotary(positions, query, packed, head_size, cos_sin_cache, is_neox)
