"""Kernels written to TransformerEngine's and Megatron-Core's ``apply_rotary_pos_emb``
signatures with context parallelism (``--cp-size N``), each correct one beside the
defects of the load-balanced split ropecheck must catch (issue 26). Plain torch, written
from the libraries' documented semantics, not copied from them: under context parallelism
a rank holds chunks r and 2N - 1 - r of every sequence (each of n tokens, the sequence's
global padded length / 2N), and rotates chunk k's tokens at positions k n .. (k + 1) n - 1
from the sequence's first; thd ``cu_seqlens`` are the global padded ones (a rank's tokens
of sequence i: (cu_seqlens[i + 1] - cu_seqlens[i]) / N). Arithmetic in float32 (float64
for float64 inputs), as the CUDA kernels do.

    ropecheck check tests/cp_kernels.py:te_cp_correct --api te --cp-size 2 --layout half
"""

from __future__ import annotations

from typing import Optional

import torch


def _rotate_half(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _apply(t: torch.Tensor, angles: torch.Tensor, interleaved: bool, mscale: float = 1.0) -> torch.Tensor:
    """t (..., d) turned in its first r features by ``angles`` (..., r) (each frequency
    twice, broadcast against t's leading dims), times mscale; the rest as they were."""
    r = angles.shape[-1]
    work = torch.float64 if t.dtype == torch.float64 else torch.float32
    head, phi = t[..., :r].to(work), angles.to(work)
    out = (head * torch.cos(phi) + _rotate_half(head, interleaved) * torch.sin(phi)) * mscale
    return torch.cat((out.to(t.dtype), t[..., r:]), dim=-1)


def _rows(local: int, cp_size: int, cp_rank: int, defect: str = "", chunk: Optional[int] = None) -> torch.Tensor:
    """The positions (from the sequence's first) of a rank's ``local`` tokens of one
    sequence: chunk cp_rank's then chunk 2N - 1 - cp_rank's. ``chunk``: the chunk size
    the kernel takes (another sequence's, for a defect)."""
    if cp_size == 1 or defect == "ignore-cp":
        return torch.arange(local)
    own = local // 2
    n = own if chunk is None else chunk
    first = cp_rank * n + torch.arange(own)
    second = (2 * cp_size - 1 - cp_rank) * n + torch.arange(own)
    if defect == "second-as-first":
        second = first
    return torch.cat((first, second))


# --- TransformerEngine: fn(t, freqs, tensor_format="sbhd", ..., cp_size=1, cp_rank=0) -> y ----


def _te(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank, defect=""):
    if cp_size > 1 and start_positions is not None:
        raise ValueError("start_positions with cp_size > 1 is not supported")
    angles = freqs[:, 0, 0, :]  # (P, r) float32
    if tensor_format == "thd":
        bounds = (cu_seqlens // cp_size).tolist()  # the rank's tokens of each sequence
        first_chunk = (bounds[1] - bounds[0]) // 2 if len(bounds) > 1 else 0
        out = []
        for b in range(len(bounds) - 1):
            s, e = bounds[b], bounds[b + 1]
            chunk = first_chunk if defect == "sequence-0" else None
            rows = _rows(e - s, cp_size, cp_rank, defect, chunk)
            if start_positions is not None:
                rows = rows + int(start_positions[b])
            out.append(_apply(t[s:e], angles[rows][:, None, :], interleaved))
        return torch.cat(out) if out else t.clone()
    bshd = t.transpose(0, 1) if tensor_format == "sbhd" else t
    rows = _rows(bshd.shape[1], cp_size, cp_rank, defect)[None, :]
    if start_positions is not None:
        rows = rows + start_positions.long()[:, None]
    y = _apply(bshd, angles[rows][:, :, None, :], interleaved)
    return y.transpose(0, 1) if tensor_format == "sbhd" else y


def te_cp_correct(
    t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    return _te(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank)


def te_cp_second_chunk_as_first(
    t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    """Rotates a rank's second chunk (2N - 1 - r) at its first chunk's (r) positions."""
    return _te(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank, "second-as-first")


def te_cp_thd_sequence0_offsets(
    t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    """thd: places every sequence's chunks at sequence 0's chunk offsets (r n0 and
    (2N - 1 - r) n0, n0 sequence 0's chunk size), right for sequence 0 only."""
    return _te(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank, "sequence-0")


def te_cp_ignored(
    t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    """Rotates its local tensor as positions 0 .. n/N - 1, as if there were no context
    parallelism (thd: it finds its tokens with cu_seqlens / cp_size, nothing more)."""
    return _te(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank, "ignore-cp")


# --- Megatron-Core: fn(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None) -> y ----


def _megatron(t, freqs, config, cu_seqlens, mscale, cp_group, defect=""):
    interleaved = config.rotary_interleaved
    if cu_seqlens is None:  # sbhd: freqs (s, b, 1, r), the rank's own rows
        return _apply(t, freqs, interleaved, mscale)
    cp, rank = (cp_group.size(), cp_group.rank()) if cp_group is not None else (1, 0)
    cu = cu_seqlens.tolist()
    packed = freqs.shape[0] == cu[-1]  # one row per token of the global padded batch
    out, start = [], 0
    for i in range(len(cu) - 1):
        local = (cu[i + 1] - cu[i]) // cp
        rows = _rows(local, cp, rank)
        if packed:
            rows = rows + (cu[0] if defect == "sequence-0" else cu[i])
        out.append(_apply(t[start : start + local], freqs[rows][:, 0], interleaved, mscale))
        start += local
    return torch.cat(out) if out else t.clone()


def megatron_cp_correct(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
    return _megatron(t, freqs, config, cu_seqlens, mscale, cp_group)


def megatron_cp_sequence0_rows(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
    """thd with one freqs row per packed token: selects every sequence's rows at sequence
    0's offset in the packed batch (cu_seqlens[0]), not its own (Megatron-LM #5243)."""
    return _megatron(t, freqs, config, cu_seqlens, mscale, cp_group, "sequence-0")


def te_cp_writes_input(
    t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
):
    """Rotates correctly, into the local tensor it was given, and returns it."""
    return t.copy_(_te(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank))
