"""The bytes a RoPE call must move: what ``bench`` divides by its time (GB/s) and copies
on the same device for the yardstick (% of copy).

The least a kernel can move, by what its interface asks of it:
- q and k: out of place, every feature read and written (a partial rotary's pass-through
  features are copied to the output); in place (an interface that writes its results into
  its inputs, a target declared ``--inplace``), only the rotated features read and written;
  an fp8-quantizing interface writes one byte per output element;
- positions: one per token (int64; an N-D rotation's, one per axis, int64 or float32
  coordinates), or one offset per sequence for an interface that takes offsets;
- its table: the rows it reads (one per distinct position for a table indexed by
  position, one per token for a table made per token), each row its cos and sin (or its
  angles) of the table's dtype;
- a fused KV-cache write: k and v written into their slots (v read), and the slot of each
  token read;
- diffusers' applier: its float32 cos and sin, (tokens, head_dim) each.
A kernel that moves more (re-reads q, reads the whole table) shows it as a lower % of the
copy; these are bytes a perfect kernel cannot avoid, not what any one kernel does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ropecheck.calling.presets import PRESETS
from ropecheck.properties.core.contract import APPLIER_FORMS
from ropecheck.properties.core.dtypes import torch_dtype

POSITION_BYTES = 8  # int64


def itemsize(dtype: str) -> int:
    return torch_dtype(dtype).itemsize


@dataclass(frozen=True)
class Traffic:
    """Bytes read and written by one call, and what they are (``parts``: (what, bytes))."""

    read: int
    written: int
    parts: tuple

    @property
    def moved(self) -> int:
        return self.read + self.written


def traffic(
    target, dtype: str, tokens: int, q_heads: int, k_heads: int, head_dim: int, positions: np.ndarray
) -> Traffic:
    """The bytes one call of ``target`` on ``tokens`` tokens of q_heads + k_heads heads of
    ``head_dim`` in ``dtype`` must move (``positions``: (sequences, seq), or (sequences,
    seq, n_axes) for an N-D rotation)."""
    preset = PRESETS.get(target.api or "")
    convention = target.convention
    rotary = convention.rotary_dim_for(head_dim) if hasattr(convention, "rotary_dim_for") else head_dim  # N-D: all
    size = itemsize(dtype)
    elements = tokens * (q_heads + k_heads) * head_dim
    inplace = bool(target.inplace) or (preset is not None and preset.returns == "inplace")
    touched = elements * rotary // head_dim if inplace else elements
    out_size = 1 if preset is not None and preset.returns == "quantized" else size
    parts = [("q and k read", touched * size), ("q and k written", touched * out_size)]
    sequences = positions.shape[0]
    takes_offsets = preset is not None and preset.offsets
    per_token = positions.itemsize * (positions.shape[2] if positions.ndim == 3 else 1)
    parts.append(("positions", sequences * POSITION_BYTES if takes_offsets else tokens * per_token))
    if target.call in APPLIER_FORMS:
        parts.append(("cos and sin", 2 * tokens * head_dim * 4))
    table = preset.interface.table if preset is not None else None
    if table is not None:
        rows = len(np.unique(positions)) if table.by == "position" else tokens
        per_row = (rotary // 2 if table.width == "half" else rotary) * (2 if table.kind == "cos-sin" else 1)
        parts.append((f"{table.argument} rows", rows * per_row * itemsize(table.dtype_for(dtype))))
    written = touched * out_size
    if preset is not None and preset.cache:
        kv = tokens * k_heads * head_dim * size
        parts += [("v read", kv), ("k and v cached", 2 * kv), ("slots", tokens * POSITION_BYTES)]
        written += 2 * kv
    total = sum(b for _, b in parts)
    return Traffic(total - written, written, tuple(parts))
