"""Samples from several arms, interleaved in blocks, until the median settles.

An arm is one thing timed (the kernel, the copy yardstick, a baseline kernel): a callable
that takes n and returns n samples in seconds (it may run them in another process).
``interleave`` asks every arm for ``block`` samples per block, in an order shuffled anew
each block, so that a slow drift of the machine (a clock ramping down, a neighbour starting
up) falls on every arm alike, and so that no arm is always the one run second: in an A/B
comparison the second one runs on what the first left behind (a warmer or hotter chip), a
bias that a fixed order turns into a false difference (TileOPs #2110).

It stops at the first of:

- "settled": after at least ``min_blocks`` blocks, the distribution-free interval of the
  median (``stats.median_interval`` at ``confidence``) is narrower than ``settle`` times the
  median: for the per-block ratios of ``watch`` = (arm, yardstick), or, with ``watch`` None,
  for every arm's block medians. At 95 % that takes at least 6 blocks (with fewer the
  interval is the whole range), hence ``min_blocks`` = 6;
- "sample limit": ``max_blocks`` blocks done;
- "time limit": ``budget_s`` of ``clock`` time gone, checked after each block (always at
  least one block is done; a run may go over its budget by one block).

The unit of the statistics is the block: a block's median is robust to the odd slow sample,
and its ratio to the yardstick's median in the same block cancels what the two shared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ropecheck.timing import stats

Arm = Callable[[int], list[float]]


@dataclass
class Samples:
    """What ``interleave`` took."""

    arms: dict[str, list[float]]  # arm name -> every sample (seconds), in the order taken
    block: int  # samples per arm per block
    blocks: int  # completed blocks
    stopped: str  # "settled", "time limit", "sample limit"
    seconds: float  # wall time spent

    def block_medians(self, arm: str) -> np.ndarray:
        """The median of each block's samples of ``arm``."""
        return stats.block_medians(self.arms[arm], self.block)

    def ratios(self, arm: str, yardstick: str) -> np.ndarray:
        """Per block: the median of ``arm`` over the median of ``yardstick`` in the same block."""
        return self.block_medians(arm) / self.block_medians(yardstick)


def _settled(samples: Samples, watch: tuple[str, str] | None, settle: float, confidence: float) -> bool:
    if watch is not None:
        series = [samples.ratios(*watch)]
    else:
        series = [samples.block_medians(arm) for arm in samples.arms]
    return all(stats.relative_width(s, confidence) <= settle for s in series)


def interleave(
    arms: dict[str, Arm],
    *,
    block: int = 5,
    min_blocks: int = 6,
    max_blocks: int = 200,
    budget_s: float = 10.0,
    settle: float = 0.02,
    confidence: float = 0.95,
    watch: tuple[str, str] | None = None,
    seed: int = 0,
    clock: Callable[[], float] = time.monotonic,
) -> Samples:
    """Blocks of ``block`` samples from every arm, in an order shuffled per block (a numpy
    Generator seeded by ``seed``), until settled or a limit (module docstring)."""
    if not arms:
        raise ValueError("interleave: no arms")
    if block < 1 or min_blocks < 1 or max_blocks < 1:
        raise ValueError(
            f"interleave: block, min_blocks and max_blocks must be at least 1 (not {block}, {min_blocks}, {max_blocks})"
        )
    if watch is not None and not set(watch) <= set(arms):
        raise ValueError(f"interleave: watch {watch} names arms that are not among {sorted(arms)}")
    names = list(arms)
    rng = np.random.default_rng(seed)
    start = clock()
    out = Samples({name: [] for name in names}, block, 0, "", 0.0)
    while True:
        for i in rng.permutation(len(names)):
            name = names[i]
            got = [float(t) for t in arms[name](block)]
            if len(got) != block:
                raise ValueError(f"interleave: arm {name!r} returned {len(got)} samples, not {block}")
            out.arms[name].extend(got)
        out.blocks += 1
        if out.blocks >= min_blocks and _settled(out, watch, settle, confidence):
            out.stopped = "settled"
        elif out.blocks >= max_blocks:
            out.stopped = "sample limit"
        elif clock() - start >= budget_s:
            out.stopped = "time limit"
        else:
            continue
        out.seconds = clock() - start
        return out
