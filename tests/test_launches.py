"""The Triton specializations a run launches (``ropecheck.calling.launches``), counted on
CPU with Triton's own binder as a GPU compiles them (a run's record of them, and the bound
the project's kernel keeps: tests/test_triton_kernel.py's CLI test), and the grids a GPU
refuses."""

from __future__ import annotations

import pytest
import torch

from ropecheck.calling import launches
from ropecheck.kernels.triton_env import triton_missing

requires_triton = pytest.mark.skipif(bool(triton_missing()), reason=str(triton_missing()))


@pytest.fixture(scope="module")
def scale_kernel():
    """A small kernel: y = x * factor over n elements, BLOCK a constexpr."""
    from ropecheck.kernels.triton_env import import_triton

    triton = import_triton()
    tl = triton.language

    @triton.jit
    def scale(x_ptr, y_ptr, n, factor, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * factor, mask=i < n)

    def run(x, block=16):
        y = torch.empty_like(x)
        scale[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), 2.0, BLOCK=block)
        return y

    return run


@requires_triton
def test_a_launch_s_key_is_its_specialization(scale_kernel):
    """Integers in another class (1, a multiple of 16, other), another constexpr or dtype,
    an unaligned pointer: another kernel; the same classes: the same one."""
    with launches.recording() as recorded:
        for n in (17, 23):  # one class: neither 1 nor a multiple of 16
            scale_kernel(torch.ones(n))
    assert recorded.count == 1 and recorded.by_dtype() == {"float32": 1}
    with launches.recording() as recorded:
        scale_kernel(torch.ones(17))
        scale_kernel(torch.ones(32))  # n divisible by 16
        scale_kernel(torch.ones(1))  # n == 1: a constant
        scale_kernel(torch.ones(17), block=32)  # another constexpr
        scale_kernel(torch.ones(17, dtype=torch.float64))  # another dtype
        scale_kernel(torch.ones(18)[1:])  # x at an address 4 bytes past an aligned one
    assert recorded.count == 6
    assert recorded.by_dtype() == {"float32": 5, "float64": 1}
    [name] = recorded.keys
    assert name.endswith("scale")


@requires_triton
def test_recordings_nest_and_cost_nothing_outside_one(scale_kernel):
    scale_kernel(torch.ones(5))  # no recording open: nothing kept anywhere
    with launches.recording() as outer:
        scale_kernel(torch.ones(5))
        with launches.recording() as inner:
            scale_kernel(torch.ones(32))
    assert outer.count == 2 and inner.count == 1


def test_a_target_without_triton_records_nothing():
    with launches.recording() as recorded:
        torch.ones(3) * 2
    assert not recorded and recorded.count == 0


@requires_triton
def test_a_grid_past_cuda_s_limits_fails_as_on_a_gpu(scale_kernel):
    """The interpreter runs any grid; a GPU refuses more than 65535 programs on grid axis y
    or z ("invalid argument"). Inside a recording the launch fails on CPU too, saying why."""
    from ropecheck.kernels.triton_env import import_triton

    triton = import_triton()
    tl = triton.language

    @triton.jit
    def rows(x_ptr, BLOCK: tl.constexpr):
        tl.store(x_ptr + tl.program_id(1) * BLOCK + tl.arange(0, BLOCK), 1.0)

    x = torch.zeros(65536 * 4)
    with launches.recording(), pytest.raises(launches.GridBeyondLimits, match="65536 programs on axis 1"):
        rows[(1, 65536)](x, BLOCK=4)
    with launches.recording():
        rows[lambda meta: (1, 2)](x, BLOCK=4)  # a grid function: called with the launch's arguments
    assert x[:8].tolist() == [1.0] * 8


@requires_triton
@pytest.mark.parametrize("form", ["x", "qk", "packed", "decode"])
def test_the_kernel_s_grid_fits_cuda_s_limits_at_any_batch(form):
    """On an H200 the production profile's size switch found `triton` failing from 65536
    sequences of one token ("Triton Error [CUDA]: invalid argument"): the sequences were the
    grid's y axis. The launches of 2^17 sequences, recorded on meta tensors (kernels.aot)."""
    from ropecheck.kernels import aot

    case = aot.Case(form=form, batch=2**17, seq=1, heads_q=2, heads_k=1, head_dim=64)
    for grid, args, kwargs in aot.record(case):
        assert launches.grid_beyond_limits(grid, {}, kwargs) == "", grid
