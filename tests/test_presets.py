"""Library interfaces as presets (``--api``, issue 25): a kernel written to a real library's
RoPE signature is checked with no wrapper; every correct one passes and every broken one
fails, in float32 and bfloat16, and a failure names the interface argument at fault."""

from __future__ import annotations

import pytest

import ropecheck
from ropecheck.calling.presets import PRESETS
from tests.test_cli import check as cli_check
from tests.test_cli import run_cli

KERNELS = "tests/preset_kernels.py"
DTYPES = "float32,bfloat16"
# the properties a correct kernel must pass here (every property runs in the acceptance
# corpus, acceptance/corpus.py "api-*"): the contract, the reference, the table of -m
QUICK = ["contract", "reference", "table-inverse"]
YARN = "yarn:factor=4,original_max_position_embeddings=4096"  # an attention factor (mscale) of 1.139


def run(name: str, api: str, properties=QUICK, kernels: str = KERNELS, **options):
    options.setdefault("layout", "half")
    options.setdefault("dtypes", DTYPES)
    return ropecheck.check(f"{kernels}:{name}", api=api, properties=properties, in_process=True, **options)


CORRECT = [
    ("vllm_correct", "vllm", {}),
    ("vllm_correct", "vllm", {"layout": "interleaved"}),
    ("vllm_correct", "vllm", {"rotary_dim": 8}),
    ("flashinfer_cache_correct", "flashinfer-cos-sin-cache", {}),
    ("pos_ids_correct", "flashinfer-pos-ids", {"rotary_dim": 8}),
    ("pos_ids_correct", "flashinfer-pos-ids", {"layout": "interleaved", "scaling": "linear:factor=4"}),
    ("flash_correct", "flash-attn", {}),
    ("flash_correct", "flash-attn", {"call": "packed", "layout": "interleaved"}),
    ("hf_correct", "hf", {}),
    ("te_correct", "te", {}),
    ("te_correct", "te", {"call": "packed"}),
    ("megatron_correct", "megatron", {}),
    ("megatron_correct", "megatron", {"call": "packed", "layout": "interleaved"}),
    ("megatron_correct", "megatron", {"scaling": YARN}),
]


# 8 drawn examples (ci draws 20) beside the fixed inputs that carry a passing run (critical
# positions, large and size switch inputs, the probes, the accuracy sweep): a correct kernel's
# pass took over half its time drawing; the broken kernels keep the ci profile's draws
CORRECT_DRAWS = 8


@pytest.mark.parametrize("name, api, options", CORRECT, ids=[f"{a}-{n}-{len(o)}" for n, a, o in CORRECT])
def test_a_correct_kernel_in_its_libraries_signature_passes(name, api, options):
    report = run(name, api, max_examples=CORRECT_DRAWS, **options)
    assert report.passed, [(r.property, r.dtype, r.message) for r in report.failures]


@pytest.mark.parametrize("name", ["ropecheck-cache-rope", "ropecheck-cache-rope-flashinfer"])
def test_the_projects_own_table_fed_kernel_passes_through_the_serving_presets(name):
    # 5 drawn examples (ci draws 20) beside the fixed, critical and size switch inputs: the
    # kernel runs under Triton's interpreter here, as test_adapters' and test_triton_kernel's do
    report = ropecheck.check(name, dtypes=DTYPES, properties=QUICK, in_process=True, max_examples=5)
    assert report.passed, [(r.property, r.dtype, r.message) for r in report.failures]


# (kernel, preset, options, the property that must catch it, words its message must hold)
BROKEN = [
    ("vllm_next_row", "vllm", {}, "reference", ""),
    ("vllm_cos_sin_swapped", "vllm", {}, "reference", "cos and sin are swapped"),
    ("vllm_key_none_crashes", "vllm", {}, "reference", "k None"),
    ("vllm_key_none_rotates_query", "vllm", {}, "reference", "k None"),
    ("vllm_rotary_dim_ignored", "vllm", {"rotary_dim": 8}, "reference", ""),
    ("vllm_one_head_stride", "vllm", {}, "reference", ""),
    ("vllm_token_stride_ignored", "vllm", {}, "reference", ""),
    ("vllm_mqa_key_unrotated", "vllm", {}, "reference", "k's head 0"),
    ("vllm_wrong_head", "vllm", {}, "reference", ""),
    ("vllm_fused_path_bug", "vllm", {}, "reference", ""),
    ("vllm_stale_cache", "vllm", {}, "table-inverse", "T_-m"),
    ("vllm_writes_cache", "vllm", {}, "contract", "the target wrote into cos_sin_cache"),
    ("flashinfer_cache_next_row", "flashinfer-cos-sin-cache", {}, "reference", ""),
    ("pos_ids_rotary_dim_ignored", "flashinfer-pos-ids", {"rotary_dim": 8}, "reference", "rotary_dim is not applied"),
    ("pos_ids_int16", "flashinfer-pos-ids", {}, "reference", ""),
    ("flash_row0_offsets", "flash-attn", {}, "reference", "batch row 0's seqlen_offsets"),
    ("flash_decode_row0", "flash-attn", {}, "reference", ""),
    ("flash_cos_sin_swapped", "flash-attn", {}, "reference", "cos and sin are swapped"),
    ("flash_half_read_as_full", "flash-attn", {}, "reference", "read as a full-width table"),
    ("hf_batch_row0", "hf", {}, "reference", ""),
    ("hf_mqa_key_unrotated", "hf", {}, "reference", "k's head 0"),
    ("te_row0_start_positions", "te", {}, "reference", "batch row 0's start_positions"),
    ("megatron_thd_restarts", "megatron", {"call": "packed"}, "reference", ""),
    ("megatron_mscale_ignored", "megatron", {"scaling": YARN}, "reference", ""),
    ("megatron_interleaved_ignored", "megatron", {"layout": "interleaved"}, "reference", ""),
    ("megatron_writes_freqs", "megatron", {}, "contract", "the target wrote into freqs"),
]


@pytest.mark.parametrize("name, api, options, prop, words", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_kernel_in_its_libraries_signature_fails(name, api, options, prop, words):
    report = run(name, api, properties=[prop], **options)
    failed = {r.dtype for r in report.failures if r.property == prop}
    assert failed == {"float32", "bfloat16"}, [(r.property, r.dtype, r.status) for r in report.results]
    text = " ".join(f"{r.message} {r.diagnosis} {r.counterexample}" for r in report.failures)
    assert words in text, text


def test_a_cache_read_one_row_late_is_named_by_row_token_and_position():
    report = run("vllm_next_row", "vllm", properties=["reference"], dtypes="float32")
    (failure,) = report.failures
    assert "of cos_sin_cache is read for token" in failure.diagnosis, failure.diagnosis
    assert "off by +1" in failure.diagnosis


def test_a_target_whose_signature_does_not_fit_its_preset_is_exit_2_with_the_signature():
    result = cli_check(f"{KERNELS}:not_a_preset", "--api", "vllm", "--layout", "half")
    assert result.exit_code == 2, result.output
    assert "fn(positions, query, key, head_size, cos_sin_cache, is_neox)" in " ".join(result.output.split())


REFUSED = [
    ("vllm_correct", "vllm", ["--scaling", "dynamic:factor=2"], "cos_sin_cache"),
    ("hf_correct", "hf", ["--rotary-dim", "8"], "--rotary-dim cannot be given"),
    ("pos_ids_correct", "flashinfer-pos-ids", ["--scaling", "yarn:factor=4"], "rope_scale"),
    ("vllm_correct", "vllm", ["--call", "packed"], "--call qk"),
]


@pytest.mark.parametrize("name, api, flags, words", REFUSED, ids=[f"{r[1]}-{r[2][0]}" for r in REFUSED])
def test_what_an_interface_cannot_be_given_is_exit_2_with_the_reason(name, api, flags, words):
    result = cli_check(f"{KERNELS}:{name}", "--api", api, "--layout", "half", *flags)
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split()), result.output


def test_presets_are_listed_with_their_signatures_and_the_targets_through_them():
    result = run_cli("list")
    text = " ".join(result.output.split())
    assert "--api hf: " in text and "hf-apply-rotary-pos-emb" in text
    for name, preset in PRESETS.items():
        assert f"--api {name}: {preset.signature()}" in text


def test_an_unknown_preset_is_a_usage_error():
    result = cli_check(f"{KERNELS}:vllm_correct", "--api", "vllm2", "--layout", "half")
    assert result.exit_code == 2
    assert "vllm2" in result.output
