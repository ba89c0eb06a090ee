"""The likely cause of a ``reference`` failure in the words of the library interface the
target is called through (``--api``): the argument at fault, not the canonical effect.

``properties.diagnosis`` finds which usual suspect (``properties.suspects``) fits the
target's output on its probe; for a target behind an interface this module

- adds the suspects only a table-fed interface has: cos and sin swapped (each pair turned
  by pi/2 - m theta_i: y = (a sin - b cos, b sin + a cos)), and a half-width table read as
  full width (only the first r/2 features rotated, as pairs of a rotary dimension r/2,
  by the first r/4 frequencies);
- says what the fitted suspect means for the interface's arguments: a position off by k
  is row p + k of the table read for the token at position p; row 0's positions in every
  row are batch row 0's offsets (or table rows) used for every row; a whole head rotated
  is the rotary dimension (the table's width) not applied.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np

from ropecheck.properties.suspects import Candidate, Model, Probe, rotation


def _interface(probe: Probe):
    return getattr(probe.ctx.target, "interface", None)


def _swapped(probe: Probe, _) -> Optional[Model]:
    """cos and sin exchanged: the rotation by pi/2 - m theta_i (exact float64), allowed
    what the reference allows a correct kernel."""
    conv, x, m = probe.convention, probe.x64, probe.positions
    reference = rotation(probe)
    theta = conv.theta(probe.head_dim, m)
    phi = m[..., None, None] * theta  # (batch, seq, 1, r/2)
    i, j = probe.pairs()
    c, s = np.sin(phi), np.cos(phi)
    y = reference.y.copy()
    y[..., i] = x[..., i] * c - x[..., j] * s
    y[..., j] = x[..., j] * c + x[..., i] * s
    return Model(y, reference.bound, positions=m)


def _half_as_full(probe: Probe, _) -> Optional[Model]:
    """A (P, r/2) table read as (P, r): the kernel takes r/2 for the rotary dimension and
    rotates the first r/2 features, paired for r/2, pair i by the table's column i, at
    theta_i = base^(-2i/r) = (base^(1/2))^(-2i/(r/2)): the declared rotation with rotary
    dim r/2 and base sqrt(base) (the unscaled frequencies only)."""
    conv = probe.convention
    r = probe.rotary
    if r % 4 or conv.scaling.rope_type != "default":
        return None
    return rotation(probe, replace(conv, rotary_dim=r // 2, base=conv.base**0.5))


def candidates(probe: Probe) -> tuple:
    """The suspects the target's interface adds (none without a cos/sin table)."""
    iface = _interface(probe)
    table = getattr(iface, "table", None)
    if table is None or table.kind != "cos-sin":
        return ()
    name = table.argument
    verb = "are" if " and " in name else "is"
    out = [
        Candidate(
            "cos-sin-swapped",
            _swapped,
            lambda p, _: (
                f"cos and sin are swapped: {name}'s cos values are used as sin and its sin values as cos",
                "the reference turned by pi/2 - m theta_i",
            ),
        )
    ]
    if table.width == "half":
        out.append(
            Candidate(
                "half-table-as-full",
                _half_as_full,
                lambda p, _: (
                    f"{name} ({p.rotary // 2} columns, one per frequency) {verb} read as a full-width table: "
                    f"the target takes rotary_dim = {p.rotary // 2} and rotates features 0 .. {p.rotary // 2 - 1} "
                    "only",
                    f"the reference of rotary_dim {p.rotary // 2} with the table's first {p.rotary // 4} columns",
                ),
            )
        )
    return tuple(out)


def _token(probe: Probe, shift: int) -> tuple:
    """(token index, position): a token of batch row 0 whose table row p + shift exists."""
    row = probe.positions[0]
    for s, p in enumerate(row.tolist()):
        if p > 0 and p + shift >= 0:
            return s, int(p)
    return 0, int(row[0])


def cause(probe: Probe, name: str, option, text: str) -> str:
    """``text`` (a suspect's cause) in the interface's words, where it has some."""
    iface = _interface(probe)
    if iface is None:
        return text
    table = iface.table
    positions = iface.word("positions")
    offsets = getattr(probe.ctx.target, "row_offsets", False)
    if name == "offset" and table is not None and table.by == "position":
        token, p = _token(probe, option)
        return (
            f"row {p + option} of {table.argument} is read for token {token} at position {p} (every token's "
            f"row is off by {option:+d}): {text}"
        )
    if name == "offset":
        return f"{text} ({positions} as the target reads it)"
    if name == "first-row-positions":
        what = f"batch row 0's {positions}" if offsets else f"batch row 0's {positions} (and table rows)"
        return f"{what} are used for every row: {text}"
    if name == "positions-ignored" and offsets:
        return f"{positions} is ignored (every row starts at 0): {text}"
    if name == "whole-head":
        width = f"the {table.argument} width" if table is not None else iface.word("rotary_dim", "rotary_dim")
        return f"{width} is not applied, every feature rotated: {text}"
    if name == "layout":
        return f"{text} (the target ignores {iface.word('layout', 'its layout argument')})"
    return text


OFFSET_STARTS = (100, 2049)  # the probe's two rows' offsets: distinct, neither 0


def table_probe_positions(base: np.ndarray, counts_up: bool, limit: int) -> np.ndarray:
    """The probe's positions for an interface that takes positions as offsets (each row
    counting up from its own, ``OFFSET_STARTS``, within ``limit``): rows as long as
    ``base``'s; else ``base`` itself."""
    if not counts_up:
        return base
    n = base.shape[1]
    starts = [max(min(s, limit - n + 1), 0) for s in OFFSET_STARTS]
    return np.array([[s + i for i in range(n)] for s in starts], dtype=np.int64)


__all__ = ["candidates", "cause", "table_probe_positions"]
