"""Boundaries of every scaling (issue 23): the 1-D inputs include calls whose length sits one
below, at and one above each length where a declared scaling switches (``Scaling.switches``),
so that a ``>`` written ``>=``, or a seq_len one short, fails deterministically; scalings that
are continuous at their switch are the same map either way (checked here on the reference)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import ropecheck
from ropecheck.properties.inputs.fixed_cases import switch_cases
from ropecheck.reference.scaling import DynamicNTK, Linear, Llama3, LongRoPE, YaRN, parse
from tests.real_config_kernels import CONFIGS

KERNELS = Path(__file__).with_name("real_config_kernels.py")


def test_switches_come_from_the_declared_scaling():
    assert LongRoPE((1.0,), (2.0,), original_max_position_embeddings=4096).switches() == (4096,)
    assert DynamicNTK(2.0, 2048).switches() == (2048,)
    for continuous in (Linear(4.0), YaRN(4.0), Llama3()):
        assert continuous.switches() == ()
    tops = [int(c.positions_array().max()) for c in switch_cases("float32", (4096,), 96)]
    assert tops == [4094, 4095, 4096]  # seq_len 4095, 4096, 4097
    assert all(c.head_dim == 96 for c in switch_cases("float32", (4096,), 96))


@pytest.mark.parametrize(
    "correct, slipped",
    [
        ("phi35_longrope", "phi35_longrope_ge"),  # long factors at exactly 4096 tokens
        ("phi35_longrope", "phi35_longrope_max_position"),  # short factors at 4097 tokens
        ("dynamic_ntk", "dynamic_ntk_max_position"),  # the original base at 4097 tokens
        ("deepseek_v3_yarn", "deepseek_v3_yarn_ramp_early"),  # YaRN's ramp one pair early
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_off_by_one_at_a_switch_fails_and_the_correct_kernel_passes(correct, slipped, dtype):
    flags = dict(CONFIGS[correct], dtypes=dtype, properties="reference", profile="ci", max_examples=2, in_process=True)
    right = ropecheck.check(f"{KERNELS}:{correct}", **flags)
    assert right.passed, right.summary()
    wrong = ropecheck.check(f"{KERNELS}:{slipped}", **flags)
    assert wrong.verdict == "failed", wrong.summary()


def test_continuous_switches_are_the_same_map_either_way():
    """Where a scaling is continuous at its switch, ``<`` and ``<=`` give the same theta: no
    input can tell them apart (docs/tolerance.md, "Scaling boundaries")."""
    # dynamic NTK: at seq_len = L0 the grown base equals the original one
    ntk = DynamicNTK(2.0, 4096)
    assert ntk.base_for(128, 10000.0, 4096) == ntk.base_for(128, 10000.0, 4095) == 10000.0
    # Llama 3: the band's smooth mix is theta / factor at wavelength L0 / low, theta at L0 / high
    llama = parse("llama3:factor=8,low_freq_factor=1,high_freq_factor=4,original_max_position_embeddings=8192")
    for wavelength, kept in ((8192.0, 1 / 8), (2048.0, 1.0)):
        theta = 2 * math.pi / wavelength
        smooth = (8192 / wavelength - 1) / (4 - 1)
        assert math.isclose((1 - smooth) * theta / 8 + smooth * theta, theta * kept, rel_tol=1e-12)
    assert llama.switches() == ()
