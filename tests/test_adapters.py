"""Third-party adapters: each available one agrees with the float64 reference of the
convention it declares (or fails only as its known-failure record says); unavailable ones
say why, with the install hint, instead of crashing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ropecheck.properties.checks import PROPERTIES
from ropecheck.properties.runner import RunOptions, run_property
from ropecheck.session import known_failures
from ropecheck.adapters import ADAPTERS
from ropecheck.adapters.registry import Adapter
from ropecheck.session.loading import TargetLoadError, load
from ropecheck.targets.target import Convention

QUICK = RunOptions(profile="ci", max_examples=4, timeout=120)
SLOW = {n for n in ADAPTERS if n.startswith(("flash-attn-rotary", "liger-kernel", "flash-attn-apply", "liger-rotary",
                                              "ropecheck-cache-rope"))}  # interpreter
# The fixed large inputs (fixed_cases.large_cases: 2^14 and 2^15 + 1 tokens x heads) take
# most of an interpreted Triton adapter's test (40 s of 45): they are tried on one adapter
# per kernel whose launch changes with the size (flash-attn's grid of sequence blocks, the
# half and interleaved layouts one constexpr of the same kernel; the project's cache kernel),
# not on liger-kernel's (one program per token row, blocks the next power of two of the heads
# and head size: no size switch; 237 s of a loaded run with them) nor on wrappers of those;
# their wiring is checked at the drawn and critical inputs.
LARGE_INPUTS_ON = {"flash-attn-rotary", "ropecheck-cache-rope"}
KNOWN = known_failures.load()
ONE_D = sorted(n for n, a in ADAPTERS.items() if a.family == "rope")  # N-D ones: tests/test_nd_checks.py


@pytest.mark.parametrize("name", ONE_D)
def test_adapter_agrees_with_reference_or_says_why_not(name):
    adapter = ADAPTERS[name]
    why = adapter.why_unavailable()
    if why:
        with pytest.raises(TargetLoadError, match="not available here"):
            load(name)
        pytest.skip(why)
    target = load(name)
    reference = PROPERTIES["reference"]
    if name in SLOW:
        # the size switch inputs (2^13 token x heads and up) took three quarters of an
        # interpreted adapter's test (180 s of liger-kernel's under load): the switches are
        # the kernels' own, checked on GPUs and by tests/test_interface_paths.py
        reference = replace(reference, size_switches=False)
    if name in SLOW and name not in LARGE_INPUTS_ON:
        reference = replace(reference, large=0)  # its kernel had them in LARGE_INPUTS_ON's test
    options = RunOptions(profile="ci", max_examples=2, timeout=300) if name in SLOW else QUICK
    result = run_property(reference, target, "float32", options)
    result = known_failures.apply(name, [result], KNOWN)[0]
    assert result.status in ("passed", "known"), f"{name}: {result.message}"


def test_unavailable_library_is_reported_with_install_hint():
    ghost = Adapter("ghost", "ghost-rope-lib", build=lambda: None, convention=Convention("half"),
                    description="", modules=("ghost_rope_lib",), install="pip install ghost-rope-lib")
    assert ghost.why_unavailable() == "ghost_rope_lib is not installed (pip install ghost-rope-lib)"


def test_every_adapter_declares_a_convention_and_an_install_hint():
    for adapter in map(ADAPTERS.get, ONE_D):
        assert adapter.convention is not None and adapter.install, adapter.name


def test_dtype_finding_in_rotary_embedding_torch_is_caught_and_recorded():
    """rotate_queries_or_keys counts positions in the input dtype: in bfloat16 the check
    fails (and the shipped record turns it into a known failure)."""
    if ADAPTERS["rotary-embedding-torch"].why_unavailable():
        pytest.skip("rotary-embedding-torch is not installed")
    result = run_property(PROPERTIES["reference"], load("rotary-embedding-torch"), "bfloat16", QUICK)
    assert result.status == "failed"
    assert known_failures.apply("rotary-embedding-torch", [result], KNOWN)[0].status == "known"


def test_liger_writes_its_result_into_q():
    """Finding (README): LigerRopeFunction, which stands in for HF's out-of-place
    apply_rotary_pos_emb, overwrites q with the rotated values when q is the transposed view
    of a (batch, seq, heads, head_dim) projection, which is how HF models pass it."""
    if ADAPTERS["liger-kernel"].why_unavailable():
        pytest.skip("liger-kernel is not installed")
    import torch

    from ropecheck.adapters.triton_kernels import _hf_cos_sin, _triton_ready
    _triton_ready()
    from liger_kernel.ops.rope import LigerRopeFunction

    q = torch.randn(1, 3, 2, 8).transpose(1, 2)  # (batch, heads, seq, head_dim) view
    before = q.clone()
    cos, sin = _hf_cos_sin(torch.arange(3)[None], 8, q.dtype)
    out, _ = LigerRopeFunction.apply(q, torch.zeros(1, 1, 3, 8), cos, sin)
    assert not torch.equal(q, before) and torch.equal(q, out)


def test_liger_one_token_row_stride():
    """Finding (README): for one token, liger's rope steps between batch rows with the
    stride of the size-1 sequence dimension, which a contiguous q need not make
    heads * head_dim: a cloned one-token slice of a (batch, heads, seq, dim) tensor gets
    row 1 starts at batch 0's second head instead of batch 1, so that head is turned twice
    and batch 1's last head not at all; the same values with the usual strides are right."""
    if ADAPTERS["liger-kernel"].why_unavailable():
        pytest.skip("liger-kernel is not installed")
    import torch

    from ropecheck.adapters.triton_kernels import _hf_cos_sin, _triton_ready
    _triton_ready()
    from liger_kernel.ops.rope import LigerRopeFunction

    q = torch.randn(2, 2, 2, 8, generator=torch.Generator().manual_seed(0))[:, :, 1:2].clone()
    usual = torch.empty_strided(q.shape, (16, 8, 16, 1)).copy_(q)  # q_proj(h).view(..).transpose(1, 2)
    assert q.is_contiguous() and q.stride() == (16, 8, 8, 1)
    cos, sin = _hf_cos_sin(torch.tensor([[5], [5]]), 8, torch.float32)
    odd, _ = LigerRopeFunction.apply(q.clone(), torch.zeros(2, 1, 1, 8), cos, sin)
    right, _ = LigerRopeFunction.apply(usual.clone(), torch.zeros(2, 1, 1, 8), cos, sin)
    assert torch.allclose(odd[0, 0], right[0, 0])
    assert not torch.allclose(odd[0, 1], right[0, 1])  # turned twice
    assert torch.equal(odd[1, 1], q[1, 1])  # never turned


def test_liger_backward_writes_into_grad_output():
    """Finding (README): LigerRopeFunction.backward returns dq in the memory of the incoming
    gradient; the values are R_m^T g."""
    if ADAPTERS["liger-kernel"].why_unavailable():
        pytest.skip("liger-kernel is not installed")
    import torch

    from ropecheck import reference
    q, k = torch.randn(1, 1, 1, 8, requires_grad=True), torch.randn(1, 1, 1, 8, requires_grad=True)
    g = torch.randn(1, 1, 1, 8)
    given = g.clone()
    q_out, _ = load("liger-kernel").fn(q, k, torch.tensor([[1]]))
    (dq,) = torch.autograd.grad(q_out, q, g)
    assert not torch.equal(g, given)  # the caller's gradient buffer was overwritten
    expected = reference.apply_rope(given.double().numpy(), [[-1]], layout="half")
    assert torch.allclose(dq.double(), torch.from_numpy(expected), atol=1e-6)
