"""The tolerance model: its derivation holds for real float32 angle computations, correct
low-precision kernels pass up to 2^20, and the precision bugs it exists to catch fail."""

import math

import numpy as np
import pytest
import torch

from ropecheck import reference
from ropecheck.properties.assertions import CheckFailure
from ropecheck.properties.inputs.cases import Case
from ropecheck.properties.checks import PROPERTIES, Context
from ropecheck.properties.accuracy import accuracy_sweep
from ropecheck.targets.builtins import builtin
from ropecheck.targets.target import Convention, Target
from ropecheck.properties.tolerance import K_OPS, U32, ErrorModel
from tests import mutants

HALF = Convention("half", 10000.0)


def test_units():
    assert ErrorModel("float32").unit == 2.0**-24
    assert ErrorModel("bfloat16").unit == 2.0**-8
    assert ErrorModel("float16").unit == 2.0**-11
    assert ErrorModel("float64").unit == 2.0**-24  # compute never finer than float32
    assert ErrorModel("float64").output_unit == 2.0**-53


FP32_THETA_RECIPES = {
    "reciprocal-pow": lambda r, b: 1.0 / (b ** (torch.arange(0, r, 2, dtype=torch.float32) / r)),
    "negative-pow": lambda r, b: b ** (-(torch.arange(0, r, 2, dtype=torch.float32) / r)),
    "exp-log": lambda r, b: torch.exp(torch.arange(0, r, 2, dtype=torch.float32) * (-math.log(b) / r)),
}


@pytest.mark.parametrize("recipe", FP32_THETA_RECIPES)
@pytest.mark.parametrize("base", [10000.0, 500000.0, 1e6])
@pytest.mark.parametrize("r", [16, 64, 128, 256])
def test_angle_allowance_covers_float32_angles(recipe, base, r):
    """|fl32(m * theta_fp32) - m * theta| stays within the model's per-frequency allowance."""
    m = np.array([1, 7, 255, 4097, 65505, 2**20 + 1, 2**23 - 1, 2**24], dtype=np.int64)
    theta32 = FP32_THETA_RECIPES[recipe](r, base)
    phi32 = (torch.from_numpy(m).to(torch.float32)[:, None] * theta32).double().numpy()
    exact = reference.angles(m, reference.inv_freq(r, base))
    allowed = ErrorModel.angle_error(m, reference.inv_freq(r, base))
    ratio = np.abs(phi32 - exact) / allowed
    assert ratio.max() <= 1.0, f"worst {ratio.max():.3g} at {np.unravel_index(ratio.argmax(), ratio.shape)}"
    assert ratio.max() > 0.05, "the allowance should be tight to within a small factor"


def test_angles_in_bfloat16_exceed_the_allowance():
    m = np.array([300, 5000], dtype=np.int64)
    theta = reference.inv_freq(64)
    phi16 = (torch.from_numpy(m).to(torch.bfloat16)[:, None]
             * torch.from_numpy(theta).to(torch.bfloat16)).double().numpy()
    ratio = np.abs(phi16 - reference.angles(m, theta)) / ErrorModel.angle_error(m, theta)
    assert ratio.max() > 100


def _reference_error(target, dtype, positions, head_dim=128, heads=2):
    p = np.asarray(positions, dtype=np.int64)[None, :]
    case = Case(dtype, 1, p.shape[1], heads, head_dim, tuple(map(tuple, p.tolist())), seed=3)
    return PROPERTIES["reference"].check(Context(target, dtype), case)


LARGE = [0, 1, 2047, 2049, 65505, 2**20 - 1, 2**20]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
@pytest.mark.parametrize("name", ["rotate-half", "llama-complex", "cached"])
def test_correct_kernels_pass_up_to_2_20(name, dtype):
    assert _reference_error(builtin(name), dtype, LARGE) <= 1.0


def test_hf_style_bf16_arithmetic_passes_at_2_20():
    """cos/sin cast to bf16 and products rounded in bf16, the HF way."""
    def hf(x, p):
        r = x.shape[-1]
        phi = (p.float()[..., None] * mutants.inv_freq(r))[:, :, None, :]
        phi = torch.cat((phi, phi), -1)
        cos, sin = phi.cos().to(x.dtype), phi.sin().to(x.dtype)
        return x * cos + mutants.rotate_half(x) * sin

    target = Target("hf", hf, HALF)
    for dtype in ("bfloat16", "float16"):
        assert _reference_error(target, dtype, LARGE) <= 1.0


@pytest.mark.parametrize("bug,dtype,positions", [
    ("angles-in-bf16", "float32", [3, 300, 5000]),
    ("angles-in-bf16", "bfloat16", [3, 300, 5000, 70001]),
    ("positions-in-fp16", "float32", [2049, 4097]),
    ("positions-in-fp16", "bfloat16", [2049, 4097, 33333]),
    ("cos-sin-in-fp16", "float32", [1, 2, 3, 17]),
    ("taylor-sincos", "float32", [5, 17, 100]),
    ("taylor-sincos", "bfloat16", [5, 17, 100]),
])
def test_precision_bugs_fail(bug, dtype, positions):
    fn, _ = mutants.MUTANTS[bug]
    with pytest.raises(CheckFailure) as failure:
        _reference_error(Target(bug, fn, HALF), dtype, positions)
    assert failure.value.error > 1.0


def test_float64_angles_have_an_unlimited_horizon():
    def exact_angles(x, p):
        r = x.shape[-1]
        phi = torch.from_numpy(reference.angles(p.numpy(), reference.inv_freq(r)))[:, :, None, :]
        phi = torch.cat((phi, phi), -1)
        return (x.double() * phi.cos() + mutants.rotate_half(x.double()) * phi.sin()).to(x.dtype)

    sweep = accuracy_sweep(Context(Target("exact", exact_angles, HALF), "float32"))
    assert sweep["horizon"] == 2**24
    assert max(sweep["strict_error"]) <= 1.0


def test_float32_angles_have_a_finite_horizon():
    sweep = accuracy_sweep(Context(builtin("rotate-half"), "float32"))
    assert sweep["horizon"] is not None and sweep["horizon"] < 2**20
    assert max(sweep["error"]) <= 1.0  # within the full model everywhere
    assert max(sweep["strict_error"]) > 1.0


def test_ops_constant_covers_bf16_rounding_of_cos_sin():
    """The derivation's 6u: worst observed HF-style bf16 error at small angles stays below it."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(20000), rng.standard_normal(20000)
    phi = rng.uniform(-math.pi, math.pi, 20000)
    t = lambda v: torch.from_numpy(v).to(torch.bfloat16)
    c, s = t(np.cos(phi)), t(np.sin(phi))
    y = (t(a) * c - t(b) * s).double().numpy()
    a16, b16 = t(a).double().numpy(), t(b).double().numpy()
    exact = a16 * np.cos(phi) - b16 * np.sin(phi)
    ratio = np.abs(y - exact) / (np.hypot(a16, b16) * K_OPS * 2.0**-8)
    assert ratio.max() <= 1.0
    assert U32 == 2.0**-24
