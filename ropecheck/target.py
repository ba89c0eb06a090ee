"""Targets: an implementation in one of the call forms of ``ropecheck.call_forms``:
``rope(x, positions) -> y`` (x (batch, seq, heads, head_dim), positions int64 (batch,
seq); y has x's shape and dtype), ``rope(q, k, positions) -> (q_out, k_out)`` or packed
``rope(x, cu_seqlens, positions) -> y``. A target also declares its convention (what the
reference must compute) and its capabilities (what may be asked of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import numpy as np

from ropecheck import reference
from ropecheck.reference.scaling import Scaling
from ropecheck.call_forms import check_call
from ropecheck.dtypes import DTYPES



@dataclass(frozen=True)
class Convention:
    """What a target computes: pairing layout, base, rotary dimension (None: head_dim)
    and position scaling (``reference.scaling``; none by default).

    A scaling may multiply the rotated features by an attention factor (the *amplitude*
    A: f(x, m) = A R_m x on the rotated block) and, when ``dynamic``, take its frequencies
    from the call's sequence length, largest position + 1 (HF transformers' rule)."""

    layout: str
    base: float = reference.DEFAULT_BASE
    rotary_dim: Optional[int] = None
    scaling: Scaling = Scaling()

    def __post_init__(self):
        reference.check_layout(self.layout)
        if not (self.base > 1.0 and math.isfinite(self.base)):
            raise ValueError(f"base must be a finite number > 1, got {self.base}")
        if self.rotary_dim is not None:
            reference.check_rotary_dim(self.rotary_dim)

    def rotary_dim_for(self, head_dim: int) -> int:
        return head_dim if self.rotary_dim is None else self.rotary_dim

    @staticmethod
    def seq_len(positions) -> Optional[int]:
        """The sequence length a dynamic scaling sees: largest position + 1."""
        positions = np.asarray(positions)
        return int(positions.max()) + 1 if positions.size else None

    @property
    def dynamic(self) -> bool:
        return self.scaling.dynamic

    @property
    def amplitude(self) -> float:
        return float(self.scaling.attention_factor())

    def theta(self, head_dim: int, positions=None, seq_len: Optional[int] = None) -> np.ndarray:
        """theta_i for the call at ``positions`` (they matter only to dynamic scalings;
        ``seq_len``: the whole call's, when ``positions`` are a chunk of it)."""
        if seq_len is None:
            seq_len = None if positions is None else self.seq_len(positions)
        return self.scaling.inv_freq(self.rotary_dim_for(head_dim), self.base, seq_len)

    def exponent_log_base(self, head_dim: int) -> np.ndarray:
        """e_i ln(base), e_i = 2i/r: what a float32 base^(-e_i) is perturbed by (tolerance)."""
        r = self.rotary_dim_for(head_dim)
        return np.arange(0, r, 2, dtype=np.float64) / r * math.log(self.base)

    def apply(self, x, positions, *, inverse: bool = False, seq_len: Optional[int] = None) -> np.ndarray:
        """The float64 rotation R_m x (``inverse``: R_m^T x) for x (any float array) at
        integer positions, *without* the amplitude: checks compare outputs divided by it.
        ``seq_len``: the whole call's, when x and positions are a chunk of it."""
        x = np.asarray(x, dtype=np.float64)
        theta = self.theta(x.shape[-1], positions, seq_len)
        positions = np.asarray(positions)
        return reference.apply_rope(x, -positions if inverse else positions, layout=self.layout,
                                    rotary_dim=self.rotary_dim, theta=theta)

    def unscale(self, y64: np.ndarray) -> np.ndarray:
        """Divide the rotated block of a float64 output by the amplitude (a copy)."""
        if self.amplitude == 1.0:
            return y64
        y64 = np.array(y64, dtype=np.float64)
        y64[..., :self.rotary_dim_for(y64.shape[-1])] /= self.amplitude
        return y64

    def flags(self) -> str:
        out = f"--layout {self.layout} --base {self.base:g}"
        out += f" --rotary-dim {self.rotary_dim}" if self.rotary_dim else ""
        if self.scaling.rope_type != "default":
            out += f" --scaling '{self.scaling.flag()}'"
        return out


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
    max_position: Optional[int] = None  # largest position accepted (a fixed-length cache)
    call: str = "x"  # its call form (ropecheck.call_forms): x, qk or packed
    k_optional: bool = False  # qk: accepts k=None
    # positions are offset + arange(seq) in every row (an API taking per-row offsets)
    row_offsets: bool = False
    # device types it runs on (an adapter's record, Target(devices=...)); the checks make
    # its inputs on ``device`` (--device), which must be one of them
    devices: tuple[str, ...] = ("cpu", "cuda")
    device: str = "cpu"
    mode: str = "eager"  # how the checks run it (--mode, ropecheck.modes)
    # where calls run: a ropecheck.worker.Worker, or None for this process
    executor: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        check_call(self.call)
        if self.convention is not None and self.convention.rotary_dim is not None:
            object.__setattr__(self, "rotary_dim", self.convention.rotary_dim)

    def __call__(self, x, positions):
        return self.fn(x, positions)

    def with_(self, **changes) -> "Target":
        return replace(self, **changes)

    def executor_close(self) -> None:
        """Stop the worker process the target runs in, if any."""
        if self.executor is not None:
            self.executor.close()
