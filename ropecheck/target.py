"""Targets: an implementation brought to the canonical call ``rope(x, positions) -> y``.

x is (batch, seq, heads, head_dim), positions int64 (batch, seq); y has x's shape and
dtype. A target also declares its convention (what the reference must compute) and its
capabilities (what may be asked of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np

import reference
from ropecheck.dtypes import DTYPES


@dataclass(frozen=True)
class Convention:
    """What a target computes: pairing layout, base, rotary dimension (None: head_dim)."""

    layout: str
    base: float = reference.DEFAULT_BASE
    rotary_dim: Optional[int] = None

    def __post_init__(self):
        reference.check_layout(self.layout)
        if not (self.base > 1.0 and math.isfinite(self.base)):
            raise ValueError(f"base must be a finite number > 1, got {self.base}")
        if self.rotary_dim is not None:
            reference.check_rotary_dim(self.rotary_dim)

    def rotary_dim_for(self, head_dim: int) -> int:
        return head_dim if self.rotary_dim is None else self.rotary_dim

    def theta(self, head_dim: int) -> np.ndarray:
        return reference.inv_freq(self.rotary_dim_for(head_dim), self.base)

    def apply(self, x, positions) -> np.ndarray:
        """The float64 reference output for x (any float array) at integer positions."""
        return reference.apply_rope(x, positions, layout=self.layout, base=self.base,
                                    rotary_dim=self.rotary_dim)

    def flags(self) -> str:
        out = f"--layout {self.layout} --base {self.base:g}"
        return out + (f" --rotary-dim {self.rotary_dim}" if self.rotary_dim else "")


@dataclass(frozen=True)
class Target:
    """One implementation under test, with its declared convention and capabilities.

    ``rotary_dim`` is also meaningful without a layout: it tells the spec-free checks
    which head sizes the target accepts (head_dim >= rotary_dim).
    """

    name: str
    fn: Callable
    convention: Optional[Convention] = None
    dtypes: tuple[str, ...] = tuple(DTYPES)
    backward: bool = True
    inplace: bool = False
    rotary_dim: Optional[int] = None
    description: str = ""

    def __post_init__(self):
        if self.convention is not None and self.convention.rotary_dim is not None:
            object.__setattr__(self, "rotary_dim", self.convention.rotary_dim)

    def __call__(self, x, positions):
        return self.fn(x, positions)

    def with_(self, **changes) -> "Target":
        return replace(self, **changes)
