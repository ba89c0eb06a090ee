"""What a table builder returned, read and judged against float64 (``table_builder_checks``).

A table builder is the half of a production RoPE that turns positions into cos/sin (where
the scalings live); its tables are read here as float64 cos and sin, one row per position
and one column per frequency (or each frequency twice, as the layout pairs features), and
compared entry by entry with A cos(m theta_i), A sin(m theta_i) of the declared convention
(A: the scaling's attention factor). The error model (docs/tolerance.md, "Table
builders"): the angle m theta_i formed in float32 as a kernel forms it
(``ErrorModel.declared_angle_error``), cos and sin of it to 2 ulp (4 u32), A rounded to
float32 and multiplied in (2 u32), the result rounded to the table's dtype (u_out):

    |c_out - A cos(m theta_i)| <= A (dphi_i + 6 u32 + u_out) + floor   (likewise sin)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ropecheck.properties.assertions import CheckFailure
from ropecheck.properties.convention import Convention
from ropecheck.properties.core.dtypes import UNIT_ROUNDOFF, dtype_name
from ropecheck.properties.tolerance import U32, ErrorModel

VALUE_OPS = 6.0  # cos or sin to 2 ulp (4 u32), A rounded to float32 (u32), A times it (u32)


@dataclass(frozen=True)
class TableConvention(Convention):
    """A builder's convention: the 1-D one (layout, base, rotary_dim r, scaling), and
    whether --layout was given (a table of r columns, each frequency twice, needs it)."""

    layout_given: bool = True


@dataclass(frozen=True)
class Built:
    """A builder's result read: cos and sin (rows, columns) in float64, the dtype they came
    in, whether each frequency is there twice (r columns, paired as the layout pairs
    features: ``full``) and whether the rows are a cos_sin_cache's (row p: position p)."""

    cos: np.ndarray
    sin: np.ndarray
    dtype: str
    full: bool = False
    cache: bool = False


def _kind(out) -> str:
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)}"
    return type(out).__name__


def _values(name: str, t) -> tuple[np.ndarray, str]:
    """A returned table as float64, and its dtype's name (one ropecheck knows)."""
    if isinstance(t, torch.Tensor):
        values, dtype = t.detach().cpu().to(torch.float64).numpy().copy(), dtype_name(t.dtype)
    elif isinstance(t, np.ndarray) and t.dtype.kind == "f":
        values, dtype = t.astype(np.float64), str(t.dtype)
    else:
        of = f" of dtype {t.dtype}" if hasattr(t, "dtype") else ""
        raise CheckFailure(f"{name} is {_kind(t)}{of}, expected a float tensor")
    if dtype not in UNIT_ROUNDOFF:
        raise CheckFailure(f"{name} has dtype {dtype}, expected a float dtype ({', '.join(UNIT_ROUNDOFF)})")
    bad = np.argwhere(~np.isfinite(values))
    if len(bad):
        raise CheckFailure(f"{name} is not finite: {values[tuple(bad[0])]} at {tuple(int(i) for i in bad[0])}")
    return values, dtype


def read_table(out, n: int, conv: TableConvention) -> Built:
    """build(positions)'s result: (cos, sin) of one float dtype, each (n, r/2) or (n, r)."""
    r = conv.rotary_dim or 0
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise CheckFailure(f"build(positions) returned {_kind(out)}, expected a tuple (cos, sin)")
    (cos, c_dtype), (sin, s_dtype) = _values("cos", out[0]), _values("sin", out[1])
    for name, a in (("cos", cos), ("sin", sin)):
        if a.shape not in ((n, r // 2), (n, r)):
            raise CheckFailure(
                f"{name} has shape {a.shape}, expected ({n}, {r // 2}) (one column per frequency) or ({n}, {r}) "
                f"(each frequency twice) for {n} positions at --rotary-dim {r}"
            )
    if cos.shape != sin.shape or c_dtype != s_dtype:
        raise CheckFailure(f"cos is {cos.shape} {c_dtype} but sin {sin.shape} {s_dtype}: expected one shape and dtype")
    full = cos.shape[1] == r
    if full and not conv.layout_given:
        raise CheckFailure(
            f"cos and sin have {r} columns, each frequency twice: say how they are laid out with --layout half "
            "(cat(f, f)) or --layout interleaved (repeat_interleave(f, 2))"
        )
    return Built(cos, sin, c_dtype, full)


def read_cache(out, length: int, conv: TableConvention) -> Built:
    """build(max_position)'s result: cos_sin_cache (max_position, r), row p = cat(cos, sin)."""
    r = conv.rotary_dim or 0
    if not isinstance(out, (torch.Tensor, np.ndarray)):
        raise CheckFailure(f"build(max_position) returned {_kind(out)}, expected a tensor cos_sin_cache")
    cache, dtype = _values("cos_sin_cache", out)
    if cache.shape != (length, r):
        raise CheckFailure(
            f"cos_sin_cache has shape {cache.shape}, expected ({length}, {r}) for max_position {length}: "
            f"row p = cat(cos(p theta), sin(p theta)), {r // 2} columns each"
        )
    return Built(cache[:, : r // 2], cache[:, r // 2 :], dtype, cache=True)


# --- the reference and the bound -------------------------------------------------------


def expected(conv: Convention, positions: np.ndarray, seq_len: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
    """A cos(m theta_i), A sin(m theta_i) in float64, (n, r/2)."""
    r = conv.rotary_dim or 0
    phi = np.asarray(positions, np.float64)[:, None] * conv.theta(r, positions, seq_len)
    return conv.amplitude * np.cos(phi), conv.amplitude * np.sin(phi)


def value_bound(conv: Convention, positions: np.ndarray, seq_len: Optional[int], dtype: str) -> np.ndarray:
    """A (dphi_i + 6 u32 + u_out) + floor per entry, (n, r/2)."""
    model = ErrorModel(dtype)
    dphi = model.declared_angle_error(np.asarray(positions), conv, conv.rotary_dim or 0, seq_len)
    return conv.amplitude * (dphi + VALUE_OPS * U32 + UNIT_ROUNDOFF[dtype]) + model.floor


def widen(a: np.ndarray, layout: str) -> np.ndarray:
    """Per-frequency columns as a full table: cat(f, f) (half), repeat_interleave(f, 2)."""
    return np.concatenate([a, a], axis=-1) if layout == "half" else np.repeat(a, 2, axis=-1)


def _as_built(pair, built: Built, layout: str) -> tuple[np.ndarray, np.ndarray]:
    return tuple(widen(a, layout) if built.full else a for a in pair)  # type: ignore[return-value]


def _entry(built: Built, name: str, row: int, col: int, positions, layout: str) -> str:
    r = 2 * built.cos.shape[1] if not built.full else built.cos.shape[1]
    freq = (col % (r // 2) if layout == "half" else col // 2) if built.full else col
    if built.cache:
        column = col + (r // 2 if name == "sin" else 0)
        return f"row {row} of cos_sin_cache, column {column} ({name} of frequency {freq})"
    where = f"column {col} (frequency {freq})" if built.full else f"frequency {freq}"
    return f"{name}[token {row}, {where}] at position {int(positions[row])}"


def compare(built: Built, cos, sin, bound, positions, layout: str, what: str = "") -> tuple[float, str]:
    """(the largest |error| / bound, the worst entry described: '' when all are within)."""
    ratios = [
        np.abs(got - want) / np.maximum(bound, np.finfo(np.float64).tiny)
        for got, want in ((built.cos, cos), (built.sin, sin))
    ]
    worst = max(float(r.max(initial=0.0)) for r in ratios)
    if worst <= 1.0:
        return worst, ""
    k = int(np.argmax([r.max(initial=0.0) for r in ratios]))
    row, col = np.unravel_index(int(np.argmax(ratios[k])), ratios[k].shape)
    name, got, want = ("cos", built.cos, cos) if k == 0 else ("sin", built.sin, sin)
    bad = sum(int(np.count_nonzero(r > 1.0)) for r in ratios)
    return worst, (
        f"{_entry(built, name, int(row), int(col), positions, layout)} = {got[row, col]:.9g}, expected "
        f"{want[row, col]:.9g}{what} (error {worst:.3g} x the bound {bound[row, col]:.3g}); "
        f"{bad} of {2 * got.size} entries outside"
    )


def judge(built: Built, conv: TableConvention, positions: np.ndarray, seq_len: Optional[int]) -> float:
    """Every entry against the float64 reference; CheckFailure naming the worst one, and
    the likely cause where a cheap one fits."""
    bound = value_bound(conv, positions, seq_len, built.dtype)
    cos, sin = _as_built(expected(conv, positions, seq_len), built, conv.layout)
    full_bound = widen(bound, conv.layout) if built.full else bound
    worst, where = compare(built, cos, sin, full_bound, positions, conv.layout)
    if not where:
        return worst
    cause = likely_cause(built, conv, positions, seq_len, bound)
    raise CheckFailure(where + (f"; likely: {cause}" if cause else ""), error=worst)


def likely_cause(built: Built, conv: TableConvention, positions, seq_len, bound) -> str:
    """The first cheap explanation that fits every entry within the bound ('' for none)."""
    positions = np.asarray(positions, np.int64)
    rows = "row p holds position" if built.cache else "the table at position m holds position"
    right = expected(conv, positions, seq_len)
    candidates: list = [
        (f"{rows} {'p' if built.cache else 'm'} + 1", expected(conv, positions + 1, seq_len)),
        (f"{rows} {'p' if built.cache else 'm'} - 1", expected(conv, positions - 1, seq_len)),
        ("cos and sin swapped", (right[1], right[0])),
        ("sin negated (a clockwise rotation)", (right[0], -right[1])),
    ]
    if conv.amplitude != 1.0:
        candidates.append(
            (
                f"the attention factor {conv.amplitude:.6g} missing (cos and sin unscaled)",
                tuple(a / conv.amplitude for a in right),
            )
        )
    for other, why in _other_lengths(conv, seq_len):
        candidates.append((why, expected(conv, positions, other)))
    layouts = [conv.layout] + ([next(x for x in ("half", "interleaved") if x != conv.layout)] if built.full else [])
    for layout in layouts:
        for why, pair in [("", right)] * (layout != conv.layout) + candidates:
            cos, sin = (widen(a, layout) for a in pair) if built.full else pair
            b = widen(bound, layout) if built.full else bound
            if not compare(built, cos, sin, b, positions, layout)[1]:
                if layout == conv.layout:
                    return why
                said = {
                    "half": "cat(f, f) (--layout half)",
                    "interleaved": "repeat_interleave(f, 2) (--layout interleaved)",
                }
                return f"each frequency laid out as {said[layout]}, not as --layout {conv.layout} says" + (
                    f", and {why}" if why else ""
                )
    return ""


def _other_lengths(conv: Convention, seq_len: Optional[int]) -> list:
    """(sequence length, what taking it means) for a scaling whose theta depends on it."""
    if not conv.dynamic or not seq_len:
        return []
    out = []  # the switches first: the most specific cause
    for L in conv.scaling.switches():
        if seq_len > L:
            out.append(
                (L, f"the frequencies of sequence length <= {L} at length {seq_len}: the switch past {L} not taken")
            )
        else:
            out.append((L + 1, f"the frequencies of sequence length > {L} at length {seq_len}: switched before {L}"))
    out.append(
        (seq_len - 1, f"the frequencies of sequence length {seq_len - 1}: the largest position taken as the length")
    )
    out.append((seq_len + 1, f"the frequencies of sequence length {seq_len + 1}: one past the call's ({seq_len})"))
    return out


def same_tables(first: Built, again: Built, conv: Convention, positions, what: str) -> float:
    """Two results of one call (before and after other calls) agree within both calls'
    arithmetic (no angle term: the same call forms the same angles)."""
    if first.cos.shape != again.cos.shape or first.dtype != again.dtype or first.full != again.full:
        raise CheckFailure(f"{what}: {again.cos.shape} {again.dtype} tables, {first.cos.shape} {first.dtype} before")
    unit = conv.amplitude * (VALUE_OPS * U32 + UNIT_ROUNDOFF[first.dtype]) + ErrorModel(first.dtype).floor
    bound = np.full(first.cos.shape, 2 * unit)
    worst, where = compare(again, first.cos, first.sin, bound, positions, conv.layout, " (as before)")
    if where:
        raise CheckFailure(f"{what}: {where}", error=worst)
    return worst
