"""M-RoPE through the serving presets (``--family mrope --api ...``, issue 45): positions
(3, T), a text-only batch (the three rows equal) and image and video tokens (the rows
differ), chunked and interleaved sections; every correct kernel passes the N-D checks and
the real M-RoPE serving bugs fail (only the temporal row read, the interleaved selector
without its bound, the token count taken from the (3, T) positions' numel)."""

from __future__ import annotations

import numpy as np
import pytest

import ropecheck
from ropecheck.properties.interfaces.draws import media_of
from ropecheck.reference.multimodal import qwen2vl_positions
from tests.test_cli import check as cli_check
from tests.test_presets import CORRECT_DRAWS

KERNELS = "tests/mrope_serving_kernels.py"
QUICK = ["contract", "invertibility", "reference"]


def run(name: str, api: str, sections="2,3,3", properties=QUICK, **options):
    return ropecheck.check(
        f"{KERNELS}:{name}", api=api, family="mrope", sections=sections, properties=properties, in_process=True,
        **options,
    )  # fmt: skip


def failures(report) -> list:
    return [(r.property, r.dtype, r.message) for r in report.failures]


CORRECT = [
    ("vllm_correct", "vllm", {}),
    ("vllm_correct", "vllm", {"mrope_interleaved": True, "sections": "24,20,20", "base": 1e6}),
    ("vllm_correct", "vllm", {"layout": "interleaved"}),
    ("flashinfer_correct", "flashinfer-cos-sin-cache", {}),
    ("vllm_kv_correct", "vllm-kvcache", {}),
    ("sglang_kv_correct", "sglang-kvcache", {"mrope_interleaved": True}),
    ("qk_norm_correct", "vllm-qk-norm-rope", {}),
    ("sglang_correct", "sglang-mrope", {}),
    ("sglang_correct", "sglang-mrope", {"mrope_interleaved": True}),
]


@pytest.mark.parametrize("name, api, options", CORRECT, ids=[f"{a}-{n}-{len(o)}" for n, a, o in CORRECT])
def test_a_correct_mrope_kernel_passes_through_the_serving_presets(name, api, options):
    report = run(name, api, max_examples=CORRECT_DRAWS, **options)  # (tests/test_presets.py says why)
    assert report.passed, failures(report)


def test_every_pair_of_classes_and_every_medium_is_called():
    report = run("vllm_correct", "vllm", properties=["reference"], dtypes="float32")
    coverage = report.session.interface_coverage()["float32"]
    assert not coverage.missing, coverage.missing[:5]
    assert any(dict(p).get("media") == "video" and dict(p).get("key") == "None" for p in coverage.covered)


# (kernel, preset, options, the property that must catch it)
BROKEN = [
    ("vllm_temporal_row_only", "vllm", {}, "reference"),  # sglang #35744's defect, in vLLM's signature
    ("sglang_temporal_row_only", "sglang-mrope", {}, "reference"),
    ("sglang_kv_temporal_row_only", "sglang-kvcache", {}, "reference"),
    ("qk_norm_temporal_row_only", "vllm-qk-norm-rope", {}, "reference"),  # sglang PR #35744
    ("vllm_token_count_from_numel", "vllm", {}, "contract"),  # sgl-kernel-xpu PR #202
    # vLLM PR #40680: the interleaved selector (only the lowest pairs: float32 sees them)
    ("vllm_interleaved_selector", "vllm", {"mrope_interleaved": True, "sections": "4,2,2", "dtypes": "float32"},
     "reference"),
]  # fmt: skip


@pytest.mark.parametrize("name, api, options, prop", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_mrope_serving_kernel_fails(name, api, options, prop):
    report = run(name, api, properties=[prop], **options)  # the property that must catch it
    assert any(r.property == prop for r in report.failures), failures(report) or "passed"


def test_the_media_of_a_call_is_read_from_its_positions():
    text = qwen2vl_positions([("text", 7)])[None]
    image = qwen2vl_positions([("text", 2), ("image", 2, 2), ("text", 1)])[None]
    video = qwen2vl_positions([("video", 2, 1, 2), ("text", 1)], temporal_scale=2)[None]
    assert (media_of(text), media_of(image), media_of(video)) == ("text", "image", "video")
    assert media_of(np.concatenate((text, image))) == "image"


def test_a_1d_interface_outside_rope_and_mrope_and_the_mrope_one_alone_are_usage_errors():
    alone = cli_check(f"{KERNELS}:sglang_correct", "--api", "sglang-mrope", "--layout", "half")
    assert alone.exit_code == 2 and "--family mrope --sections" in alone.output, alone.output
    axial = cli_check(f"{KERNELS}:vllm_correct", "--api", "vllm", "--family", "axial", "--layout", "half")
    assert axial.exit_code == 2 and "--family mrope takes --api" in axial.output, axial.output
