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


# The reference check at a production size: one sequence of 8192 tokens x 32 heads x 128
# (2^25 elements, bfloat16), compared a chunk at a time (REFERENCE_CHUNK elements: how
# ``reference`` runs) and whole (the chunk as large as the input: how it ran before).
PRODUCTION_SHAPE = (1, 8192, 32, 128)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole"])
def test_reference_check_memory_at_production_size(benchmark, monkeypatch, chunked):
    import tracemalloc

    import torch

    from ropecheck.properties import one_d
    from ropecheck.properties.inputs.cases import Case, as_float64
    from ropecheck.targets.target import Convention, Target

    # a smoke run (--benchmark-disable, as the test command runs it) takes a small input
    batch, seq, heads, head_dim = (1, 256, 4, 64) if benchmark.disabled else PRODUCTION_SHAPE
    case = Case("bfloat16", batch, seq, heads, head_dim, (tuple(range(seq)),))
    target = Target("reference", lambda x, p: x, convention=Convention("half"), dtypes=("bfloat16",))
    ctx = one_d.Context(target, "bfloat16")
    x, p = case.tensor(), case.positions_array()
    y = torch.from_numpy(ctx.convention.apply(as_float64(x), p)).to(x.dtype)
    if not chunked:
        monkeypatch.setattr(one_d, "REFERENCE_CHUNK", x.numel())

    def compare():
        return one_d.against_reference(ctx, y, x, p, what="benchmark")

    tracemalloc.start()
    assert compare() <= 1.0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    benchmark.pedantic(compare, rounds=3, warmup_rounds=0)
    benchmark.extra_info["elements"] = x.numel()
    benchmark.extra_info["peak_mib"] = peak / 2**20  # numpy's and torch's host allocations, traced
    benchmark.extra_info["input_mib"] = (x.numel() * x.element_size() + y.numel() * y.element_size()) / 2**20
