"""The speed gate: a bench run against a saved one on the same device, or against another
target timed in the same run (``--against``).

What is compared is each block's median kernel time divided by the same block's median
copy of the same bytes (``runner.Row.ratios``): the copy runs interleaved with the kernel
on the same device, so a clock that is lower today, a warmer machine or a neighbour on
the memory bus moves both and cancels in the ratio. The test is one-sided (Mann-Whitney
U over the block ratios, ``timing.stats.shift``) with the Hodges-Lehmann shift and its
interval; a row fails only when it is significantly slower *and* by more than the
threshold (``--fail-slower``), and says "inconclusive" when the samples cannot tell
(``timing.stats.gate``).

The test's blocks come from one run, so it cannot see what changes from one run to the
next (another process on the machine's memory bus for a minute, where a process's
buffers landed): on a shared CPU two runs of one kernel can differ by 10 to 20 % with a
tiny p-value. A row that fails is therefore timed again in a new process (``confirmed``),
and fails only when that rerun is slower too (SGLang's nightly gate reruns on failure for
the same reason); one slower attempt and one not is "inconclusive", flagged, exit 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ropecheck.session.options import UsageError
from ropecheck.timing import records, stats


@dataclass(frozen=True)
class Baseline:
    """A saved run: its file, device and the block ratios of each row, by name."""

    path: str
    device: str
    ratios: dict


def load(path: str, device: str) -> Baseline:
    """The saved run at ``path``; UsageError when it is not one, or was made on another
    device (a speed is the device's: comparing across devices says nothing)."""
    try:
        doc = records.load(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--baseline {path}: {exc}") from None
    rows = [b for b in doc["benchmarks"] if "ratios" in b.get("extra_info", {})]
    devices = {b["extra_info"].get("device") for b in rows} - {None, ""}
    saved = doc.get("machine_info", {}).get("ropecheck_device") or (devices.pop() if len(devices) == 1 else None)
    if saved is None:
        raise UsageError(
            f"--baseline {path}: not a ropecheck bench run (no device named in its machine_info or its benchmarks)"
        )
    if saved != device:
        raise UsageError(
            f"--baseline {path} was measured on {saved!r}, this run is on {device!r}: a speed baseline compares "
            "runs on the same device only (save one here with --json)"
        )
    # by the row's name: ropecheck bench's, or a pytest item's (--rope-bench, --benchmark-save)
    ratios = {b["extra_info"].get("row", b["name"]): np.asarray(b["extra_info"]["ratios"], dtype=float) for b in rows}
    return Baseline(path, saved, ratios)


def judge(row, baseline: Optional[Baseline], threshold: float) -> None:
    """The row's gate (``row.gate``): against ``--against``'s arm in the same run, else
    against the baseline's row of the same name (none when it has none)."""
    if row.status != "timed" or row.samples is None:
        return
    if row.against is not None:
        before = row.samples.ratios("against", "copy")
    elif baseline is not None and row.name in baseline.ratios:
        before = baseline.ratios[row.name]
    else:
        if baseline is not None:
            row.notes.append(f"not in the baseline {baseline.path}: not gated")
        return
    row.gate = stats.gate(stats.shift(before, row.ratios), threshold)


def confirmed(first, again):
    """The verdict of a row that failed (``first``) after its rerun (``again``): the rerun,
    failed too ("slower, confirmed by a rerun"), else flagged inconclusive with both."""
    if again.status != "timed" or again.gate is None:
        return again
    if again.gate.failed:
        again.notes.append(f"slower in two runs: the first {first.gate.message}")
        return again
    said = (
        f"slower in one run ({first.gate.message}) but not in its rerun in a new process "
        f"({again.gate.message}): the machine's noise between runs, not a regression the samples can show"
    )
    again.gate = stats.Gate("inconclusive", said, again.gate.shift, False)
    return again
