"""Fused serving kernels through their libraries' signatures (issue 26): rope + KV-cache
write (``--api vllm-kvcache``, ``--api sglang-kvcache``), every output checked (q and k
rotated in place, each token's slot holding its rotated k and its v, every other slot
untouched, padding tokens writing nothing (vLLM's slot -1) or only their reserved slot
(SGLang's slot 0)), and MLA's k_pe in its latent row.
Every correct kernel passes and every defect fails, in float32 and bfloat16, with the
token, the slot and the tensor named."""

from __future__ import annotations

from functools import partial

import pytest

from tests import test_presets
from tests.test_cli import check as cli_check
from tests.test_presets import CORRECT_DRAWS

KERNELS = "tests/serving_kernels.py"
run = partial(test_presets.run, kernels=KERNELS)  # contract, reference and table-inverse by default


CORRECT = [
    ("vllm_kv_correct", "vllm-kvcache", {}),
    ("vllm_kv_correct", "vllm-kvcache", {"layout": "interleaved", "rotary_dim": 8}),
    ("sglang_kv_correct", "sglang-kvcache", {}),
    ("sglang_kv_correct", "sglang-kvcache", {"layout": "interleaved"}),
    # SGLang's conventions (presets.py: padding_slot, key_cached): padding tokens write the
    # slot its KV pool reserves for them, and its kernel leaves k as given since it stores
    # the rotation in k_cache only; vLLM's would be defects (BROKEN)
    ("sglang_kv_padding_written", "sglang-kvcache", {}),
    ("sglang_kv_key_only_in_cache", "sglang-kvcache", {}),
]


@pytest.mark.parametrize("name, api, options", CORRECT, ids=[f"{a}-{len(o)}" for _, a, o in CORRECT])
def test_a_correct_fused_cache_write_kernel_passes(name, api, options):
    report = run(name, api, max_examples=CORRECT_DRAWS, **options)  # (tests/test_presets.py says why)
    assert report.passed, [(r.property, r.dtype, r.message) for r in report.failures]


# (kernel, preset, words the contract finding must hold)
BROKEN = [
    ("vllm_kv_key_only_in_cache", "vllm-kvcache", "was left unrotated (the rotated k went only into"),
    ("vllm_kv_slot_off_by_one", "vllm-kvcache", "off by +1"),
    ("vllm_kv_padding_written", "vllm-kvcache", "is -1 (not to be cached)"),
    ("vllm_kv_value_rotated", "vllm-kvcache", "changed on its way into"),
    ("sglang_kv_slot_off_by_one", "sglang-kvcache", "off by +1"),
    ("sglang_kv_value_rotated", "sglang-kvcache", "changed on its way into"),
    ("sglang_kv_cached_unrotated", "sglang-kvcache", "but not into what k_cache slot"),
]


@pytest.mark.parametrize("name, api, words", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_fused_cache_write_defect_is_named_by_token_slot_and_tensor(name, api, words):
    report = run(name, api, properties=["contract"])
    failed = {r.dtype for r in report.failures if r.property == "contract"}
    assert failed == {"float32", "bfloat16"}, [(r.property, r.dtype, r.status) for r in report.results]
    message = report.failures[0].message
    assert words in message and "token " in message and "slot " in message, message
    caches = ("key_cache", "value_cache") if api == "vllm-kvcache" else ("k_cache", "v_cache")
    assert any(f"{cache} slot" in message for cache in caches), message  # the interface's own names


def test_the_rotated_key_left_out_of_key_fails_the_reference_too():
    """The values-only comparison sees the unrotated key as well (the cache check says why)."""
    report = run("vllm_kv_key_only_in_cache", "vllm-kvcache", properties=["reference"], dtypes="float32")
    assert not report.passed


def test_an_mla_key_whose_latent_row_stride_is_ignored_fails():
    """MLA's k_pe is a slice of its latent row (kv_lora_rank + rope per token): a kernel that
    walks key as contiguous tokens reads and writes the wrong features."""
    report = run("vllm_key_row_stride_ignored", "vllm", properties=["reference"])
    assert {r.dtype for r in report.failures} == {"float32", "bfloat16"}


def test_the_fused_presets_take_only_the_qk_call():
    result = cli_check(f"{KERNELS}:vllm_kv_correct", "--api", "vllm-kvcache", "--layout", "half", "--call", "packed")
    assert result.exit_code == 2, result.output
    assert "--call qk" in " ".join(result.output.split()), result.output
