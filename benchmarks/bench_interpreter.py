"""What computing bfloat16 on values costs under Triton's interpreter
(``ropecheck.kernels.triton_interpreter``): liger-kernel's ``rope_forward`` on q (2, 8, 256,
128) and k with 2 heads, interpreted (CPU), each row in a process of its own: float32
without the wrapper (Triton's interpreter as it is), float32 with it (the wrapper's check on
every operation), bfloat16 with it (every operation converted to float32 and rounded back).
``extra_info["seconds"]`` is the median of 3 calls after a warm-up call, measured inside the
process (no import or start-up time); side by side in one run, as the machines are shared.

Run:  python -m pytest benchmarks/bench_interpreter.py --benchmark-enable -p no:cacheprovider
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """
import os, statistics, sys, time
os.environ["TRITON_INTERPRET"] = "1"
import torch
if sys.argv[2] == "values":
    from ropecheck.kernels import triton_interpreter
    triton_interpreter.install()
from liger_kernel.ops.rope import rope_forward
dtype = getattr(torch, sys.argv[1])
q = torch.randn(2, 8, 256, 128, dtype=dtype)
k = torch.randn(2, 2, 256, 128, dtype=dtype)
cos, sin = torch.randn(2, 256, 128, dtype=dtype), torch.randn(2, 256, 128, dtype=dtype)
rope_forward(q.clone(), k.clone(), cos, sin)
times = []
for _ in range(3):
    start = time.perf_counter()
    rope_forward(q.clone(), k.clone(), cos, sin)
    times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs where there is no CUDA")
@pytest.mark.parametrize("dtype, arithmetic", [("float32", "plain"), ("float32", "values"), ("bfloat16", "values")])
def test_liger_rope_interpreted(benchmark, dtype, arithmetic):
    if not benchmark.enabled:
        pytest.skip("each row interprets liger-kernel's kernel: seconds a call")
    pytest.importorskip("liger_kernel")
    seconds = []

    def run():
        done = subprocess.run([sys.executable, "-c", SCRIPT, dtype, arithmetic], cwd=ROOT, capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        seconds.append(float(done.stdout.split()[-1]))

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(dtype=dtype, arithmetic=arithmetic, seconds=seconds[-1])
