"""A Case: the small, printable description of one input; tensors are made from it.

Hypothesis draws Cases (and shrinks them: fewer rows, smaller positions, simpler memory
layout), a failure prints the Case, and ``Case.tensors()`` rebuilds the exact input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ropecheck.dtypes import torch_dtype

# Memory layouts of x: how the (batch, seq, heads, head_dim) view sits in its storage.
MEMORY_LAYOUTS = (
    "contiguous",
    "transposed",     # stored (batch, heads, seq, head_dim), viewed with transpose(1, 2)
    "padded",         # last axis narrowed from a wider row, like a slice of fused qkv
    "strided-heads",  # every other head of a (batch, seq, 2*heads, head_dim) tensor
)


@dataclass(frozen=True)
class Case:
    dtype: str
    batch: int
    seq: int
    heads: int
    head_dim: int
    positions: tuple  # (batch, seq) nested tuple of ints
    memory: str = "contiguous"
    scale: float = 1.0
    seed: int = 0

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.seq, self.heads, self.head_dim)

    def positions_array(self) -> np.ndarray:
        return np.asarray(self.positions, dtype=np.int64).reshape(self.batch, self.seq)

    def positions_tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.positions_array())

    def values(self, salt: int = 0) -> np.ndarray:
        """float64 values, standard normal times scale; ``salt`` gives an independent draw."""
        rng = np.random.default_rng([self.seed, salt])
        return rng.standard_normal(self.shape) * self.scale

    def tensor(self, salt: int = 0, values: np.ndarray | None = None) -> torch.Tensor:
        """x in the case's dtype and memory layout."""
        v = torch.from_numpy(self.values(salt) if values is None else np.asarray(values, np.float64))
        v = v.to(torch_dtype(self.dtype))
        b, s, h, d = self.shape
        if self.memory == "contiguous":
            return v.contiguous()
        if self.memory == "transposed":
            return v.transpose(1, 2).contiguous().transpose(1, 2)
        if self.memory == "padded":
            wide = torch.zeros(b, s, h, d + 3, dtype=v.dtype)
            wide[..., :d] = v
            return wide[..., :d]
        if self.memory == "strided-heads":
            wide = torch.zeros(b, s, 2 * h, d, dtype=v.dtype)
            wide[:, :, ::2] = v
            return wide[:, :, ::2]
        raise ValueError(f"unknown memory layout {self.memory!r}")

    def with_positions(self, positions: np.ndarray) -> "Case":
        from dataclasses import replace
        p = np.asarray(positions, dtype=np.int64)
        return replace(self, positions=tuple(map(tuple, p.tolist())))

    def describe(self) -> str:
        p = self.positions_array()
        rows = "; ".join(_short(row) for row in p)
        return (f"x: shape {self.shape} {self.dtype}, {self.memory}, scale {self.scale:g}, "
                f"seed {self.seed}; positions [{rows}]")


def _short(row: np.ndarray, limit: int = 10) -> str:
    values = row.tolist()
    if len(values) <= limit:
        return ", ".join(map(str, values))
    head = ", ".join(map(str, values[: limit // 2]))
    tail = ", ".join(map(str, values[-limit // 2:]))
    return f"{head}, ... ({len(values) - limit} more), {tail}"


def as_float64(t: torch.Tensor) -> np.ndarray:
    """A snapshot of a tensor's exact values in float64 numpy (a copy, never a view: a
    target may later overwrite the tensor it returned)."""
    return t.detach().cpu().to(torch.float64).numpy().copy()
