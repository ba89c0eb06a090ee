"""Small RoPE kernels in the production signatures of the three call forms (issue 11),
for tests/test_call_forms.py: correct ones, which every check must pass, and broken ones,
each wrong only on the inputs of its form that expose it.

- x:      rope(x, positions) -> y; x (batch, seq, heads, head_dim), positions (batch, seq)
- qk:     rope(q, k, positions) -> (q_out, k_out); k has k_heads dividing q's heads
- packed: rope(x, cu_seqlens, positions) -> y; x (total, heads, head_dim), cu_seqlens
          int32 (n + 1,), positions int64 (total,) = each sequence's offset + index in it

Every kernel computes the half layout (rotate_half), base 10000, as HF transformers does:
inv_freq and the angles in float32, cos/sin cast to the input's dtype. The file imports
torch only: ropecheck loads it as a target in its worker process.
"""

from __future__ import annotations

import torch

BASE = 10000.0


# --- the shared HF-style pieces ----------------------------------------------------------

def _inv_freq(head_dim: int, device=None) -> torch.Tensor:
    """1 / base^(2i/d) in float32, as HF's default rope init."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (BASE ** exponents)


def _cos_sin(positions: torch.Tensor, head_dim: int, dtype: torch.dtype):
    """cos and sin of positions[..., None] * inv_freq (float32), both halves, in ``dtype``:
    shape (*positions.shape, head_dim)."""
    angles = positions.float()[..., None] * _inv_freq(head_dim, positions.device)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x rotated by the angles of cos/sin (which broadcast against x)."""
    return x * cos + _rotate_half(x) * sin


def _bshd_cos_sin(positions: torch.Tensor, x: torch.Tensor):
    """cos/sin for a (batch, seq, heads, head_dim) x at (batch, seq) positions:
    (batch, seq, 1, head_dim), broadcast over the heads."""
    cos, sin = _cos_sin(positions, x.shape[-1], x.dtype)
    return cos[:, :, None], sin[:, :, None]


# --- call x --------------------------------------------------------------------------------

def sbhd_correct(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Megatron style: the rotation runs on the (seq, batch, heads, head_dim) view."""
    xs = x.transpose(0, 1)
    cos, sin = _cos_sin(positions.transpose(0, 1), x.shape[-1], x.dtype)  # (seq, batch, d)
    return _apply(xs, cos[:, :, None], sin[:, :, None]).transpose(0, 1)


FAST_PATH_MIN = 2**14  # batch * seq * heads from which the "fast path" is taken


def x_fast_path_bug(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Right below batch * seq * heads = 2^14; from there on a "fast path" forms the
    angles in bfloat16 (BROKEN: only inputs that large expose it)."""
    batch, seq, heads, head_dim = x.shape
    if batch * seq * heads < FAST_PATH_MIN:
        cos, sin = _bshd_cos_sin(positions, x)
        return _apply(x, cos, sin)
    inv_freq = _inv_freq(head_dim, positions.device).to(torch.bfloat16)
    angles = (positions.to(torch.bfloat16)[..., None] * inv_freq).float()
    emb = torch.cat((angles, angles), dim=-1)[:, :, None]
    return _apply(x, emb.cos().to(x.dtype), emb.sin().to(x.dtype))


# --- call qk: correct ------------------------------------------------------------------------

def qk_correct(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
    """HF's apply_rotary_pos_emb: one cos/sin for q and k; k may have fewer heads (GQA/MQA)."""
    cos, sin = _bshd_cos_sin(positions, q)
    return _apply(q, cos, sin), _apply(k, cos, sin)


def qk_optional_k(q: torch.Tensor, k, positions: torch.Tensor):
    """qk_correct that also takes k=None (a query-only call) and returns (q_out, None)."""
    cos, sin = _bshd_cos_sin(positions, q)
    return _apply(q, cos, sin), None if k is None else _apply(k, cos, sin)


# --- call qk: broken ---------------------------------------------------------------------------

def qk_k_unrotated_mqa(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
    """BROKEN: rotates k only when it has more than one head; MQA's single k head comes
    back unrotated (a copy of k)."""
    cos, sin = _bshd_cos_sin(positions, q)
    k_out = _apply(k, cos, sin) if k.shape[2] > 1 else k.clone()
    return _apply(q, cos, sin), k_out


def qk_k_wrong_head(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
    """BROKEN (GQA head confusion): when k has fewer heads than q (but more than one),
    k head j is read from head (j + 1) % k_heads. Right for MHA and for MQA."""
    cos, sin = _bshd_cos_sin(positions, q)
    k_heads = k.shape[2]
    if k_heads < q.shape[2]:
        k = k[:, :, (torch.arange(k_heads, device=k.device) + 1) % k_heads]
    return _apply(q, cos, sin), _apply(k, cos, sin)


def qk_k_row0_positions(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
    """BROKEN: k is rotated with batch row 0's positions in every row (q is right)."""
    cos, sin = _bshd_cos_sin(positions, q)
    return _apply(q, cos, sin), _apply(k, cos[:1], sin[:1])


class _QKRope(torch.autograd.Function):
    """A fused q/k rotation with a hand-written backward; the k gradient is rotated by +m
    where it must be rotated by -m (R_m^T = R_{-m})."""

    @staticmethod
    def forward(ctx, q, k, positions):
        ctx.save_for_backward(positions)
        cos, sin = _bshd_cos_sin(positions, q)
        return _apply(q, cos, sin), _apply(k, cos, sin)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        (positions,) = ctx.saved_tensors
        cos, sin = _bshd_cos_sin(positions, grad_q)
        return _apply(grad_q, cos, -sin), _apply(grad_k, cos, sin), None  # BUG: k by +m


def qk_bad_k_backward(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
    """BROKEN backward: forward right for q and k, q's gradient right, k's rotated the wrong way."""
    return _QKRope.apply(q, k, positions)


# --- call packed ------------------------------------------------------------------------------

def _packed_apply(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x (total, heads, head_dim) rotated at per-token positions (total,)."""
    cos, sin = _cos_sin(positions, x.shape[-1], x.dtype)
    return _apply(x, cos[:, None], sin[:, None])


def _sequences(cu_seqlens: torch.Tensor, positions: torch.Tensor):
    """(seq, index, offsets): each token's sequence and index in it, and each sequence's
    offset as a flash-attn-style API takes it, positions[cu_seqlens[i]] (0 for an empty one)."""
    cu = cu_seqlens.long()
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), lengths)
    index = torch.arange(len(seq), device=cu.device) - starts[seq]
    offsets = torch.zeros(len(lengths), dtype=torch.int64, device=cu.device)
    nonempty = lengths > 0
    offsets[nonempty] = positions[starts[nonempty]].long()
    return seq, index, offsets


def packed_correct(x: torch.Tensor, cu_seqlens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotates each token by its own absolute position."""
    return _packed_apply(x, positions)


def packed_offsets_correct(x: torch.Tensor, cu_seqlens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Takes per-sequence offsets (derived from positions[cu_seqlens[i]]) and rotates token t
    of sequence i by offsets[i] + t, as flash-attn's varlen rotary does: right for the
    positions the packed form is given (offset + arange per sequence)."""
    seq, index, offsets = _sequences(cu_seqlens, positions)
    return _packed_apply(x, offsets[seq] + index)


def packed_restart(x: torch.Tensor, cu_seqlens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """BROKEN: positions restart at 0 in every sequence (the given positions are ignored)."""
    _, index, _ = _sequences(cu_seqlens, positions)
    return _packed_apply(x, index)


def packed_prev_offset(x: torch.Tensor, cu_seqlens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """BROKEN: sequence i > 0 uses sequence i - 1's offset."""
    seq, index, offsets = _sequences(cu_seqlens, positions)
    shifted = torch.cat((offsets[:1], offsets[:-1]))
    return _packed_apply(x, shifted[seq] + index)


def packed_empty_skip(x: torch.Tensor, cu_seqlens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """BROKEN: walks the sequences and, at an empty one, steps over the next one too,
    which is left unrotated."""
    seq, index, offsets = _sequences(cu_seqlens, positions)
    bounds = cu_seqlens.tolist()
    visited = torch.zeros(len(bounds) - 1, dtype=torch.bool, device=x.device)
    i = 0
    while i < len(bounds) - 1:
        if bounds[i] == bounds[i + 1]:
            i += 2  # BUG: meant to step over the empty sequence, steps over the next one too
            continue
        visited[i] = True
        i += 1
    token_positions = torch.where(visited[seq], offsets[seq] + index, torch.zeros_like(index))
    return _packed_apply(x, token_positions)
