"""GPU throughput of RoPE kernels side by side, through ``ropecheck bench``'s machinery (one
timing protocol in the project): ropecheck's fused Triton kernel, Liger's, flash-attn's
Triton rotary, HF eager and torch.compile of HF eager, each a ropecheck target called in
its own interface, each shape's output checked against the float64 reference before it
is timed.

Run on a CUDA machine (skipped without one; a library that is not installed is skipped):

    python -m pytest benchmarks/bench_gpu_rope.py --benchmark-enable -p no:cacheprovider

Each benchmark is one target at one shape (``ropecheck.bench.shapes``: decode and prefill
of Llama 3 8B's heads, ``ROPE_BENCH_SHAPES=decode,prefill,models`` for every model),
bfloat16, timed by the bench's timers (a CUDA graph below 32 MiB moved, else events after
an L2 flush) interleaved with a copy of its bytes; extra_info holds the bytes, GB/s, % of
the copy, the host time per eager call and the block ratios a speed gate compares. The
table of all rows is printed at the end of the run (``conftest.py``).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("GPU benchmarks need a CUDA device (none here)", allow_module_level=True)

from ropecheck.bench import shapes  # noqa: E402
from ropecheck.bench.pytest_items import record  # noqa: E402
from ropecheck.bench.run import BenchRun, prepare  # noqa: E402
from ropecheck.session.options import UsageError, parse  # noqa: E402
from ropecheck.session.spec import UnusableTarget  # noqa: E402

# implementation -> the target and the run's options (ropecheck bench's flags)
IMPLEMENTATIONS = {
    "ropecheck-triton": {"target": "triton"},
    "liger": {"target": "liger-kernel"},
    "flash-attn-triton": {"target": "flash-attn-rotary"},
    "hf-eager": {"target": "hf-llama"},
    "hf-compiled": {"target": "hf-llama", "modes": ["compile"]},
}
SHAPES = [s for s in os.environ.get("ROPE_BENCH_SHAPES", "decode,prefill").split(",") if s]
ROWS = shapes.shapes(SHAPES, "gpu")
BUDGET = "1.5"  # seconds of sampling per row at most
ROWS_TIMED: list = []  # (implementation, row): the table printed at the end (conftest.py)
_RUNS: dict = {}


def bench_run(implementation: str) -> BenchRun:
    """The implementation's bench run, prepared once (its target loaded and warmed up)."""
    if implementation not in _RUNS:
        raw = {"device": "cuda", "dtypes": ["bfloat16"], "budget": BUDGET, **IMPLEMENTATIONS[implementation]}
        try:
            _RUNS[implementation] = prepare(parse("bench", raw))
        except (UnusableTarget, UsageError) as exc:
            _RUNS[implementation] = exc
    found = _RUNS[implementation]
    if isinstance(found, Exception):
        pytest.skip(f"{implementation}: {found}")
    return found


@pytest.fixture(scope="module", autouse=True)
def close_runs():
    yield
    for run in _RUNS.values():
        if isinstance(run, BenchRun):
            run.close()


@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("shape", ROWS, ids=[s.name.replace(" ", "-") for s in ROWS])
def test_rope_gpu(benchmark, shape, implementation: str):
    run = bench_run(implementation)
    row = run.row(shape, "bfloat16")
    if row.status != "timed":
        pytest.fail(f"{implementation} {row.name}: {row.status}: {row.message}", pytrace=False)
    benchmark.extra_info["implementation"] = implementation
    record(benchmark, row, run.subject.name)
    ROWS_TIMED.append((implementation, row))
