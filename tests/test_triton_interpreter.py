"""bfloat16 under Triton's interpreter (``ropecheck.kernels.triton_interpreter``): each
operation a kernel computes in bfloat16 gives what a GPU gives (torch's CPU bfloat16 ops:
one rounding to nearest even per operation), and the verdicts on a kernel that computes
in bfloat16 are the verdicts its mathematics earns: a right one passes on CPU, a wrong
one fails (before, every bfloat16 product was of bit patterns: values near 1e30)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ropecheck.kernels import triton_interpreter
from ropecheck.kernels.triton_env import triton_missing

requires_interpreter = pytest.mark.skipif(
    bool(triton_missing()) or torch.cuda.is_available(), reason=str(triton_missing() or "a CUDA device: no interpreter")
)
KERNELS = Path(__file__).parent / "bf16_triton_kernels.py"


def test_rounding_to_bfloat16_is_torch_s_nearest_even():
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.standard_normal(4096).astype(np.float32) * 10.0 ** rng.integers(-40, 39, 4096),
            # ties: exactly half way between two bfloat16 numbers, even and odd below
            np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38, -3.4e38], dtype=np.float32),
            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45], dtype=np.float32),
        ]
    )
    want = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = triton_interpreter.to_bfloat16(values)
    finite = ~np.isnan(values)
    assert np.array_equal(got[finite], want[finite])
    assert np.isnan(triton_interpreter.to_float32(got[~finite])).all()
    assert np.array_equal(triton_interpreter.to_float32(want), torch.from_numpy(want.view(np.int16)).view(torch.bfloat16).float().numpy(), equal_nan=True)


PROBE = """
import torch
from ropecheck.kernels.triton_env import import_triton
triton = import_triton()
tl = triton.language

@triton.jit
def ops(x_ptr, y_ptr, f_ptr, o_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(x_ptr + i)
    b = tl.load(y_ptr + i)
    f = tl.load(f_ptr + i)
    tl.store(o_ptr + 0 * N + i, a * b)
    tl.store(o_ptr + 1 * N + i, a + b)
    tl.store(o_ptr + 2 * N + i, a - b)
    tl.store(o_ptr + 3 * N + i, -a)
    tl.store(o_ptr + 4 * N + i, tl.where(a < b, a, b))
    tl.store(o_ptr + 5 * N + i, tl.maximum(a, b))
    tl.store(o_ptr + 6 * N + i, f)
    tl.store(o_ptr + 7 * N + i, (f * 3.0).to(tl.bfloat16))
    tl.store(o_ptr + 8 * N + i, a / b)
    tl.store(o_ptr + 9 * N + i, tl.full((N,), tl.max(a, axis=0), tl.bfloat16))
    tl.store(o_ptr + 10 * N + i, tl.full((N,), tl.min(a, axis=0), tl.bfloat16))
    tl.store(o_ptr + 11 * N + i, tl.fma(a, b, a))
    tl.store(o_ptr + 12 * N + i, a.to(tl.float16).to(tl.bfloat16))
    tl.store(o_ptr + 13 * N + i, tl.clamp(a, -1.0, 1.0))

N = 64
torch.manual_seed(0)
x = torch.randn(N, dtype=torch.bfloat16) * 4
y = torch.randn(N, dtype=torch.bfloat16) * 4
f = torch.randn(N, dtype=torch.float32) * 3
out = torch.zeros(14 * N, dtype=torch.bfloat16)
ops[(1,)](x, y, f, out, N=N)
got = out.view(14, N)
want = [x * y, x + y, x - y, -x, torch.where(x < y, x, y), torch.maximum(x, y), f.to(torch.bfloat16),
        (f * 3).to(torch.bfloat16), x / y, x.max().expand(N), x.min().expand(N),
        (x.float() * y.float() + x.float()).to(torch.bfloat16), x.to(torch.float16).to(torch.bfloat16),
        x.clamp(-1, 1)]
wrong = [n for n, (g, w) in enumerate(zip(got, want)) if not torch.equal(g, w)]
print("wrong", wrong)
"""


@requires_interpreter
def test_each_bfloat16_operation_is_rounded_once_as_on_a_gpu(tmp_path):
    """Products, sums, negation, comparisons, max/min (elementwise and reduced), division,
    fma, clamp and casts (float32 stored as bfloat16, float16 <-> bfloat16) of a kernel run
    under the interpreter equal torch's bfloat16 operations bit for bit. In a process of its
    own: the interpreter is chosen before triton is imported."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wrong []" in done.stdout, done.stdout


@requires_interpreter
@pytest.mark.parametrize("name, status", [("rope", "passed"), ("bf16_angles", "failed")])
def test_a_kernel_computing_in_bfloat16_gets_its_verdict_on_cpu(name, status):
    """The reference check in bfloat16 of a Triton kernel whose rotation is bfloat16
    arithmetic (as liger-kernel's): the right kernel passes (it failed with errors near
    1e30 when the interpreter multiplied bit patterns), bfloat16 positions fail. The file
    is loaded as a user's target, without TRITON_INTERPRET set: ropecheck chooses the
    interpreter on a machine without CUDA."""
    import ropecheck

    report = ropecheck.check(
        f"{KERNELS}:{name}", layout="half", dtypes="bfloat16", properties="reference", backward=False,
        max_examples=10, sizes="toy,huge=no",
    )
    [result] = report.results
    assert result.status == status, result.message
