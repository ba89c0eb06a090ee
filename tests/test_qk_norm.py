"""Fused QK-RMSNorm + RoPE interfaces (``--api vllm-qk-norm-rope``, ``sglang-qk-norm-rope``,
issue 45): ropecheck makes the packed qkv, the drawn RMSNorm weights and eps, and reads the
rotation of the normalised heads; every correct kernel passes every 1-D property, and the
real bugs of such kernels fail (the v slice written, the weights crossed, eps dropped, the
weights applied after the rotation, the partial-rotary NeoX path above 10240 token-heads,
the attention factor)."""

from __future__ import annotations

import pytest

import ropecheck
from ropecheck.calling.presets import PRESETS
from ropecheck.properties.core import normalization
from ropecheck.properties.core.dtypes import UNIT_ROUNDOFF
from ropecheck.properties.tolerance import ErrorModel
from tests.test_cli import check as cli_check
from tests.test_presets import CORRECT_DRAWS

KERNELS = "tests/qk_norm_kernels.py"
DTYPES = "float32,bfloat16"
YARN = "yarn:factor=4,original_max_position_embeddings=4096"  # an attention factor of 1.139
QUICK = ["contract", "identity", "relativity", "group-law", "reference", "table-inverse"]


def run(name: str, api: str = "vllm-qk-norm-rope", properties=QUICK, **options):
    options.setdefault("layout", "half")
    options.setdefault("dtypes", DTYPES)
    return ropecheck.check(f"{KERNELS}:{name}", api=api, properties=properties, in_process=True, **options)


def failures(report) -> list:
    return [(r.property, r.dtype, r.message) for r in report.failures]


def test_a_correct_kernel_passes_every_property_that_holds_through_a_norm():
    report = run("vllm_correct", properties=None, dtypes="bfloat16")
    assert report.passed, failures(report)
    statuses = {r.property: r.status for r in report.results}
    for law in ("identity", "linearity", "orthogonality", "relativity", "group-law", "reference", "table-inverse"):
        assert statuses[law] == "passed", (law, statuses)


CORRECT = [
    ("vllm_correct", "vllm-qk-norm-rope", {"layout": "interleaved"}),
    ("vllm_correct", "vllm-qk-norm-rope", {"rotary_dim": 8}),
    ("vllm_correct", "vllm-qk-norm-rope", {"rotary_dim": 8, "layout": "interleaved"}),
    ("vllm_partial_neox_chunks", "vllm-qk-norm-rope", {}),  # its bug needs a partial rotary dim
    ("sglang_correct", "sglang-qk-norm-rope", {}),
    ("sglang_correct", "sglang-qk-norm-rope", {"scaling": YARN, "rotary_dim": 16}),
    ("sglang_attention_factor_ignored", "sglang-qk-norm-rope", {}),  # right without an attention factor
]


@pytest.mark.parametrize("name, api, options", CORRECT, ids=[f"{a}-{n}-{len(o)}" for n, a, o in CORRECT])
def test_a_correct_fused_kernel_passes(name, api, options):
    report = run(name, api, max_examples=CORRECT_DRAWS, **options)  # (tests/test_presets.py says why)
    assert report.passed, failures(report)


# (kernel, preset, options, the property that must catch it, words of its message)
BROKEN = [
    ("vllm_writes_v", "vllm-qk-norm-rope", {}, "contract", "wrote into v's heads of qkv"),
    ("vllm_k_uses_q_weight", "vllm-qk-norm-rope", {}, "reference", "k's head"),
    ("vllm_no_eps", "vllm-qk-norm-rope", {}, "contract", "eps"),
    ("vllm_zero_head_as_weights", "vllm-qk-norm-rope", {}, "contract", "the norm of an all-zero head is zero"),
    ("vllm_norm_after_rotation", "vllm-qk-norm-rope", {}, "reference", ""),
    ("vllm_rotary_dim_ignored", "vllm-qk-norm-rope", {"rotary_dim": 8}, "reference", ""),
    ("vllm_partial_neox_chunks", "vllm-qk-norm-rope", {"rotary_dim": 8}, "reference", "size switch"),
    ("vllm_row_stride_ignored", "vllm-qk-norm-rope", {}, "reference", "qkv rows=row-strided"),
    ("sglang_attention_factor_ignored", "sglang-qk-norm-rope", {"scaling": YARN}, "identity", ""),
    ("sglang_attention_factor_on_whole_head", "sglang-qk-norm-rope", {"scaling": YARN, "rotary_dim": 16},
     "reference", ""),
]  # fmt: skip


@pytest.mark.parametrize("name, api, options, prop, words", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_fused_kernel_fails(name, api, options, prop, words):
    report = run(name, api, properties=[prop], **options)  # the property that must catch it
    caught = [r for r in report.failures if r.property == prop]
    assert caught, failures(report) or "passed"
    said = caught[0].message + "\n" + caught[0].counterexample
    assert words in said, said


def test_a_kernel_that_refuses_a_row_strided_qkv_passes_with_a_support_note():
    report = run("vllm_contiguous_only", properties=["reference"], dtypes="bfloat16")
    assert report.passed, failures(report)
    notes = [n for r in report.results for n in r.notes]
    assert any("a packed qkv whose rows are a view of a wider buffer" in n for n in notes), notes


def test_the_norm_error_model_is_the_views_roundings_and_the_reduction():
    model = ErrorModel("bfloat16", table_kind="cos-sin", norm_features=128)
    u = UNIT_ROUNDOFF["bfloat16"]
    assert model.norm_unit == pytest.approx(2 * u + (128 / 2 + 3) * 2.0**-24)
    plain = ErrorModel("bfloat16", table_kind="cos-sin")
    assert model.relative_bound(0.0) == pytest.approx(plain.relative_bound(0.0) + model.norm_unit)
    assert model.output_unit == pytest.approx(plain.output_unit + model.norm_unit)


def test_the_weights_are_drawn_never_ones_and_eps_matters_near_eps():
    import numpy as np

    w = normalization.weights(np.random.default_rng(0), 128)
    assert not np.allclose(np.abs(w), 1.0) and (w < 0).any() and (np.abs(w) >= 0.25).all()
    assert normalization.scale("near eps", "bfloat16") < normalization.scale("model scale", "bfloat16")
    assert normalization.scale("near eps", "float16") == normalization.FLOAT16_NEAR_EPS


def test_the_fused_presets_are_listed_with_their_signatures():
    assert PRESETS["vllm-qk-norm-rope"].signature().startswith("fn(qkv, num_heads_q, num_heads_k, num_heads_v")
    result = cli_check("--help")
    assert "vllm-qk-norm-rope" in result.output and "sglang-qk-norm-rope" in result.output


def test_a_real_bug_is_exit_1_and_the_correct_kernel_exit_0_on_the_command_line():
    bad = cli_check(f"{KERNELS}:vllm_writes_v", "--api", "vllm-qk-norm-rope", "--layout", "half", "--profile", "ci",
                    "--dtype", "bfloat16", "--property", "contract")  # fmt: skip
    assert bad.exit_code == 1, bad.output
    assert "wrote into v's heads" in bad.output
    good = cli_check(f"{KERNELS}:vllm_correct", "--api", "vllm-qk-norm-rope", "--layout", "half", "--profile", "ci",
                     "--dtype", "bfloat16", "--property", "contract,reference")  # fmt: skip
    assert good.exit_code == 0, good.output
