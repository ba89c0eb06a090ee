"""Position scaling (context-length extension) in float64.

Every scheme keeps the rotation structure and changes only the frequencies theta_i (or,
equivalently, the positions), except YaRN and LongRoPE, which also multiply cos and sin by
an attention factor (the rotated features come out scaled by it). Two schemes depend on
the length of the sequence being processed, ``seq_len`` = largest position + 1 (HF
transformers' definition): dynamic NTK recomputes the base from it, LongRoPE switches from
its short to its long factors past the original context.

A scaling is described by ``rope_parameters`` as in HF transformers' configs
(``{"rope_type": "yarn", "factor": 4.0, ...}``); :func:`from_parameters` builds one.

Formulas and sources (r is the rotary dimension, theta_i = base^(-2i/r)):

- linear / position interpolation: theta_i / s.  Chen et al. 2023, "Extending Context
  Window of Large Language Models via Positional Interpolation" (arXiv:2306.15595);
  kaiokendev's SuperHOT; HF ``_compute_linear_scaling_rope_parameters``.
- NTK-aware: base' = base * s^(r/(r-2)) so that the lowest frequency is interpolated by s
  and the highest untouched.  bloc97, "NTK-Aware Scaled RoPE" (r/LocalLLaMA, 2023).
- dynamic NTK: the NTK formula with s replaced by (s L / L0) - (s - 1), L = max(seq_len,
  L0), L0 = max_position_embeddings.  emozilla (r/LocalLLaMA, 2023); HF
  ``_compute_dynamic_ntk_parameters``.
- YaRN: theta_i = theta_i^interp (1 - g_i) + theta_i^extrap g_i with interp = theta_i / s,
  extrap = theta_i, g_i = 1 - clip((i - low) / (high - low), 0, 1) over the pair index i,
  low/high the pair indices at which a wavelength fits beta_fast / beta_slow times in the
  original context L0: d(n) = r ln(L0 / (2 pi n)) / (2 ln base), floored / ceiled when
  ``truncate``; attention factor 0.1 ln(s) + 1 (or the mscale ratio).  Peng et al. 2023,
  "YaRN: Efficient Context Window Extension of Large Language Models" (arXiv:2309.00071),
  and its reference code (jquesnelle/yarn); HF ``_compute_yarn_parameters``.
- Llama 3: wavelengths 2 pi / theta_i longer than L0 / low_freq_factor are divided by s,
  shorter than L0 / high_freq_factor are kept, in between interpolated with
  smooth = (L0 / wavelength - low) / (high - low).  Meta's llama-models
  ``apply_scaling`` (Llama 3.1); HF ``_compute_llama3_parameters``.
- LongRoPE: theta_i / lambda_i with per-frequency factors lambda = short_factor when
  seq_len <= L0, long_factor past it; attention factor sqrt(1 + ln(s) / ln(L0)),
  s = max_position_embeddings / L0 unless given.  Ding et al. 2024, "LongRoPE" (arXiv:
  2402.13753); Phi-3's ``Phi3LongRoPEScaledRotaryEmbedding``; HF
  ``_compute_longrope_parameters``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Optional

import numpy as np

from ropecheck.reference.rope import inv_freq as _geometric


@dataclass(frozen=True)
class Scaling:
    """No scaling: theta_i = base^(-2i/r), attention factor 1.

    ``theta_ops`` counts the float32 operations a library spends on theta_i beyond the
    plain base^(-e) and reciprocal (the tolerance model allows one rounding each);
    ``dynamic`` says theta depends on the call's sequence length."""

    rope_type = "default"
    dynamic = False
    theta_ops = 0

    def inv_freq(self, rotary_dim: int, base: float, seq_len: Optional[int] = None) -> np.ndarray:
        return _geometric(rotary_dim, base)

    def attention_factor(self) -> float:
        return 1.0

    def switches(self) -> tuple:
        """The sequence lengths L (seq_len = largest position + 1) where theta stops being
        one formula of seq_len: a call of L - 1, L or L + 1 tokens tells ``>`` from ``>=``
        and seq_len from the largest position. Only a dynamic scaling has any."""
        return ()

    def theta_gain(self, rotary_dim: int, base: float) -> np.ndarray:
        """How much a relative error of the unscaled theta_i grows in the scaled one, per
        frequency (d ln theta'_i / d ln theta_i): 1 for a scaling that multiplies theta_i by
        a constant (the tolerance model multiplies theta_i's float32 error by it)."""
        return np.ones(rotary_dim // 2)

    def parameters(self) -> dict:
        """The HF-style rope_parameters of this scaling (without rope_theta)."""
        out = {"rope_type": self.rope_type}
        out.update({f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None})
        return out

    def flag(self) -> str:
        """The ``--scaling`` value that reproduces this scaling."""
        params = self.parameters()
        kind = params.pop("rope_type")
        if any(isinstance(v, (list, tuple)) for v in params.values()):
            return json.dumps(self.parameters(), separators=(",", ":"))
        return kind + ("" if not params else ":" + ",".join(f"{k}={_short(v)}" for k, v in params.items()))


@dataclass(frozen=True)
class Linear(Scaling):
    """Position interpolation: theta_i / factor (positions m -> m / factor)."""

    factor: float = 1.0
    rope_type = "linear"
    theta_ops = 1

    def inv_freq(self, rotary_dim, base, seq_len=None):
        return _geometric(rotary_dim, base) / self.factor


@dataclass(frozen=True)
class NTK(Scaling):
    """NTK-aware static base change: base' = base * factor^(r / (r - 2))."""

    factor: float = 1.0
    rope_type = "ntk"
    theta_ops = 1

    def inv_freq(self, rotary_dim, base, seq_len=None):
        return _geometric(rotary_dim, base * self.factor ** (rotary_dim / (rotary_dim - 2)))


@dataclass(frozen=True)
class DynamicNTK(Scaling):
    """Dynamic NTK: base' = base ((s L / L0) - (s - 1))^(r/(r-2)), L = max(seq_len, L0)."""

    factor: float = 1.0
    max_position_embeddings: int = 2048
    rope_type = "dynamic"
    dynamic = True
    theta_ops = 2

    def base_for(self, rotary_dim: int, base: float, seq_len: Optional[int]) -> float:
        length = max(seq_len or 0, self.max_position_embeddings)
        stretch = self.factor * length / self.max_position_embeddings - (self.factor - 1.0)
        return base * stretch ** (rotary_dim / (rotary_dim - 2))

    def inv_freq(self, rotary_dim, base, seq_len=None):
        return _geometric(rotary_dim, self.base_for(rotary_dim, base, seq_len))

    def switches(self) -> tuple:
        """L0: the base is the original one up to seq_len = L0 and grows past it (at L0 both
        formulas give the same base: a ``>=`` cannot be told from ``>``, but a seq_len
        taken as the largest position, one short, keeps the original base at L0 + 1)."""
        return (int(self.max_position_embeddings),)


def yarn_correction_range(
    rotary_dim: int, base: float, original: int, beta_fast: float, beta_slow: float, truncate: bool = True
) -> tuple[float, float]:
    """Pair indices (low, high) between which YaRN ramps from extrapolation to
    interpolation: where a wavelength fits beta_fast (resp. beta_slow) times into L0."""

    def dim(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim(beta_fast), dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rotary_dim - 1)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class YaRN(Scaling):
    """YaRN: ramp between interpolated and original frequencies, plus an attention factor."""

    factor: float = 1.0
    original_max_position_embeddings: int = 2048
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    attention_factor_: Optional[float] = field(default=None, metadata={"key": "attention_factor"})
    truncate: bool = True
    rope_type = "yarn"
    theta_ops = 5

    def inv_freq(self, rotary_dim, base, seq_len=None):
        theta = _geometric(rotary_dim, base)
        low, high = yarn_correction_range(
            rotary_dim, base, self.original_max_position_embeddings, self.beta_fast, self.beta_slow, self.truncate
        )
        if low == high:
            high += 0.001  # as the reference code: avoid a zero-width ramp
        ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        extrapolate = 1.0 - ramp
        return theta / self.factor * (1.0 - extrapolate) + theta * extrapolate

    def attention_factor(self) -> float:
        if self.attention_factor_ is not None:
            return float(self.attention_factor_)
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    def parameters(self) -> dict:
        out = super().parameters()
        if "attention_factor_" in out:
            out["attention_factor"] = out.pop("attention_factor_")
        return out


@dataclass(frozen=True)
class Llama3(Scaling):
    """Llama 3.1: keep short wavelengths, divide long ones by factor, interpolate between."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    rope_type = "llama3"
    theta_ops = 6

    def inv_freq(self, rotary_dim, base, seq_len=None):
        theta = _geometric(rotary_dim, base)
        original = self.original_max_position_embeddings
        wavelength = 2 * math.pi / theta
        smooth = (original / wavelength - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * theta / self.factor + smooth * theta
        out = np.where(wavelength > original / self.low_freq_factor, theta / self.factor, smoothed)
        return np.where(wavelength < original / self.high_freq_factor, theta, out)

    def theta_gain(self, rotary_dim, base):
        """In the band theta' = theta ((1 - s)/f + s) with s = (L0 theta / 2 pi - low) /
        (high - low) itself linear in theta, so d ln theta' / d ln theta =
        1 + (1 - 1/f) (x / (high - low)) / ((1 - s)/f + s), x = L0 theta / 2 pi: up to
        1 + (f - 1) high / (high - low) at the band's long end (about 10 for Llama 3.1)."""
        theta = _geometric(rotary_dim, base)
        x = self.original_max_position_embeddings * theta / (2 * math.pi)
        low, high, f = self.low_freq_factor, self.high_freq_factor, self.factor
        s = (x - low) / (high - low)
        gain = 1 + (1 - 1 / f) * (x / (high - low)) / ((1 - s) / f + s)
        return np.where((x >= low) & (x <= high), gain, 1.0)


@dataclass(frozen=True)
class LongRoPE(Scaling):
    """LongRoPE: per-frequency factors, short up to L0 and long past it; attention factor."""

    short_factor: tuple = ()
    long_factor: tuple = ()
    original_max_position_embeddings: int = 4096
    factor: Optional[float] = None
    max_position_embeddings: Optional[int] = None
    attention_factor_: Optional[float] = field(default=None, metadata={"key": "attention_factor"})
    rope_type = "longrope"
    dynamic = True
    theta_ops = 2

    def __post_init__(self):
        object.__setattr__(self, "short_factor", tuple(float(v) for v in self.short_factor))
        object.__setattr__(self, "long_factor", tuple(float(v) for v in self.long_factor))
        if len(self.short_factor) != len(self.long_factor):
            raise ValueError("LongRoPE short_factor and long_factor must have the same length")

    def factors(self, rotary_dim: int, seq_len: Optional[int]) -> np.ndarray:
        long = seq_len is not None and seq_len > self.original_max_position_embeddings
        chosen = np.asarray(self.long_factor if long else self.short_factor, dtype=np.float64)
        if chosen.shape != (rotary_dim // 2,):
            raise ValueError(
                f"LongRoPE factors have {chosen.size} entries; rotary dimension {rotary_dim} needs {rotary_dim // 2}"
            )
        return chosen

    def inv_freq(self, rotary_dim, base, seq_len=None):
        return _geometric(rotary_dim, base) / self.factors(rotary_dim, seq_len)

    def switches(self) -> tuple:
        """L0: the short factors up to seq_len = L0, the long ones past it."""
        return (int(self.original_max_position_embeddings),)

    def attention_factor(self) -> float:
        if self.attention_factor_ is not None:
            return float(self.attention_factor_)
        scale = self.factor
        if scale is None:
            scale = (
                self.max_position_embeddings or self.original_max_position_embeddings
            ) / self.original_max_position_embeddings
        if scale <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(scale) / math.log(self.original_max_position_embeddings))

    def parameters(self) -> dict:
        out = super().parameters()
        out["short_factor"], out["long_factor"] = list(self.short_factor), list(self.long_factor)
        if "attention_factor_" in out:
            out["attention_factor"] = out.pop("attention_factor_")
        return out


SCALINGS = {cls.rope_type: cls for cls in (Scaling, Linear, NTK, DynamicNTK, YaRN, Llama3, LongRoPE)}
ALIASES = {
    "none": "default",
    "pi": "linear",
    "position-interpolation": "linear",
    "ntk-aware": "ntk",
    "dynamic-ntk": "dynamic",
    "llama-3": "llama3",
}


def _field_names(cls) -> dict:
    """Parameter name as written in rope_parameters -> dataclass field name."""
    return {f.metadata.get("key", f.name): f.name for f in fields(cls)}


def from_parameters(parameters: dict) -> Scaling:
    """Build a scaling from HF-style rope_parameters (``rope_type`` or ``type`` names the
    scheme; ``rope_theta`` and ``partial_rotary_factor`` are ignored here: they belong to
    the convention). Unknown schemes or parameters raise ValueError."""
    params = dict(parameters)
    kind = str(params.pop("rope_type", params.pop("type", "default"))).lower()
    kind = ALIASES.get(kind, kind)
    if kind not in SCALINGS:
        raise ValueError(f"unknown scaling {kind!r}; known: {', '.join(SCALINGS)}")
    cls = SCALINGS[kind]
    names = _field_names(cls)
    for ignored in ("rope_theta", "partial_rotary_factor"):
        params.pop(ignored, None)
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ValueError(
            f"scaling {kind!r} takes {', '.join(sorted(names)) or 'no parameters'}; unknown: {', '.join(unknown)}"
        )
    return cls(**{names[k]: v for k, v in params.items()})


def parse(text: str) -> Scaling:
    """Parse a ``--scaling`` value: ``KIND`` or ``KIND:key=value,...`` (numbers), a JSON
    object of HF rope_parameters, or ``@path.json`` holding one."""
    text = text.strip()
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as handle:
            return from_parameters(json.load(handle))
    if text.startswith("{"):
        return from_parameters(json.loads(text))
    kind, _, rest = text.partition(":")
    params: dict = {"rope_type": kind}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"scaling parameter {item!r} is not key=value")
        params[key.strip()] = _number(value.strip())
    return from_parameters(params)


def _short(value) -> str:
    """A parameter as ``flag`` writes it: a float in its shortest form that reads back exactly."""
    if not isinstance(value, float):
        return str(value)
    text = f"{value:g}"
    return text if float(text) == value else repr(value)


def _number(value: str):
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(value)
    except ValueError:
        return float(value)
