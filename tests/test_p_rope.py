"""p-RoPE as a convention, ``--rotated-fraction p`` (transformers' ``rope_type:
"proportional"``): pairs (i, i + r/2) over all r features, theta_i = base^(-2i/r) for the
first floor(p r / 2) pairs and zero for the rest, which come back as they went in.

It is not partial rotary (``--rotary-dim p r``): the float64 reference, the error model
(an unturned pair: one output rounding) and the checks keep the two apart, so that
Megatron-Bridge #4195 (p-RoPE at head dim 512, p = 0.25, computed as a 128-feature partial
rotary) fails the default profile while a correct p-RoPE kernel passes it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ropecheck.cli import main
from ropecheck.properties import device_reference
from ropecheck.properties.checks import PROPERTIES
from ropecheck.properties.convention import Convention
from ropecheck.properties.runner import RunOptions
from ropecheck.properties.tolerance import ErrorModel
from ropecheck.reference import inv_freq, rotated_pairs
from ropecheck.reference.scaling import YaRN
from ropecheck.targets.target import Target
from tests import p_rope_kernels as kernels

P_ROPE = ("--layout", "half", "--base", "1000000", "--rotary-dim", "512", "--rotated-fraction", "0.25")
CONV = Convention("half", 1e6, 512, rotated_fraction=0.25)


def run(kernel: str, *args) -> tuple[int, str]:
    # in-process: plain torch kernels at head size 512, whose tensors a worker is sent and sends
    # back each call (a third of a run's time); a worker is not what these tests are about
    out = CliRunner().invoke(
        main, ["check", f"{kernels.__file__}:{kernel}", *P_ROPE, "--dtype", "float32", "--in-process", *args]
    )
    return out.exit_code, out.output


# --- the reference ------------------------------------------------------------------------------


def test_the_frequencies_are_transformers_proportional_ones():
    assert rotated_pairs(512, 0.25) == 64 and rotated_pairs(256, 1.0) == 128 and rotated_pairs(10, 0.25) == 1
    theta = inv_freq(512, 1e6, rotated_fraction=0.25)
    assert np.count_nonzero(theta) == 64 and np.array_equal(theta[:64], inv_freq(512, 1e6)[:64])
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        head_dim=512,
        hidden_size=1024,
        num_attention_heads=2,
        rope_parameters={"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
    )
    hf, attention = ROPE_INIT_FUNCTIONS["proportional"](config)
    assert attention == 1.0 and np.allclose(hf.double().numpy(), theta, rtol=1e-6, atol=0)


def test_it_is_not_partial_rotary():
    x = np.random.default_rng(0).standard_normal((1, 3, 1, 512))
    positions = np.array([[0, 7, 1000]])
    p_rope = CONV.apply(x, positions)
    partial = Convention("half", 1e6, 128).apply(x, positions)
    assert not np.allclose(p_rope, partial)
    i = np.r_[64:256, 320:512]  # the unturned pairs (i, i + 256), i >= 64: exactly x
    assert np.array_equal(p_rope[..., i], x[..., i]) and not np.array_equal(p_rope[..., :64], x[..., :64])
    assert CONV.flags() == "--layout half --base 1e+06 --rotary-dim 512 --rotated-fraction 0.25"
    with pytest.raises(ValueError, match="rotated fraction p must be in"):
        Convention("half", rotated_fraction=0.0)
    with pytest.raises(ValueError, match="attention factor"):
        Convention("half", scaling=YaRN(factor=4.0), rotated_fraction=0.5)


def test_an_unturned_pair_is_allowed_one_output_rounding():
    x = np.random.default_rng(1).standard_normal((1, 2, 1, 512))
    positions = np.array([[3, 2**20]])
    for dtype in ("float32", "bfloat16"):
        model = ErrorModel(dtype)
        bound = model.element_bound(x, positions, CONV)
        still = np.r_[64:256, 320:512]
        assert np.array_equal(bound[..., still], model.pass_through_bound(x)[..., still])
        assert (bound[..., :64] > model.pass_through_bound(x)[..., :64]).all()  # a turning pair: its own


def test_the_device_path_bounds_an_unturned_pair_as_the_host(monkeypatch):
    monkeypatch.setattr(device_reference, "FORCED", "cpu")
    target = Target("p-rope", kernels.p_rope, CONV)
    reference = PROPERTIES["reference"]
    ctx = reference.context(target, "float32", 60, RunOptions(profile="ci").drawn_sizes)
    x, at = torch.randn(1, 4, 2, 512), np.array([[0, 1, 5000, 2**20]])
    _, expected, bound = device_reference.reference_and_bound(ctx, x, at, inverse=False, seq_len=None, device="cpu")
    device_reference.judge(ctx, x, at, expected, bound, inverse=False, seq_len=None)  # agrees with the host's


# --- kernels ------------------------------------------------------------------------------------


def test_a_correct_p_rope_kernel_passes_the_default_profile():
    code, output = run("p_rope", "--seed", "0")
    assert code == 0, output
    assert "Convention: --layout half --base 1e+06 --rotary-dim 512 --rotated-fraction 0.25" in output


def test_megatron_bridge_4195_fails_the_default_profile():
    """p-RoPE at head dim 512, p = 0.25, as pairs (i, i + 64) of the first 128 features."""
    code, output = run("p_rope_as_partial_rotary", "--seed", "0")
    assert code == 1, output
    assert "FAIL" in output and "p-RoPE is computed as partial rotary (Megatron-Bridge #4195)" in output


def test_a_plain_rope_kernel_fails_a_rotated_fraction():
    code, output = run("rope_512", "--profile", "ci")
    assert code == 1, output
    # and the same kernel passes as what it is
    out = CliRunner().invoke(
        main,
        ["check", f"{kernels.__file__}:rope_512", "--layout", "half", "--base", "1000000", "--rotary-dim", "512",
         "--dtype", "float32", "--profile", "ci", "--property", "reference", "--in-process"],
    )
    assert out.exit_code == 0, out.output


def test_an_unturned_pair_off_by_four_roundings_fails():
    """Inside a turning pair's 6 roundings, outside an unturned pair's one."""
    code, output = run("p_rope_unturned_scaled", "--profile", "ci", "--property", "reference")
    assert code == 1, output
    x = torch.randn(1, 4, 2, 512, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(4)[None]
    error = (kernels.p_rope_unturned_scaled(x, positions) - kernels.p_rope(x, positions)).double().abs().numpy()
    x64 = x.double().numpy()
    rho = np.hypot(x64[..., :256], x64[..., 256:])
    turning = ErrorModel("float32").pair_bound(np.concatenate((rho, rho), axis=-1), 0.0)
    assert (error <= turning).all()  # a turning pair's allowance would let it through


@pytest.mark.parametrize(
    "args, said",
    [
        (("--rotated-fraction", "0"), "--rotated-fraction must be in (0, 1]"),
        (("--rotated-fraction", "1.5"), "--rotated-fraction must be in (0, 1]"),
        (("--rotated-fraction", "0.25"), "--rotated-fraction needs a declared convention"),
    ],
)
def test_bad_rotated_fractions_exit_2(args, said):
    out = CliRunner().invoke(main, ["check", f"{kernels.__file__}:p_rope", *args, "--dtype", "float32"])
    assert out.exit_code == 2 and said in out.output, out.output


def test_transformers_gemma4_p_rope_passes_and_is_listed():
    """hf-gemma4-global: Gemma4TextRotaryEmbedding's full-attention layers (ropecheck/adapters/hf_real.py)."""
    import ropecheck
    from ropecheck.adapters import ADAPTERS

    why = ADAPTERS["hf-gemma4-global"].why_unavailable()
    if why:
        pytest.skip(why)
    listed = CliRunner().invoke(main, ["list"], terminal_width=200)
    assert "--rotated-fraction 0.25" in listed.output and "hf-gemma4-global" in listed.output
    # in-process: a worker imported transformers' modeling code anew
    report = ropecheck.check("hf-gemma4-global", profile="ci", max_examples=4, dtypes="float32", in_process=True)
    assert report.passed, report.summary()
