"""What ``ropecheck identify`` finds: the ``Identification`` record, its evidence, and the
limits the probes keep to."""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass, field
from typing import Optional

from ropecheck.identification.fitting import number

SMALL_POSITIONS = (0, 1, 2, 3) + tuple(2**k for k in range(2, 11))
LARGE_MAX_POSITIONS = (2**20, 2**16, 2**12)  # each capped at the largest position allowed
DEFAULT_MAX_POSITION = 2**24
EXTRA_HEAD_DIMS = (256, 128)  # where a per-frequency scaling is measured too (with check's)
PROBE_DTYPES = ("float64", "float32", "bfloat16", "float16")
PROBE_HEAD_DIMS = (64, 128, 32, 16, 8, 80, 256)
UNWRAP_LIMIT = math.pi / 2  # branch choice is safe while the total angle error is below it
RATIO_CAP = 1e300
PINNED = 1e-3  # relative uncertainty under which base and scale count as pinned


class UnusableTarget(Exception):
    """The target cannot be loaded or called at all (exit status 2)."""


class NotRotary(Exception):
    """The probes show the map is not a rotary embedding (or not one ropecheck can name)."""


@dataclass
class Evidence:
    """One test: the largest deviation over its error bound (<= 1 passes)."""

    test: str
    ratio: float
    detail: str
    judged: bool = True  # False: a measurement (the fit of non-geometric frequencies), not a test


@dataclass
class Identification:
    target: str
    rotary: bool = False
    reasons: list = field(default_factory=list)  # why not a rotary embedding
    dtype: str = ""
    head_dim: int = 0
    evidence: list = field(default_factory=list)
    rotary_dim: Optional[int] = None
    pass_through: list = field(default_factory=list)
    layout: Optional[str] = None
    pairs: list = field(default_factory=list)  # (first, second) in frequency order
    direction: str = "counter-clockwise"
    theta: list = field(default_factory=list)
    theta_error: list = field(default_factory=list)
    max_position: int = 0  # largest position the frequencies were measured to
    geometric: bool = False
    base: Optional[float] = None
    base_error: Optional[float] = None  # relative
    base_pairs: Optional[int] = None  # pairs the base was fitted on
    scale: Optional[float] = None  # linear position scaling s (theta_k = base^(-2k/r) / s)
    scale_error: Optional[float] = None
    amplitude: float = 1.0
    scaled_amplitude: bool = False  # amplitude != 1 beyond rounding (YaRN's attention factor)
    dynamic: bool = False
    dynamic_theta: list = field(default_factory=list)  # frequencies at the large call's positions
    dynamic_base: Optional[float] = None
    named_scalings: list = field(default_factory=list)  # verified --scaling values, best first
    scaling_theta: list = field(default_factory=list)  # float64 inv_freq of named_scalings[0]
    notes: list = field(default_factory=list)
    confidence: str = "none"

    @property
    def worst_ratio(self) -> float:
        return max((e.ratio for e in self.evidence if e.judged), default=0.0)

    @property
    def flags(self) -> str:
        """The ``ropecheck check`` flags that describe the map ('' when none can)."""
        if not self.rotary or self.layout is None or self.base is None:
            return ""
        if not (self.geometric or self.named_scalings):
            return ""
        words = [f"--layout {self.layout}", f"--base {number(self.base)}"]
        if self.rotary_dim is not None and self.rotary_dim < self.head_dim:
            words.append(f"--rotary-dim {self.rotary_dim}")
        if self.scaling:
            words.append(self.scaling)
        return " ".join(words)

    @property
    def options(self) -> dict:
        """The same convention as ``ropecheck.check`` keywords ({} when none can describe it)."""
        if not self.flags or self.base is None:
            return {}
        out: dict = {"layout": self.layout, "base": float(self.base)}
        if self.rotary_dim is not None and self.rotary_dim < self.head_dim:
            out["rotary_dim"] = self.rotary_dim
        if self.named_scalings:
            out["scaling"] = self.named_scalings[0]
        return out

    @property
    def scaling(self) -> str:
        """``--scaling VALUE`` for the verified named scaling ('' when there is none): VALUE
        always parses with reference.scaling.parse; what no value expresses is in the notes."""
        return f"--scaling {shlex.quote(self.named_scalings[0])}" if self.named_scalings else ""

    def to_json(self) -> dict:
        out = asdict(self)
        out.update(flags=self.flags, scaling=self.scaling, options=self.options, worst_ratio=self.worst_ratio)
        return out
