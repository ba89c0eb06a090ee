"""How ``ropecheck identify`` shows its result: a summary, the evidence, the frequency
table when it says more than the flags, the flags line, and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ropecheck.report.output import environment

MAX_ROWS = 16  # frequency rows shown before eliding the middle


def summary_table(ident) -> Table:
    table = Table(title=f"ropecheck identify: {escape(ident.target)}", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("probe", f"{ident.dtype}, head_dim {ident.head_dim}, positions up to {ident.max_position}")
    table.add_row("pairing", ident.layout or "custom: " + " ".join(f"({a},{b})" for a, b in ident.pairs))
    table.add_row("direction", ident.direction)
    table.add_row(
        "rotary dim",
        str(ident.rotary_dim)
        if ident.rotary_dim is not None
        else f"{2 * len(ident.pairs)} (pass-through {ident.pass_through})",
    )
    if ident.base is not None:
        table.add_row("base", f"{ident.base:g} (+-{ident.base_error:.1e} relative)")
    if ident.scale is not None:
        table.add_row(
            "position scale",
            f"{ident.scale:g}" + ("" if ident.scale == 1.0 else f" (+-{ident.scale_error:.1e} relative)"),
        )
    table.add_row("frequencies", "geometric" if ident.geometric else "not geometric")
    table.add_row("amplitude", f"{ident.amplitude:.6g}")
    if ident.dynamic:
        table.add_row("dynamic", "yes: the frequencies depend on the call's positions")
    return table


def evidence_table(ident) -> Table:
    table = Table(
        title="evidence (ratio = deviation / error bound; <= 1 is what a correct kernel may do)", title_justify="left"
    )
    for column in ("test", "ratio", "detail"):
        table.add_column(column, justify="right" if column == "ratio" else "left")
    for e in ident.evidence:
        style = "red" if e.ratio > 1 and e.judged else ""
        table.add_row(e.test, f"[{style}]{e.ratio:.2g}[/]" if style else f"{e.ratio:.2g}", escape(e.detail))
    return table


def frequency_table(ident) -> Table:
    table = Table(title="frequencies theta_k (highest first)", title_justify="left")
    named = ident.named_scalings[0].split(":")[0] if ident.scaling_theta else ""
    for column in (
        "k",
        "pair",
        "theta_k",
        "+-",
        "base^(-2k/r)" if ident.base else "",
        f"{named} (float64)" if named else "",
    ):
        if column:
            table.add_column(column, justify="right")
    r = 2 * len(ident.pairs)
    rows: list[Optional[int]] = list(range(len(ident.theta)))
    if len(rows) > MAX_ROWS:
        rows = rows[: MAX_ROWS // 2] + [None] + rows[-MAX_ROWS // 2 :]
    for k in rows:
        if k is None:
            table.add_row("...", "", "", "")
            continue
        cells = [str(k), str(ident.pairs[k]), f"{ident.theta[k]:.9g}", f"{ident.theta_error[k]:.1g}"]
        if ident.base:
            cells.append(f"{ident.base ** (-2.0 * k / r) / (ident.scale or 1.0):.9g}")
        if named:
            cells.append(f"{ident.scaling_theta[k]:.9g}")
        table.add_row(*cells)
    return table


def print_refusal(console: Console, ident, what: str, axes: str = "") -> None:
    """Why ``ident`` is not what ``what`` names, with the evidence gathered until then."""
    console.print(
        f"[bold red]{what}[/] ({escape(ident.target)}, {axes}probed in "
        f"{ident.dtype or '-'}, head_dim {ident.head_dim or '-'}):"
    )
    for reason in ident.reasons:
        console.print(f"  {escape(reason)}", soft_wrap=True)
    if ident.evidence:
        console.print(evidence_table(ident))


def print_identification(console: Console, ident) -> None:
    if not ident.rotary:
        print_refusal(console, ident, "not a rotary embedding")
        return
    console.print(summary_table(ident))
    console.print(evidence_table(ident))
    if not ident.geometric or ident.dynamic or ident.layout is None:
        console.print(frequency_table(ident))
    for note in ident.notes:
        console.print(f"[yellow]note[/] {escape(note)}", soft_wrap=True)
    ratio = ident.worst_ratio
    console.print(
        f"confidence: [bold]{ident.confidence}[/] (worst test at {ratio:.2g} of its "
        f"error bound" + (f"; base to {ident.base_error:.1e} relative" if ident.base_error is not None else "") + ")"
    )
    if ident.flags:
        console.print(f"flags: {ident.flags}", soft_wrap=True)
        if ident.direction != "counter-clockwise":
            console.print(
                "[yellow]note[/] ropecheck check has no flag for the direction: "
                "the reference check fails on this target (sign of rotation)"
            )
    else:
        console.print("flags: [yellow]none of --layout/--base/--rotary-dim describes this map[/]")
    if ident.scaling and ident.scaling not in ident.flags:
        console.print(f"scaling: {ident.scaling}", soft_wrap=True)
    for other in ident.named_scalings[1:]:
        console.print(f"[yellow]note[/] also verified: --scaling {escape(other)}", soft_wrap=True)


def _plain(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(type(value).__name__)


def write_json(path, ident) -> None:
    data = {"identification": ident.to_json(), "environment": environment()}
    Path(path).write_text(json.dumps(data, indent=2, default=_plain) + "\n")


def pair_table(ident) -> Table:
    table = Table(title="pairs (first -> second turns by theta x_axis + phase)", title_justify="left")
    for column in ("first", "second", "axis", "theta", "+-", "phase"):
        table.add_column(column, justify="right")
    rows: list[Optional[int]] = list(range(len(ident.pairs)))
    if len(rows) > MAX_ROWS:
        rows = rows[: MAX_ROWS // 2] + [None] + rows[-MAX_ROWS // 2 :]
    for k in rows:
        if k is None:
            table.add_row("...", "", "", "", "", "")
            continue
        first, second, axis, theta, phase = ident.pairs[k]
        table.add_row(str(first), str(second), str(axis), f"{theta:.9g}", f"{ident.theta_error[k]:.1g}", f"{phase:.6g}")
    return table


def print_nd_identification(console: Console, ident) -> None:
    """An N-D identification (``identification.nd``): the probe, the pairs per axis, the
    evidence, the declaration found as flags, or the pair table."""
    if not ident.rotary:
        print_refusal(console, ident, "not an N-D rotary embedding ropecheck can name", f"{ident.n_axes} axes, ")
        return
    per_axis = [sum(1 for row in ident.pairs if row[2] == a) for a in range(ident.n_axes)]
    summary = Table(title=f"ropecheck identify: {escape(ident.target)}", title_justify="left", show_header=False)
    summary.add_column("what")
    summary.add_column("value")
    summary.add_row(
        "probe",
        f"{ident.dtype}, head_dim {ident.head_dim}, {ident.n_axes} axes, positions up to {ident.max_position} per axis",
    )
    summary.add_row("pairs per axis", ", ".join(map(str, per_axis)) + f" (pass-through {len(ident.pass_through)})")
    summary.add_row("declaration", ident.family if ident.family != "pairs" else "pair table")
    console.print(summary)
    console.print(evidence_table(ident))
    console.print(pair_table(ident))
    for note in ident.notes:
        console.print(f"[yellow]note[/] {escape(note)}", soft_wrap=True)
    console.print(f"confidence: [bold]{ident.confidence}[/] (worst test at {ident.worst_ratio:.2g} of its error bound)")
    console.print(f"flags: {escape(ident.flags)}", soft_wrap=True)
    if ident.table_path:
        console.print(f"pair table written to {escape(ident.table_path)}", soft_wrap=True)
    elif ident.family == "pairs":
        console.print("pair table (save it as FILE.json, or rerun with --write-table FILE.json):")
        print(table_json(ident.table))


def table_json(table: dict) -> str:
    """A pair table as JSON, one pair per line (on one line, a wide head's table ran to
    hundreds of numbers)."""
    compact = (",", ":")
    head = json.dumps({k: v for k, v in table.items() if k != "pairs"}, separators=compact)
    pairs = ",\n".join(json.dumps(pair, separators=compact) for pair in table["pairs"])
    return f'{head[:-1]},"pairs":[\n{pairs}\n]}}'
