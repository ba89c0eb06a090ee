"""The tables a table-fed interface is given, made by ropecheck: the float64 angles
m * theta_i of the declared convention (its scaling included), their cos and sin (times
the scaling's attention factor), rounded once to the table's dtype.

- ``cache``: rows ``cat(cos, sin)`` (each r/2 wide) for positions 0 .. P-1 (vLLM's and
  FlashInfer's cos_sin_cache);
- ``cos_sin``: cos and sin per position row (flash-attn: (P, r/2)) or per token (HF:
  (batch, seq, r), each frequency twice as the layout pairs features);
- ``freqs``: the angles themselves per position row, (P, 1, 1, r) (TransformerEngine),
  or per token (Megatron-Core: ``angles_by_token``).

``sign=-1`` makes the table of -m (row p turns by -p theta_i: R_m^T), with which a
correct kernel undoes its own rotation. Tables indexed by position are made once per
process and kept (``table``); ``untouched`` says whether a kernel wrote into one.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import numpy as np
import torch

from ropecheck.properties.core.dtypes import torch_dtype


def angles(convention, positions: np.ndarray, rotary_dim: int, seq_len: Optional[int] = None) -> np.ndarray:
    """float64 m * theta_i, shape (*positions.shape, r/2), theta_i the convention's for the
    rotary dimension r (a dynamic scaling reads ``seq_len``)."""
    theta = convention.scaling.inv_freq(rotary_dim, convention.base, seq_len)
    return np.asarray(positions, dtype=np.float64)[..., None] * theta


def widened(values: np.ndarray, width: str, layout: str) -> np.ndarray:
    """Per-frequency values (..., r/2) as a table of ``width``: "half" as they are, "full"
    each frequency twice where the layout pairs its features (cat(f, f) for half,
    repeat_interleave(f, 2) for interleaved)."""
    if width == "half":
        return values
    if layout == "half":
        return np.concatenate((values, values), axis=-1)
    return np.repeat(values, 2, axis=-1)


def cos_sin(convention, positions, rotary_dim: int, seq_len=None, sign: int = 1) -> tuple:
    """float64 (A cos(m theta_i), A sin(m theta_i)) for the table of ``sign`` m, A the
    scaling's attention factor."""
    phi = torch.from_numpy(np.ascontiguousarray(sign * angles(convention, positions, rotary_dim, seq_len)))
    amplitude = convention.amplitude
    # torch's float64 cos and sin (within an ulp of numpy's, a seventh of its time on a 65536-row
    # table: a table made inside a timed call no longer passes for the kernel's speed)
    return amplitude * torch.cos(phi).numpy(), amplitude * torch.sin(phi).numpy()


def _tensor(values: np.ndarray, dtype: str, device: str) -> torch.Tensor:
    """float64 values rounded once to ``dtype`` (a float64 -> dtype conversion rounds to
    nearest: the only rounding the table carries)."""
    return torch.from_numpy(np.ascontiguousarray(values)).to(device=device, dtype=torch_dtype(dtype))


def make(kind: str, convention, rows: int, rotary_dim: int, dtype: str, device: str, sign: int = 1, width="half"):
    """A table indexed by position, rows 0 .. rows-1: "cache" (rows, r), "cos_sin" a pair
    (rows, r/2 or r), "freqs" (rows, 1, 1, r)."""
    positions = np.arange(rows, dtype=np.int64)
    if kind == "freqs":
        phi = widened(sign * angles(convention, positions, rotary_dim), width, convention.layout)
        return _tensor(phi[:, None, None, :], dtype, device)
    cos, sin = cos_sin(convention, positions, rotary_dim, sign=sign)
    if kind == "cache":
        return _tensor(np.concatenate((cos, sin), axis=-1), dtype, device)
    return (
        _tensor(widened(cos, width, convention.layout), dtype, device),
        _tensor(widened(sin, width, convention.layout), dtype, device),
    )


@lru_cache(maxsize=16)
def _kept(kind, convention, rows, rotary_dim, dtype, device, sign, width):
    table = make(kind, convention, rows, rotary_dim, dtype, device, sign, width)
    pristine = tuple(t.clone() for t in table) if isinstance(table, tuple) else table.clone()
    return table, pristine


def table(kind: str, convention, rows: int, rotary_dim: int, dtype: str, device: str, sign: int = 1, width="half"):
    """``make``, made once per process for each table (a model keeps its own); a table a
    kernel wrote into is made afresh (``untouched`` said so)."""
    return _kept(kind, convention, rows, rotary_dim, dtype, device, sign, width)[0]


def untouched(
    kind: str, convention, rows: int, rotary_dim: int, dtype: str, device: str, sign=1, width="half", read=None
):
    """Whether the kept table is as it was made, at the rows ``read`` (a tensor of row
    indices: the rows a call reads and their neighbours; None: every row) -- a whole
    65536-row table compared after every call would cost more than the call. A row written
    elsewhere is read wrong by a later call. When changed, the table is forgotten (the next
    call gets a fresh one) and the first changed index is returned in a message."""
    given, pristine = _kept(kind, convention, rows, rotary_dim, dtype, device, sign, width)
    for now, then in zip(*((given, pristine) if isinstance(given, tuple) else ((given,), (pristine,)))):
        if read is not None:
            index = read.to(now.device)
            now, then = now[index], then[index]
        if not torch.equal(now, then):
            _kept.cache_clear()
            where = torch.nonzero(now != then)
            first = tuple(where[0].tolist()) if where.numel() else ()
            if read is not None and first:
                first = (int(read[first[0]]), *first[1:])
            return f"first changed at {first}"
    return None


def _per_token(positions: torch.Tensor) -> tuple:
    """The positions as int64 numpy, the call's own seq_len (largest position + 1, what a
    dynamic scaling sees, as HF's module does) and their device."""
    p = positions.detach().cpu().numpy().astype(np.int64)
    return p, (int(p.max()) + 1 if p.size else None), str(positions.device)


def by_token(convention, positions: torch.Tensor, rotary_dim: int, dtype: str, width: str, sign: int = 1):
    """cos and sin per token, (*positions.shape, r or r/2), on the positions' device."""
    p, seq_len, device = _per_token(positions)
    cos, sin = cos_sin(convention, p, rotary_dim, seq_len, sign)
    return (
        _tensor(widened(cos, width, convention.layout), dtype, device),
        _tensor(widened(sin, width, convention.layout), dtype, device),
    )


def angles_by_token(convention, positions: torch.Tensor, rotary_dim: int, dtype: str, width: str, sign: int = 1):
    """The angles m theta_i per token, (*positions.shape, r or r/2), on the positions' device."""
    p, seq_len, device = _per_token(positions)
    phi = sign * angles(convention, p, rotary_dim, seq_len)
    return _tensor(widened(phi, width, convention.layout), dtype, device)
