"""fp8 outputs (``--api flashinfer-rope-fp8``, issue 26): a kernel written to FlashInfer's
``rope_quantize_fp8`` signature is checked with no wrapper, its outputs dequantized under
the quantized error model; a correct kernel passes in float32 and bfloat16, in both fp8
formats (each run draws both), and every defect fails with words that name it."""

from __future__ import annotations

import numpy as np
import pytest

import ropecheck
from ropecheck.calling.presets import PRESETS
from ropecheck.properties.core.quantization import FORMATS, HEADROOM, quantized, scales
from ropecheck.properties.tolerance import ErrorModel

KERNELS = "tests/fp8_kernels.py"
API = "flashinfer-rope-fp8"
DTYPES = "float32,bfloat16"
QUICK = ["contract", "reference", "fp8-saturation"]
PARTIAL = {"rotary_dim": 8}  # nope parts of 0, 8, 24 and 48 features (head sizes 8, 16, 32, 56)


def run(name: str, properties=QUICK, **options):
    options.setdefault("layout", "half")
    options.setdefault("dtypes", DTYPES)
    return ropecheck.check(f"{KERNELS}:{name}", api=API, properties=properties, in_process=True, **options)


CORRECT = [
    ("fp8_correct", {}),
    ("fp8_correct", PARTIAL),
    ("fp8_correct", {"layout": "interleaved", **PARTIAL}),
    ("fp8_rounds_to_input_dtype", PARTIAL),
]


@pytest.mark.parametrize("name, options", CORRECT, ids=[f"{n}-{len(o)}" for n, o in CORRECT])
def test_a_correct_fp8_kernel_passes(name, options):
    report = run(name, **options)
    assert report.passed, [(r.property, r.dtype, r.message) for r in report.failures]
    assert {r.property for r in report.results if r.status == "passed"} == set(QUICK)


# (kernel, options, the property that must catch it, words its message must hold)
BROKEN = [
    ("fp8_scale_twice", {}, "reference", "against the float64 reference"),
    ("fp8_q_scale_for_k", {}, "reference", "k's head"),
    # q's scale on k spoils k's rotated part and its pass-through part: either finding names k
    ("fp8_q_scale_for_k", PARTIAL, "reference", ("k_nope_out at token", "k's head")),
    ("fp8_nope_rotated", PARTIAL, "reference", "q_nope_out at token"),
    ("fp8_nope_unscaled", PARTIAL, "reference", "saturate(q_nope * quant_scale_q"),
    ("fp8_no_saturation", {}, "fp8-saturation", "must saturate to +-"),
    ("fp8_no_saturation", PARTIAL, "fp8-saturation", "for finite input"),
    ("fp8_returns_input_dtype", {}, "reference", "requested quantize_dtype=torch.float8_e4m3fn"),
    ("fp8_e4m3_always", {}, "reference", "requested quantize_dtype=torch.float8_e5m2"),
    ("fp8_rotates_in_place", {}, "contract", "modified its input x in place"),
]


@pytest.mark.parametrize("name, options, prop, words", BROKEN, ids=[f"{b[0]}-{len(b[1])}" for b in BROKEN])
def test_a_broken_fp8_kernel_fails(name, options, prop, words):
    report = run(name, properties=[prop], **options)
    failed = {r.dtype for r in report.failures if r.property == prop}
    assert failed == {"float32", "bfloat16"}, [(r.property, r.dtype, r.status) for r in report.results]
    text = " ".join(f"{r.message} {r.diagnosis} {r.counterexample}" for r in report.failures)
    assert any(w in text for w in ((words,) if isinstance(words, str) else words)), text


def test_a_nope_finding_names_the_tensor_token_head_and_scale():
    report = run("fp8_nope_unscaled", properties=["reference"], dtypes="float32", **PARTIAL)
    (failure,) = report.failures
    assert "q_nope_out at token " in failure.message and ", head " in failure.message, failure.message
    assert "quant_scale_q = " in failure.message and "float8_e" in failure.message


def test_both_formats_are_drawn_in_every_run():
    iface = PRESETS[API].interface
    assert iface.space.factor("quantize_dtype").names == tuple(FORMATS) == iface.quantized
    assert PRESETS[API].signature() == (
        "fn(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True, quantize_dtype=None, "
        "quant_scale_q=1, quant_scale_kv=1) -> (q_rope_out, k_rope_out, q_nope_out, k_nope_out)"
    )


@pytest.mark.parametrize("magnitude", [0.01, 1.0, 100.0, 1e5])
@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=list(FORMATS))
def test_the_scales_keep_outputs_below_half_the_maximum_and_away_from_one(fmt, magnitude):
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((6, 4, 16)) * magnitude for _ in range(2))
    scale_q, scale_kv = scales(q, k, fmt)
    for values, scale in ((q, scale_q), (k, scale_kv)):
        # a rotated element is at most sqrt(2) amax: below max / 2 after scaling
        assert np.sqrt(2.0) * np.abs(values).max() * scale <= fmt.max / 2 * (1 + 2**-23)
        assert not 0.5 < scale < 2.0
        assert scale == float(np.float32(scale))
    assert scale_q / scale_kv >= 4.0 * (1 - 2**-23)  # quant_scale_kv ignored is off by 4x or more
    saturating = scales(q, k, fmt, saturate=True)
    assert all(np.abs(v).max() * s > fmt.max for v, s in zip((q, k), saturating))
    assert HEADROOM == 2 * np.sqrt(2.0)


def test_an_input_whose_head_vectors_the_subnormals_would_swallow_is_refused():
    q = np.ones((2, 1, 8))
    q[1] = 1e-6  # a head vector 10^6 times smaller than the largest element
    with pytest.raises(ValueError, match="subnormals would swallow"):
        scales(q, q, FORMATS["float8_e4m3fn"])


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=list(FORMATS))
def test_the_quantized_error_model_covers_a_round_trip_and_is_tight(fmt):
    """fp8(x * s) / s, x in bf16, against the model's pass-through bound: inside it, and
    the worst element uses at least half of it (the model is not loose)."""
    import torch

    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((64, 2, 32))).to(torch.bfloat16)
    x64 = x.double().numpy()
    scale, _ = scales(x64, x64, fmt)
    out = ((x.float() * scale).to(fmt.dtype).double() / scale).to(torch.bfloat16).double().numpy()
    model = ErrorModel("bfloat16", table_kind="cos-sin", table_dtype="float32", quantized=fmt.name)
    bound = np.abs(x64) * model.output_unit + model.element_floor(x64)
    ratio = np.abs(out - x64) / bound
    assert ratio.max() <= 1.0
    assert ratio.max() >= 0.5
    expected, nope_bound = quantized(x64, scale, fmt, 2.0**-8)
    fp8 = (x.float() * scale).to(fmt.dtype).double().numpy()
    assert (np.abs(fp8 - expected) <= nope_bound).all()
