"""Kernels written to the exact signatures of the library interfaces ropecheck knows as
presets (``--api``), each correct one beside the bugs of its interface that ropecheck must
catch (issue 25). They are plain torch, written from each library's documented semantics
(vLLM's ``ops.rotary_embedding``, FlashInfer's ``apply_rope_with_cos_sin_cache_inplace``
and ``apply_rope_pos_ids``, flash-attn's ``apply_rotary_emb``, transformers'
``apply_rotary_pos_emb``, TransformerEngine's and Megatron-Core's ``apply_rotary_pos_emb``), not copied from
them. Each kernel computes in float32 (float64 for float64 inputs), as the CUDA kernels do.

    ropecheck check tests/preset_kernels.py:vllm_correct --api vllm --layout half
"""

from __future__ import annotations

from typing import Optional

import torch

FUSED_PATH_TOKEN_HEADS = 10240  # vLLM switches to its fused path at this many token-heads


def _opmath(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _rotate(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """v (..., D) rotated in its first r = 2 * cos.shape[-1] features, cos/sin (..., r/2)
    broadcast against v's leading dims; the features past r as they were; a new tensor."""
    half = cos.shape[-1]
    r = 2 * half
    work = _opmath(v)
    c, s = cos.to(work), sin.to(work)
    if neox:
        x1, x2 = v[..., :half].to(work), v[..., half:r].to(work)
    else:
        x1, x2 = v[..., 0:r:2].to(work), v[..., 1:r:2].to(work)
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    rotated = torch.cat((o1, o2), -1) if neox else torch.stack((o1, o2), -1).flatten(-2)
    return torch.cat((rotated.to(v.dtype), v[..., r:]), -1)


def _heads(t: torch.Tensor, head_size: int) -> torch.Tensor:
    """A (T, H*D) or (T, H, D) tensor as a (T, H, D) view (its own strides kept)."""
    return t if t.dim() == 3 else t.unflatten(-1, (-1, head_size))


# --- vLLM: fn(positions, query, key, head_size, cos_sin_cache, is_neox), in place ----------


def _cache_rotary(
    positions,
    query,
    key,
    head_size,
    cos_sin_cache,
    is_neox,
    row_shift=0,
    swap=False,
    key_as_query=False,
    query_strides_for_key=False,
    token_stride_assumed=False,
    skip_single_key_head=False,
    wrong_head=False,
    fused_path_bug=False,
):
    rot = cos_sin_cache.shape[1]
    if fused_path_bug and positions.numel() * _heads(query, head_size).shape[1] >= FUSED_PATH_TOKEN_HEADS:
        row_shift = 1  # the fused path's index arithmetic is off by one row
    rows = cos_sin_cache[positions.long() + row_shift]
    cos, sin = rows[:, : rot // 2], rows[:, rot // 2 :]
    if swap:
        cos, sin = sin, cos
    targets = [query, key]
    if key is None and key_as_query:
        targets = [query, query]
    for t in targets:
        if t is None:
            continue
        v = _heads(t, head_size)
        if t is key and query_strides_for_key:
            v = v.as_strided(v.shape, _heads(query, head_size).stride(), v.storage_offset())
        if token_stride_assumed:
            T, H, D = v.shape
            v = v.as_strided(v.shape, (H * D, v.stride(1), v.stride(2)), v.storage_offset())
        if t is key and skip_single_key_head and v.shape[1] == 1:
            continue
        out = _rotate(v, cos[:, None], sin[:, None], is_neox)
        if wrong_head and v.shape[1] > 1:
            out = out.roll(1, dims=1)
        v.copy_(out)


def vllm_correct(positions, query, key, head_size, cos_sin_cache, is_neox):
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox)


def vllm_next_row(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Reads cache row p + 1 for position p."""
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox, row_shift=1)


def vllm_cos_sin_swapped(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Takes each row's first half as sin and its second as cos."""
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox, swap=True)


def vllm_key_none_crashes(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Views key without checking for None (MLA and cross-attention pass None)."""
    key.view(key.shape[0], -1, head_size)
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox)


def vllm_key_none_rotates_query(positions, query, key, head_size, cos_sin_cache, is_neox):
    """With key None, points its key at the query: the query is rotated twice."""
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox, key_as_query=True)


def vllm_one_head_stride(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Walks key with query's strides (one stride argument for both)."""
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox, query_strides_for_key=True)


def vllm_token_stride_ignored(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Assumes tokens are heads * head_size apart (a strided view's first-dim stride ignored)."""
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox, token_stride_assumed=True)


def vllm_mqa_key_unrotated(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Leaves a key of one head (MQA, MLA's k_pe) as it was."""
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox, skip_single_key_head=True)


def vllm_wrong_head(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Writes each head's result into the next head."""
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox, wrong_head=True)


def vllm_fused_path_bug(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Correct below 10240 token-heads; its fused path above reads the next cache row."""
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox, fused_path_bug=True)


def vllm_rotary_dim_ignored(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Rotates every feature: takes rotary_dim = head_size, each row's cos and sin made
    from the first r/2 frequencies repeated to cover head_size / 2."""
    rot = cos_sin_cache.shape[1]
    rows = cos_sin_cache[positions.long()]
    cos, sin = rows[:, : rot // 2], rows[:, rot // 2 :]
    reps = head_size // rot
    cos, sin = cos.repeat(1, reps), sin.repeat(1, reps)
    for t in (query, key):
        if t is not None:
            v = _heads(t, head_size)
            v.copy_(_rotate(v, cos[:, None], sin[:, None], is_neox))


def vllm_writes_cache(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Rotates correctly, then zeroes the cache rows it read (a scratch buffer reused)."""
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox)
    cos_sin_cache[positions.long()] = 0


_KEPT: dict = {}


def vllm_stale_cache(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Keeps the float32 copy of the first cache it was given for each shape and dtype (a
    model's other caches, a cache rebuilt for new scaling, are never read)."""
    kept = _KEPT.setdefault((tuple(cos_sin_cache.shape), cos_sin_cache.dtype), cos_sin_cache.float().clone())
    _cache_rotary(positions, query, key, head_size, kept.to(cos_sin_cache.dtype), is_neox)


# FlashInfer's apply_rope_with_cos_sin_cache_inplace: the same signature, a float32 cache
def flashinfer_cache_correct(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox)


def flashinfer_cache_next_row(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    _cache_rotary(positions, query, key, head_size, cos_sin_cache, is_neox, row_shift=1)


# --- FlashInfer's apply_rope_pos_ids: angles computed in the kernel -----------------------


def _pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, ignore_rotary_dim=False, pos16=False):
    head_dim = q.shape[-1]
    r = head_dim if rotary_dim is None or ignore_rotary_dim else rotary_dim
    idx = torch.arange(r // 2, dtype=torch.float32, device=q.device)
    base = torch.tensor(1.0 / rope_theta, dtype=torch.float32, device=q.device)
    freq = (1.0 / rope_scale) * torch.pow(base, 2 * idx / r)
    pos = pos_ids.to(torch.int16) if pos16 else pos_ids
    angle = pos.to(torch.float32)[:, None] * freq
    cos, sin = torch.cos(angle)[:, None], torch.sin(angle)[:, None]
    return _rotate(q, cos, sin, not interleave), _rotate(k, cos, sin, not interleave)


def pos_ids_correct(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    return _pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta)


def pos_ids_rotary_dim_ignored(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    """rotary_dim not plumbed: every feature rotated, frequencies of head_dim."""
    return _pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, ignore_rotary_dim=True)


def pos_ids_int16(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    """int64 positions truncated to 16 bits in its compact path."""
    return _pos_ids(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, pos16=True)


# --- flash-attn: fn(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen) --


def _flash(
    x,
    cos,
    sin,
    interleaved,
    inplace,
    seqlen_offsets,
    cu_seqlens,
    max_seqlen,
    row0_offsets=False,
    decode_row0=False,
    swap=False,
    full_width=False,
):
    if swap:
        cos, sin = sin, cos
    if full_width:  # takes the table for (P, rotary_dim): rotates cos.shape[1] features only
        cos, sin = cos[:, : cos.shape[1] // 2], sin[:, : sin.shape[1] // 2]
    if cu_seqlens is not None:
        starts = cu_seqlens[:-1].long()
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        batch = len(lengths)
    else:
        batch, seqlen = x.shape[:2]
    offsets = seqlen_offsets
    if isinstance(offsets, torch.Tensor):
        offsets = offsets.long()
        if row0_offsets or (decode_row0 and cu_seqlens is None and seqlen == 1):
            offsets = offsets[:1].expand(batch)
    else:
        offsets = torch.full((batch,), int(offsets), dtype=torch.long, device=x.device)
    out = x if inplace else torch.empty_like(x)
    if cu_seqlens is None:
        rows = offsets[:, None].to(x.device) + torch.arange(seqlen, device=x.device)
        y = _rotate(x, cos[rows][:, :, None], sin[rows][:, :, None], not interleaved)
        out.copy_(y)
        return out
    for b in range(batch):
        s, n = int(starts[b]), int(lengths[b])
        rows = int(offsets[b]) + torch.arange(n, device=x.device)
        out[s : s + n] = _rotate(x[s : s + n], cos[rows][:, None], sin[rows][:, None], not interleaved)
    return out


def flash_correct(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None):
    return _flash(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen)


def flash_row0_offsets(
    x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None
):
    """Uses batch row 0's seqlen_offsets for every row."""
    return _flash(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen, row0_offsets=True)


def flash_decode_row0(
    x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None
):
    """Decode (one token per row): every row reads row 0's table row."""
    return _flash(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen, decode_row0=True)


def flash_cos_sin_swapped(
    x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None
):
    return _flash(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen, swap=True)


def flash_half_read_as_full(
    x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None
):
    """Reads the (P, r/2) tables as (P, r): rotary_dim taken as cos.shape[1]."""
    return _flash(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen, full_width=True)


# --- transformers: fn(q, k, cos, sin, position_ids=None, unsqueeze_dim=1) -> (q, k) ----------


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_correct(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)


def hf_batch_row0(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Broadcasts batch row 0's cos/sin over the batch when each row has one token."""
    if cos.shape[1] == 1:
        cos, sin = cos[:1], sin[:1]
    return hf_correct(q, k, cos, sin, position_ids, unsqueeze_dim)


def hf_mqa_key_unrotated(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    q_out, k_out = hf_correct(q, k, cos, sin, position_ids, unsqueeze_dim)
    return q_out, (k.clone() if k.shape[1] == 1 else k_out)


# --- TransformerEngine: fn(t, freqs, tensor_format="sbhd", start_positions=None, ...) -------


def _te(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, row0=False, buffer_as_batch=False):
    r = freqs.shape[-1]
    half = freqs[..., : r // 2] if not interleaved else freqs[..., 0:r:2]
    table = half.reshape(freqs.shape[0], r // 2)  # (P, r/2) float32 angles

    def cos_sin(rows):  # cos and sin of the rows read (not of all P: 2^16 rows a call, most of the time)
        angles = table[rows]
        return torch.cos(angles), torch.sin(angles)

    if tensor_format == "thd":
        out = torch.empty_like(t)
        for b in range(len(cu_seqlens) - 1):
            s, e = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
            start = 0 if start_positions is None else int(start_positions[0 if row0 else b])
            cos, sin = cos_sin(start + torch.arange(e - s, device=t.device))
            out[s:e] = _rotate(t[s:e], cos[:, None], sin[:, None], not interleaved)
        return out
    bshd = t.transpose(0, 1) if tensor_format == "sbhd" else t
    batch, seqlen = bshd.shape[:2]
    # start_positions may be a longer buffer (TransformerEngine's inference keeps one of max_batch_size):
    # the first batch entries are this batch's
    if start_positions is None:
        starts = torch.zeros(batch, dtype=torch.long, device=t.device)
    else:
        starts = start_positions.long() if buffer_as_batch else start_positions[:batch].long()
    if row0:
        starts = starts[:1].expand(batch)
    cos, sin = cos_sin(starts[:, None] + torch.arange(seqlen, device=t.device))
    y = _rotate(bshd, cos[:, :, None], sin[:, :, None], not interleaved)
    return y.transpose(0, 1) if tensor_format == "sbhd" else y


def te_correct(
    t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    return _te(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens)


def te_buffer_as_batch(
    t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    """Takes start_positions for the batch: a longer buffer of start positions (as
    TransformerEngine's inference passes it) makes its shapes disagree."""
    return _te(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, buffer_as_batch=True)


def te_row0_start_positions(
    t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    """Uses sequence 0's start_positions for every sequence."""
    return _te(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, row0=True)


# --- Megatron-Core: fn(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None) -> y ------


def _megatron(t, freqs, config, cu_seqlens, mscale, thd_restarts=False, ignore_mscale=False, ignore_layout=False):
    interleaved = config.rotary_interleaved and not ignore_layout
    r = freqs.shape[-1]
    if cu_seqlens is not None and thd_restarts:  # each sequence reads rows 0 .. its length - 1
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        freqs = torch.cat([freqs[:n] for n in lengths])
    angles = freqs[..., 0:r:2] if interleaved else freqs[..., : r // 2]  # (.., r/2) float32
    scale = 1.0 if ignore_mscale else mscale
    cos, sin = torch.cos(angles) * scale, torch.sin(angles) * scale
    if cu_seqlens is not None:  # thd: t (total, h, d), freqs (total, 1, 1, r)
        cos, sin = cos[:, 0], sin[:, 0]
    return _rotate(t, cos, sin, not interleaved)


def megatron_correct(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
    return _megatron(t, freqs, config, cu_seqlens, mscale)


def megatron_thd_restarts(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
    """On thd, reads freqs rows 0 .. n-1 for every sequence (a table of max_seqlen rows),
    though it was given one row per packed token."""
    return _megatron(t, freqs, config, cu_seqlens, mscale, thd_restarts=True)


def megatron_mscale_ignored(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
    """Drops the attention factor (YaRN's mscale)."""
    return _megatron(t, freqs, config, cu_seqlens, mscale, ignore_mscale=True)


def megatron_interleaved_ignored(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
    """Pairs features by halves whatever config.rotary_interleaved says."""
    return _megatron(t, freqs, config, cu_seqlens, mscale, ignore_layout=True)


def megatron_writes_freqs(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
    """Rotates correctly, then scales freqs in place (a buffer reused for the next layer)."""
    out = _megatron(t, freqs, config, cu_seqlens, mscale)
    freqs.mul_(0.5)
    return out


def not_a_preset(x: torch.Tensor, positions: torch.Tensor, extra: Optional[int] = None):
    """A rope(x, positions) kernel: no preset's signature fits it."""
    return x


# --- the same kernel wrapped as rope(x, positions): what a user writes without --api ------


WRAPPED_ROWS = 2**16  # the wrapper's table: as many rows as --api's (checked with --max-position 65535)
_WRAPPED: dict = {}


def vllm_wrapped(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """vllm_correct behind the wrapper --api makes unnecessary: a cos_sin_cache (half
    layout, base 10000, positions 0 .. 65535) made once per dtype and size, the batch
    flattened into tokens, a clone rotated in place."""
    b, s, h, d = x.shape
    key = (x.dtype, x.device, d)
    if key not in _WRAPPED:
        theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        phi = torch.arange(WRAPPED_ROWS, dtype=torch.float64)[:, None] * theta
        _WRAPPED[key] = torch.cat((phi.cos(), phi.sin()), -1).to(device=x.device, dtype=x.dtype)
    out = x.detach().clone().reshape(b * s, h * d)
    vllm_correct(positions.reshape(-1).long(), out, None, d, _WRAPPED[key], True)
    return out.reshape(b, s, h, d)
