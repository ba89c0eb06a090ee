"""Position-scaling references: against HF transformers' own frequencies where it is
installed (within the float32 error model of how HF computes them), and against
independent derivations (limits, closed forms, numerically solved band edges) always."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq

from ropecheck.reference import inv_freq
from ropecheck.reference.scaling import (NTK, DynamicNTK, Linear, Llama3, LongRoPE, Scaling, YaRN,
                               from_parameters, parse, yarn_correction_range)
from ropecheck.properties.tolerance import ANGLE_CONST, U32

R, BASE = 64, 10000.0


def test_linear_divides_every_frequency():
    np.testing.assert_allclose(Linear(4.0).inv_freq(R, BASE), inv_freq(R, BASE) / 4.0, rtol=1e-15)


def test_ntk_interpolates_lowest_frequency_by_factor_and_keeps_highest():
    theta, scaled = inv_freq(R, BASE), NTK(8.0).inv_freq(R, BASE)
    assert scaled[0] == theta[0] == 1.0
    assert scaled[-1] == pytest.approx(theta[-1] / 8.0, rel=1e-13)


def test_dynamic_ntk_is_default_up_to_the_original_length_then_ntk():
    dynamic = DynamicNTK(factor=2.0, max_position_embeddings=1024)
    np.testing.assert_array_equal(dynamic.inv_freq(R, BASE, seq_len=1000), inv_freq(R, BASE))
    np.testing.assert_array_equal(dynamic.inv_freq(R, BASE, seq_len=None), inv_freq(R, BASE))
    # at L = 4 L0 the stretch is s L / L0 - (s - 1) = 2 * 4 - 1 = 7
    np.testing.assert_allclose(dynamic.inv_freq(R, BASE, seq_len=4096), NTK(7.0).inv_freq(R, BASE),
                               rtol=1e-13)
    assert dynamic.dynamic


def _rotations_edge(rotations, original):
    """The real pair index d at which a wavelength 2 pi base^(2d/r) fits ``rotations``
    times into the original context, solved numerically (not the closed form)."""
    return brentq(lambda d: original / (2 * math.pi * BASE ** (2 * d / R)) - rotations, -R, 2 * R)


@pytest.mark.parametrize("factor, original", [(4.0, 1024), (16.0, 4096), (2.0, 256)])
def test_yarn_ramp_between_numerically_solved_band_edges(factor, original):
    yarn = YaRN(factor, original)
    low, high = yarn_correction_range(R, BASE, original, 32, 1)
    assert low == max(math.floor(_rotations_edge(32, original)), 0)
    assert high == min(math.ceil(_rotations_edge(1, original)), R - 1)
    theta, scaled = inv_freq(R, BASE), yarn.inv_freq(R, BASE)
    i = np.arange(R // 2)
    np.testing.assert_array_equal(scaled[i <= low], theta[i <= low])  # extrapolated
    np.testing.assert_allclose(scaled[i >= high], theta[i >= high] / factor, rtol=1e-15)  # interpolated
    middle = (i > low) & (i < high)
    weight = (i[middle] - low) / (high - low)  # share of interpolation
    np.testing.assert_allclose(scaled[middle], theta[middle] * (1 - weight + weight / factor), rtol=1e-14)
    assert yarn.attention_factor() == pytest.approx(0.1 * math.log(factor) + 1)


def test_yarn_attention_factor_from_mscales_and_override():
    assert YaRN(4.0, 1024, mscale=1.0, mscale_all_dim=1.0).attention_factor() == pytest.approx(1.0)
    assert YaRN(4.0, 1024, mscale=0.707, mscale_all_dim=1.0).attention_factor() == pytest.approx(
        (0.1 * 0.707 * math.log(4) + 1) / (0.1 * math.log(4) + 1))
    assert YaRN(4.0, 1024, attention_factor_=1.5).attention_factor() == 1.5
    assert YaRN(1.0, 1024).attention_factor() == 1.0


def test_llama3_bands_are_continuous_and_monotone():
    llama3 = Llama3(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)
    theta = inv_freq(128, 500000.0)
    scaled = llama3.inv_freq(128, 500000.0)
    wavelength = 2 * np.pi / theta
    np.testing.assert_array_equal(scaled[wavelength < 8192 / 4], theta[wavelength < 8192 / 4])
    np.testing.assert_allclose(scaled[wavelength > 8192], theta[wavelength > 8192] / 8, rtol=1e-15)
    ratio = scaled / theta  # falls from 1 to 1/8 as the wavelength grows
    assert np.all(np.diff(ratio) <= 1e-15) and ratio.min() == pytest.approx(1 / 8)
    # continuity at both band edges: on a dense grid of wavelengths the ratio never jumps
    dense = Llama3(8.0, 1.0, 4.0, 8192).inv_freq(8192, 500000.0) / inv_freq(8192, 500000.0)
    assert np.abs(np.diff(dense)).max() < 5e-3


def test_longrope_switches_factors_past_the_original_length():
    short, long = [1.0] * (R // 2), list(np.linspace(1, 8, R // 2))
    longrope = LongRoPE(short, long, original_max_position_embeddings=4096, max_position_embeddings=131072)
    np.testing.assert_array_equal(longrope.inv_freq(R, BASE, seq_len=4096), inv_freq(R, BASE))
    np.testing.assert_allclose(longrope.inv_freq(R, BASE, seq_len=4097), inv_freq(R, BASE) / np.array(long))
    assert longrope.attention_factor() == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    with pytest.raises(ValueError, match="needs 16"):
        longrope.inv_freq(32, BASE)


@pytest.mark.parametrize("scaling", [
    Scaling(), Linear(4.0), NTK(2.0), DynamicNTK(2.0, 512), YaRN(4.0, 1024, beta_fast=16.0),
    Llama3(8.0, 1.0, 4.0, 8192), LongRoPE((1.0, 2.0), (3.0, 4.0), 64, factor=4.0),
    YaRN(40.0, 4096, attention_factor_=0.1 * math.log(40) + 1.0), Linear(1.0800000429153442)])
def test_flag_round_trips(scaling):
    assert parse(scaling.flag()) == scaling
    assert from_parameters(scaling.parameters()) == scaling


@pytest.mark.parametrize("text, message", [
    ("warp:factor=2", "unknown scaling"), ("linear:speed=2", "unknown: speed"),
    ("linear:factor", "not key=value")])
def test_bad_scaling_values_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse(text)


# --- against HF transformers' own frequencies ----------------------------------------

HF_CASES = [
    ({"rope_type": "linear", "factor": 4.0}, Linear(4.0), None),
    ({"rope_type": "dynamic", "factor": 2.0}, DynamicNTK(2.0, 2048), 8192),
    ({"rope_type": "dynamic", "factor": 2.0}, DynamicNTK(2.0, 2048), 100),
    ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024},
     YaRN(8.0, 1024), None),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "beta_fast": 16.0,
      "mscale": 0.707, "mscale_all_dim": 1.0}, YaRN(4.0, 512, beta_fast=16.0, mscale=0.707,
                                                   mscale_all_dim=1.0), None),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, Llama3(8.0, 1.0, 4.0, 8192), None),
    ({"rope_type": "longrope", "short_factor": [1.0 + i / 64 for i in range(32)],
      "long_factor": [1.0 + i / 4 for i in range(32)], "original_max_position_embeddings": 1024},
     LongRoPE([1.0 + i / 64 for i in range(32)], [1.0 + i / 4 for i in range(32)], 1024,
              max_position_embeddings=2048), 4096),
]


@pytest.mark.parametrize("parameters, scaling, seq_len", HF_CASES,
                         ids=lambda v: v.get("rope_type") if isinstance(v, dict) else None)
def test_matches_hf_transformers_frequencies(parameters, scaling, seq_len):
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    base = 500000.0 if parameters["rope_type"] == "llama3" else BASE
    config = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=R,
                                      max_position_embeddings=2048,
                                      rope_parameters={"rope_theta": base, **parameters})
    hf_theta, hf_factor = ROPE_INIT_FUNCTIONS[parameters["rope_type"]](config, "cpu", seq_len=seq_len)
    ours = scaling.inv_freq(R, base, seq_len)
    # HF forms theta in float32: per frequency at most (2 e_i ln base + 6 + ops) u32 relative
    # (ropecheck.tolerance), plus one rounding per float32 op of the scaling
    e_ln_base = np.arange(0, R, 2) / R * math.log(base)
    allowed = (2 * e_ln_base + ANGLE_CONST + scaling.theta_ops) * U32
    np.testing.assert_array_less(np.abs(hf_theta.double().numpy() / ours - 1), allowed)
    assert hf_factor == pytest.approx(scaling.attention_factor(), rel=1e-12)


def test_llama3_float32_band_error_stays_inside_the_model():
    """A correct float32 Llama 3 (HF's recipe: every step in float32) over many parameter
    sets: inside the band the scaled theta' = theta ((1 - s)/f + s), s linear in theta,
    amplifies theta's float32 error (Llama3.theta_gain, up to ~10x); without the gain the
    model allowed 3 times too little for some of them (a false alarm on correct code)."""
    import random

    import torch

    from ropecheck.properties.tolerance import ErrorModel

    rng = random.Random(0)
    worst = 0.0
    for _ in range(400):
        base = rng.choice([10000.0, 500000.0, 1e6, 123456.7])
        f, low = rng.choice([2.0, 8.0, 16.0, 32.0, 12.5]), rng.choice([1.0, 2.0, 0.5])
        high, original = low * rng.choice([2.0, 4.0, 8.0]), rng.choice([2048, 8192, 5000, 32768])
        r = rng.choice([8, 64, 80, 128, 256])
        theta = 1.0 / base ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
        wavelength = 2 * math.pi / theta
        kept = (original / wavelength - low) / (high - low)
        mixed = (1 - kept) * theta / f + kept * theta
        ours = torch.where(wavelength > original / low, theta / f, theta)
        ours = torch.where((wavelength <= original / low) & (wavelength >= original / high), mixed, ours)
        scaling = Llama3(f, low, high, original)
        exact = scaling.inv_freq(r, base)
        allowed = ErrorModel.angle_error(1.0, exact, np.arange(0, r, 2) / r * math.log(base),
                                         scaling.theta_ops, scaling.theta_gain(r, base))
        worst = max(worst, float((np.abs(ours.double().numpy() - exact) / allowed).max()))
    assert worst <= 1.0, worst
