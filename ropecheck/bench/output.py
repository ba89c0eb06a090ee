"""What a bench run prints (a rich table, one row per shape and dtype) and writes
(``--json``: pytest-benchmark's file format, ``timing.records``, so that
``pytest-benchmark compare`` and CI dashboards read it; each benchmark's ``extra_info``
carries what a ``--baseline`` needs: the block ratios, the bytes, the copy)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from ropecheck.bench.runner import Row
from ropecheck.timing import records


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.3g}" if seconds < 1e-3 else f"{seconds * 1e6:,.0f}"


def _against(row: Row) -> str:
    if row.gate is None:
        return ""
    s = row.gate.shift
    colour = {"slower": "red", "faster": "green", "inconclusive": "yellow"}.get(row.gate.verdict, "")
    text = f"{100 * s.estimate:+.1f} % [{100 * s.low:+.1f}, {100 * s.high:+.1f}] {row.gate.verdict}"
    return f"[{colour}]{text}[/]" if colour else text


def table(rows: list, title: str, compared: str = "") -> Table:
    """Median time per call and its 95 % interval, GB/s, % of the same-run copy (or
    launch-bound), the host's wall time per eager call, and the change against
    ``compared`` (a baseline or the --against target)."""
    t = Table(title=title, title_justify="left")
    for name in ("shape", "dtype", "timer", "us", "95 % CI", "GB/s", "% copy", "host us"):
        t.add_column(name, justify="left" if name in ("shape", "dtype", "timer") else "right")
    if compared:
        t.add_column(f"vs {compared}", justify="right")
    for row in rows:
        if row.status != "timed":
            cells = [row.shape.name, row.dtype, f"[red]{row.status}[/]", "", "", "", "", ""]
        else:
            lo, hi = row.interval
            copy = "launch-bound" if row.launch_bound else f"{row.percent_of_copy:.1f}"
            host = _us(sum(row.host) / len(row.host)) if row.host else ""
            cells = [
                row.shape.name,
                row.dtype,
                row.timer,
                _us(row.median),
                f"{_us(lo)} .. {_us(hi)}",
                f"{row.gb_per_s:.1f}",
                copy,
                host,
            ]
        t.add_row(*cells, *([_against(row)] if compared else []))
    return t


def extra_info(row: Row, target: str) -> dict:
    """What a timed row's benchmark carries besides its samples: the bytes, the copy, the
    block ratios a --baseline compares, the host time, the notes, the gate's verdict."""
    s = row.samples
    assert s is not None
    info = {
        "row": row.name,
        "device": row.device,
        "target": target,
        "timer": row.timer,
        "bytes_moved": row.traffic.moved,
        "bytes": dict(row.traffic.parts),
        "gb_per_s": row.gb_per_s,
        "copy_median_s": row.copy_median,
        "percent_of_copy": None if row.launch_bound else row.percent_of_copy,
        "launch_bound": row.launch_bound,
        "launch_s": row.launch,
        "host_s_per_call": (sum(row.host) / len(row.host)) if row.host else None,
        "ratios": [float(r) for r in row.ratios],
        "copy_samples": [float(t) for t in s.arms["copy"]],
        "blocks": s.blocks,
        "stopped": s.stopped,
        "notes": list(row.notes),
        **row.info,
    }
    if row.gate is not None:
        info["gate"] = {"verdict": row.gate.verdict, "message": row.gate.message, "against": row.against or "baseline"}
    return info


def entry(row: Row, target: str) -> dict:
    """One timed row as a pytest-benchmark benchmark."""
    m, s = row.shape.model, row.samples
    assert s is not None
    info = extra_info(row, target)
    params = {
        "dtype": row.dtype,
        "step": row.shape.step,
        "tokens": row.shape.tokens,
        "sequences": row.shape.sequences,
        "heads": f"{m.q_heads}/{m.k_heads}",
        "head_dim": m.head_dim,
        "rotary_dim": m.rotary_dim or m.head_dim,
    }
    return records.entry(
        row.name,
        row.shape.step,
        list(s.arms["call"]),
        fullname=f"{target}::{row.name}",
        params=params,
        extra_info=info,
        options={"timer": row.timer, "min_time": 0.0},
    )


def write(path: str, rows: list, target: str, device: str, device_name: str, left_out: list) -> None:
    """The run as a pytest-benchmark file; rows not timed (wrong, failed) under
    ``ropecheck.not_timed`` (pytest-benchmark reads only ``benchmarks``)."""
    timed = [entry(r, target) for r in rows if r.status == "timed"]
    doc = records.document(timed, records.machine_info(device, device_name))
    doc["ropecheck"] = {
        "target": target,
        "not_timed": [{"name": r.name, "status": r.status, "message": r.message} for r in rows if r.status != "timed"],
        "left_out": [{"name": n, "why": why} for n, why in left_out],
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1))
