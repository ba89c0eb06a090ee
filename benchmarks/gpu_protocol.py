"""How GPU RoPE kernels are timed, what bytes they are credited with, how accurate they are,
and the table the GPU benchmark run prints.

Timing: CUDA events around one call, L2 flushed before every round by zeroing a 256 MiB
buffer (more than 4x the L2 of an H100 or H200); the median round. The same protocol
times a device-to-device copy of the bytes the kernel reads, in the same run, so each
kernel is reported as GB/s and as % of copy bandwidth.

Bytes model: read q and k, write q and k (out of place with partial rotary the
pass-through features are read and written too; in place only the rotated ones), plus
the side input the implementation actually reads: int64 positions, or its cos/sin rows.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np
import torch

from ropecheck import reference

FLUSH_BYTES = 256 * 2**20
ERROR_POSITIONS = (10**3, 10**5, 10**6)
ERROR_TOKENS = 64


class CudaClock:
    """A pytest-benchmark timer measuring GPU time on the current stream.

    pytest-benchmark reads its timer twice per round (before and after the call) and
    records the difference; calls alternate: the first records a start event (no wait, so
    the GPU is still busy with the L2 flush while the call is enqueued), the second an end
    event, waits for it, and returns the previous reading plus the elapsed event time."""

    def __init__(self):
        self.seconds = 0.0
        self.start = None

    def __call__(self) -> float:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        if self.start is None:
            self.start = event
            return self.seconds
        event.synchronize()
        self.seconds += self.start.elapsed_time(event) / 1e3
        self.start = None
        return self.seconds


_flush_buffer: dict = {}


def flush_l2() -> None:
    """Evict the L2 cache: write a buffer larger than it (pytest-benchmark setup hook)."""
    if "buffer" not in _flush_buffer:
        _flush_buffer["buffer"] = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    _flush_buffer["buffer"].zero_()


def gpu_seconds(fn, rounds: int = 30) -> float:
    """Median GPU time of fn() under the same protocol (flush, events), outside pytest-benchmark."""
    clock, times = CudaClock(), []
    fn()
    for _ in range(rounds):
        flush_l2()
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


_copy_cache: dict = {}


def copy_bandwidth(nbytes: int) -> float:
    """Bytes/s of a device-to-device copy of ``nbytes`` (counted as read + write)."""
    if nbytes not in _copy_cache:
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        _copy_cache[nbytes] = 2 * nbytes / gpu_seconds(lambda: dst.copy_(src))
    return _copy_cache[nbytes]


def qk_bytes(q: torch.Tensor, k: torch.Tensor, rotary_dim: int, inplace: bool) -> tuple[int, int]:
    """(bytes read, bytes written) of q and k: all of them, or only the rotated features
    when rotating in place."""
    touched = sum(t.numel() for t in (q, k)) * q.element_size()
    if inplace:
        touched = touched * rotary_dim // q.shape[-1]
    return touched, touched


def max_error(apply, x_shape_heads, head_dim, rotary_dim, layout, dtype, device, start) -> float:
    """Largest |y - y_ref| per unit of the rotated pair's magnitude, over ERROR_TOKENS tokens
    at positions start .. start + ERROR_TOKENS - 1 (one row), against the float64 reference.
    ``apply(q, k, positions) -> (q_out, k_out)`` with q, k (1, tokens, heads, head_dim)."""
    heads_q, heads_k = x_shape_heads
    generator = torch.Generator().manual_seed(start)
    q64 = torch.randn(1, ERROR_TOKENS, heads_q, head_dim, generator=generator, dtype=torch.float64)
    k64 = torch.randn(1, ERROR_TOKENS, heads_k, head_dim, generator=generator, dtype=torch.float64)
    q, k = q64.to(dtype).to(device), k64.to(dtype).to(device)
    positions = torch.arange(start, start + ERROR_TOKENS, device=device)[None, :]
    q_out, k_out = apply(q.clone(), k.clone(), positions)
    first, second = reference.pair_indices(rotary_dim, layout)
    errors = []
    for x, y in ((q, q_out), (k, k_out)):
        x64 = x.double().cpu().numpy()
        expected = reference.apply_rope(x64, positions.cpu().numpy(), layout=layout,
                                        rotary_dim=rotary_dim)
        diff = np.abs(y.double().cpu().numpy() - expected)
        rho = np.hypot(x64[..., first], x64[..., second])
        errors.append(np.max(np.maximum(diff[..., first], diff[..., second]) / rho))
    return float(np.max(errors))  # NaN (a broken output) propagates


@dataclass
class Row:
    """One line of the summary table."""

    config: str
    implementation: str
    info: dict = field(default_factory=dict)


ROWS: list[Row] = []


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(rows: list[Row]):
    """A rich table: configs x implementations, time, GB/s, % of copy, errors by position."""
    from rich.table import Table

    table = Table(title="GPU RoPE: median time (L2 flushed), bandwidth, max error vs float64 "
                        "(per unit of pair magnitude)")
    for column in ("config", "implementation", "us", "GB/s", "% copy",
                   *(f"err@{p:.0e}" for p in ERROR_POSITIONS), "note"):
        table.add_column(column, justify="left" if column in ("config", "implementation", "note") else "right")
    for row in rows:
        i = row.info
        table.add_row(row.config, row.implementation,
                      _cell(i.get("median_s") and i["median_s"] * 1e6, ".1f"),
                      _cell(i.get("gb_per_s"), ".0f"), _cell(i.get("percent_of_copy"), ".1f"),
                      *(_cell(i.get(f"max_error_at_{p}"), ".2e") for p in ERROR_POSITIONS),
                      i.get("note", ""))
    return table
