"""What the checks read of a library interface a target is called through (``--api``):
the table it is fed instead of computing its angles (its kind and dtype: the error model),
the memory layouts and call variants its tensors come in, the fp8 formats it quantizes its
outputs to, and the names its arguments have (a failure names the one at fault)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ropecheck.properties.interfaces.space import Space


@dataclass(frozen=True)
class Table:
    """The table a table-fed interface takes instead of computing its angles: ropecheck
    makes it from the float64 angles of the declared convention and rounds it to ``dtype``
    (the error model then allows that rounding and the arithmetic, no angle error).

    ``kind``: "cos-sin" (cos and sin values) or "angles" (m theta_i, TransformerEngine's
    freqs); ``dtype``: its dtype, "" for the input's own; ``by``: "position" (row p holds
    position p: a cos_sin_cache, flash-attn's cos/sin, TE's freqs) or "token" (one row per
    token: HF's cos/sin); ``width``: "half" (one column per frequency, r/2) or "full" (r,
    each frequency twice, paired as the layout pairs features); ``argument``: what the
    interface calls it."""

    kind: str
    argument: str
    dtype: str = ""
    by: str = "position"
    width: str = "half"

    def dtype_for(self, dtype: str) -> str:
        return self.dtype or dtype


@dataclass(frozen=True)
class Interface:
    """What the checks read of the library interface a target is called through (its
    preset, ``ropecheck.calling.presets``): the table it is fed (None: it computes its own
    angles), its argument space (``space``: the classes of values its parameters take in
    its library's callers, the memory layouts, tensor formats and position dtypes among
    them: each input is drawn in a row of its plan, ``properties.interfaces.space``), the
    fp8 formats it quantizes its outputs to (``quantized``: the ``quantize_dtype`` class of
    a call names one; the checks read the dequantized outputs,
    ``properties.core.quantization``), the norm it applies to q and k before rotating them
    (``norm``: the checks read the rotation of the normalised heads,
    ``properties.core.normalization``), and what it names its arguments."""

    name: str
    table: Optional[Table] = None
    space: Space = Space(())
    quantized: tuple = ()
    norm: str = ""  # "rms": an RMSNorm of each q and k head before the rotation (properties.core.normalization)
    words: dict = field(default_factory=dict, compare=False)

    def output_format(self, choices=()) -> str:
        """The fp8 format a call with ``choices`` (a case's) quantizes to ("" none)."""
        if not self.quantized:
            return ""
        name = dict(choices).get("quantize_dtype", "")
        return name if name in self.quantized else self.quantized[0]

    def word(self, role: str, default: str = "") -> str:
        """The interface's name for an argument role: positions, query, key, table, ..."""
        if role == "table" and self.table is not None:
            return self.table.argument
        return self.words.get(role, default or role)
