"""Kernels whose bug lives in one path of a real interface: a combination of argument
values, a library's convention or a size switch that a run must reach (issue 41). Each
correct kernel is written as production code is (flattened token-heads, per-sequence
loops, raw storage with its strides, gathers), each buggy one carries a bug that shipped
in public code, written from its description, not copied.

    ropecheck check tests/path_kernels.py:flash_varlen_correct --api flash-attn --layout half
"""

from __future__ import annotations

import torch

from tests.preset_kernels import _heads, _opmath

FUSED_TOKEN_HEADS = 10240  # vLLM's warp-chunk path: num_tokens * (num_heads + num_kv_heads) >= this


def _pairs(rotary_dim: int, neox: bool, partner_half: int | None = None) -> tuple:
    """(first, second) feature indices of the rotated pairs: (i, i + r/2) for NeoX
    (``partner_half`` replaces r/2), (2i, 2i + 1) for GPT-J."""
    i = torch.arange(rotary_dim // 2, device="cpu")  # moved to the rows' device by _turn
    if neox:
        return i, i + (rotary_dim // 2 if partner_half is None else partner_half)
    return 2 * i, 2 * i + 1


def _turn(rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, first, second) -> torch.Tensor:
    """rows (N, D) with pair (first[j], second[j]) of row n turned by (cos[n, j], sin[n, j]),
    computed in float32 (float64 for float64 rows); a new tensor in rows' dtype."""
    work = _opmath(rows)
    first, second = first.to(rows.device), second.to(rows.device)
    out = rows.to(work).clone()
    a, b = rows[:, first].to(work), rows[:, second].to(work)
    c, s = cos.to(work), sin.to(work)
    out[:, first], out[:, second] = a * c - b * s, b * c + a * s
    return out.to(rows.dtype)


# --- flash-attn: fn(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
#     max_seqlen=None) -> y ---------------------------------------------------------------------------


def _flash_rows(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, first_offset_only=False):
    """Every token of x as one row of (tokens, heads, head_dim), gathered from the tables at
    its sequence's offset + its index in the sequence; per-sequence loop for varlen."""
    rotary = 2 * cos.shape[1]
    first, second = _pairs(rotary, not interleaved)
    if cu_seqlens is None:
        batch, seqlen, heads, dim = x.shape
        starts = [b * seqlen for b in range(batch)]
        lengths = [seqlen] * batch
        tokens = x.reshape(batch * seqlen, heads, dim)
    else:
        bounds = cu_seqlens.tolist()
        starts, lengths = bounds[:-1], [e - s for s, e in zip(bounds[:-1], bounds[1:])]
        tokens, heads = x, x.shape[1]
    out_tokens = torch.empty_like(tokens)
    for sequence, (start, length) in enumerate(zip(starts, lengths)):
        if length == 0:
            continue
        if isinstance(seqlen_offsets, torch.Tensor):
            which = 0 if (first_offset_only and cu_seqlens is not None) else sequence
            offset = int(seqlen_offsets[which])
        else:
            offset = int(seqlen_offsets)
        rows = offset + torch.arange(length, device=x.device)
        c = cos[rows].repeat_interleave(heads, 0)
        s = sin[rows].repeat_interleave(heads, 0)
        flat = tokens[start : start + length].reshape(length * heads, -1)
        out_tokens[start : start + length] = _turn(flat, c, s, first, second).reshape(length, heads, -1)
    out = out_tokens.reshape(x.shape)
    if inplace:
        x.copy_(out)
        return x
    return out


def flash_varlen_correct(
    x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None
):
    """flash-attn's apply_rotary_emb as its Triton kernel computes it: each sequence (batch
    row, or cu_seqlens' slice) at its own seqlen_offsets entry; inplace writes x."""
    return _flash_rows(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens)


def flash_varlen_first_offset(
    x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None
):
    """With cu_seqlens, reads seqlen_offsets[0] for every sequence (per-sequence offsets
    collapsed to the first: TransformerEngine PR #536, Megatron-LM PR #412)."""
    return _flash_rows(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, first_offset_only=True)


def flash_inplace_ignored(
    x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None
):
    """Returns the rotation in a new tensor whatever inplace says (x is left as it was)."""
    return _flash_rows(x, cos, sin, interleaved, False, seqlen_offsets, cu_seqlens)


# --- transformers: fn(q, k, cos, sin, position_ids=None, unsqueeze_dim=1) -> (q_out, k_out) ---------


def _hf_rows(q, k, cos, sin, unsqueeze_dim, decode_batch0=False):
    """q, k (b, h, s, d) (unsqueeze_dim 1) or (b, s, h, d) (2) rotated row by row: the rows
    are flattened (batch, head, token) vectors, each gathering its cos/sin row (b, s, d),
    a (1, s, d) table serving every batch row; pairs (i, i + d/2)."""
    dim = q.shape[-1]
    first, second = _pairs(dim, True)
    outs = []
    for t in (q, k):
        bhsd = t if unsqueeze_dim == 1 else t.transpose(1, 2)
        b, h, s, d = bhsd.shape
        batch_of = torch.arange(b, device=t.device)[:, None, None].expand(b, h, s).reshape(-1)
        token_of = torch.arange(s, device=t.device)[None, None, :].expand(b, h, s).reshape(-1)
        if decode_batch0 and s == 1:  # the one-token grid covers heads only: batch row 0
            batch_of = torch.zeros_like(batch_of)
        table_row = batch_of if cos.shape[0] > 1 else torch.zeros_like(batch_of)
        c = cos[table_row, token_of][:, : d // 2]
        sn = sin[table_row, token_of][:, : d // 2]
        rows = bhsd.reshape(-1, d)
        out = _turn(rows, c, sn, first, second)
        if decode_batch0 and s == 1:  # rows of the other batch entries are left unwritten
            out = torch.where((torch.arange(b * h * s, device=t.device) < h)[:, None], out, rows)
        out = out.reshape(b, h, s, d)
        outs.append(out if unsqueeze_dim == 1 else out.transpose(1, 2))
    return tuple(outs)


def hf_rows_correct(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb as a kernel over flattened (batch, head, token) rows."""
    return _hf_rows(q, k, cos, sin, unsqueeze_dim)


def hf_decode_batch0(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Its single-token fast path (s == 1) launches a grid without the batch dimension: in
    batched decode only batch row 0 is rotated (MLX #3494 / PR #3498)."""
    return _hf_rows(q, k, cos, sin, unsqueeze_dim, decode_batch0=True)


def hf_cos_per_row(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Indexes cos and sin by batch row: a (1, s, d) table shared by the batch (position_ids
    (1, s), as transformers' models make them) is read past its one row."""
    bhsd = q if unsqueeze_dim == 1 else q.transpose(1, 2)
    cos = torch.stack([cos[b] for b in range(bhsd.shape[0])])
    sin = torch.stack([sin[b] for b in range(bhsd.shape[0])])
    return _hf_rows(q, k, cos, sin, unsqueeze_dim)


def hf_writes_around(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Right values, but q's storage written past the view: the last element of a padded row
    or of a fused qkv projection (a kernel that stores whole rows)."""
    out = _hf_rows(q, k, cos, sin, unsqueeze_dim)
    storage = torch.empty(0, dtype=q.dtype, device=q.device).set_(q.untyped_storage())
    storage[-1] = 7.0
    return out


# --- vLLM: fn(positions, query, key, head_size, cos_sin_cache, is_neox), in place -----------------


def _vllm_rows(positions, query, key, head_size, cos_sin_cache, is_neox, warp_chunk_bug=False):
    """query, key (T, H*D) or (T, H, D) views, rotated in place over flattened token-heads
    read through the tensors' own strides; above FUSED_TOKEN_HEADS the warp-chunk path."""
    rot = cos_sin_cache.shape[1]
    q = _heads(query, head_size)
    k = None if key is None else _heads(key, head_size)
    token_heads = positions.numel() * (q.shape[1] + (0 if k is None else k.shape[1]))
    partner = None
    if warp_chunk_bug and token_heads >= FUSED_TOKEN_HEADS and rot < head_size:
        partner = head_size // 2  # the NeoX partner at half the head, not half the rotary dim
        rot = min(rot, head_size // 2)
    first, second = _pairs(rot, is_neox, partner)
    table = cos_sin_cache[positions.reshape(-1).long()]
    half = cos_sin_cache.shape[1] // 2
    cos, sin = table[:, :half][:, : rot // 2], table[:, half:][:, : rot // 2]
    for t in (q, k):
        if t is None:
            continue
        tokens, heads, dim = t.shape
        c, s = cos.repeat_interleave(heads, 0), sin.repeat_interleave(heads, 0)
        rows = t.reshape(tokens * heads, dim)  # a copy for a strided view
        t.copy_(_turn(rows, c, s, first, second).reshape(tokens, heads, dim))


def vllm_rows_correct(positions, query, key, head_size, cos_sin_cache, is_neox):
    """vLLM's rotary_embedding as a kernel over flattened token-heads."""
    _vllm_rows(positions, query, key, head_size, cos_sin_cache, is_neox)


def vllm_warp_chunk_partial(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Switches to a fused warp-chunk path once num_tokens * (num_heads + num_kv_heads) >=
    10240, whose NeoX partner is head_size / 2 away instead of rotary_dim / 2: wrong only
    there, with partial rotary (vLLM #51049 / PR #50903)."""
    _vllm_rows(positions, query, key, head_size, cos_sin_cache, is_neox, warp_chunk_bug=True)


# --- SGLang: fn(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, *, is_neox) ---------


def sglang_kv_slot0_correct(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, *, is_neox):
    """SGLang's fused rope + KV store: every token, padding included, is stored at its
    out_loc with no check (padding tokens carry slot 0, which the KV pool reserves for
    them: MHATokenToKVPool); k_cache and v_cache (slots, kv_heads * head_dim)."""
    head_size = q.shape[-1]
    _vllm_rows(positions, q, k, head_size, cos_sin_cache, is_neox)
    heads = _heads(k, head_size).shape[1:]
    keys, values = k_cache.view(-1, *heads), v_cache.view(-1, *heads)
    where = out_loc.long()
    keys[where] = _heads(k, head_size).to(keys.dtype)
    values[where] = _heads(v, head_size).to(values.dtype)


# --- TransformerEngine: fn(t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False,
#     cu_seqlens=None, cp_size=1, cp_rank=0) -> y --------------------------------------------------


def _te_rows(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, first_start_only=False):
    r = freqs.shape[-1]
    angles = (freqs[..., 0:r:2] if interleaved else freqs[..., : r // 2]).reshape(freqs.shape[0], r // 2)
    first, second = _pairs(r, not interleaved)
    if tensor_format == "thd":
        bounds = cu_seqlens.tolist()
        out = torch.empty_like(t)
        for sequence, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
            if e == s:
                continue
            which = 0 if first_start_only else sequence
            start = 0 if start_positions is None else int(start_positions[which])
            rows = (start + torch.arange(e - s, device=t.device)).repeat_interleave(t.shape[1])
            flat = t[s:e].reshape(-1, t.shape[-1])
            out[s:e] = _turn(flat, angles[rows].cos(), angles[rows].sin(), first, second).reshape(e - s, *t.shape[1:])
        return out
    bshd = t.transpose(0, 1) if tensor_format == "sbhd" else t
    b, s, h, d = bshd.shape
    # a longer buffer of start positions (TransformerEngine's inference): the first b are this batch's
    none = start_positions is None
    starts = torch.zeros(b, dtype=torch.long, device=t.device) if none else start_positions[:b].long()
    rows = (starts[:, None] + torch.arange(s, device=t.device))[:, :, None].expand(b, s, h).reshape(-1)
    out = _turn(bshd.reshape(-1, d), angles[rows].cos(), angles[rows].sin(), first, second).reshape(b, s, h, d)
    return out.transpose(0, 1) if tensor_format == "sbhd" else out


def te_rows_correct(
    t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    return _te_rows(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens)


def te_thd_first_start(
    t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    """thd: every sequence starts at start_positions[0] (per-sequence start positions collapsed
    to the first, TransformerEngine PR #536)."""
    return _te_rows(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, first_start_only=True)
