"""Throughput of the float64 reference apply_rope on x of shape (4, 512, 8, 128).

Run:  python -m pytest benchmarks/bench_reference.py --benchmark-only -p no:cacheprovider
(a file named on the command line is collected whatever ``python_files`` says).
extra_info records elements, bytes moved (read x + write y, float64) and elements/s from the
mean round time.
"""

from __future__ import annotations

import numpy as np
import pytest

from ropecheck.reference import LAYOUTS, apply_rope

SHAPE = (4, 512, 8, 128)  # (batch, seq, heads, head_dim)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_throughput(benchmark, layout):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE)
    positions = rng.integers(0, 2**20, size=SHAPE[:2])
    y = benchmark.pedantic(apply_rope, args=(x, positions), kwargs={"layout": layout}, rounds=10, warmup_rounds=1)
    assert y.shape == x.shape and y.dtype == np.float64
    benchmark.extra_info["elements"] = x.size
    benchmark.extra_info["bytes"] = 2 * x.nbytes
    if benchmark.stats is not None:  # None under --benchmark-disable
        mean = benchmark.stats.stats.mean
        benchmark.extra_info["elements_per_s"] = x.size / mean
        benchmark.extra_info["bytes_per_s"] = 2 * x.nbytes / mean
