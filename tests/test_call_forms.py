"""The call forms (issue 11): kernels written in production signatures,
``rope(q, k, positions)`` (call qk), ``rope(x, cu_seqlens, positions)`` (call packed)
and ``rope(x, positions)`` (call x), from tests/call_form_kernels.py, checked alone
against the float64 reference: the correct ones agree, each broken one disagrees exactly
on the inputs that expose it and agrees on the others. They guard the kernels, so that a
verdict of ropecheck on them is about ropecheck, not the kernel.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

import reference
from tests import call_form_kernels as kernels

# float32 agreement with the float64 reference at positions below 64 (HF-style float32
# angles: about 64 * 2^-24 rad), and the least error a broken kernel must show there
AGREE = 1e-4
DISAGREE = 1e-2
MAX_POSITION = 64


def ref(x: torch.Tensor, positions: torch.Tensor) -> np.ndarray:
    return reference.apply_rope(x.detach().double().numpy(), positions.numpy(), layout="half")


def error(out: torch.Tensor, x: torch.Tensor, positions: torch.Tensor) -> float:
    return float(np.abs(out.detach().double().numpy() - ref(x, positions)).max())


def randn(*shape, seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def random_positions(*shape, seed=1) -> torch.Tensor:
    return torch.randint(0, MAX_POSITION, shape, generator=torch.Generator().manual_seed(seed))


# --- the kernels alone: call qk --------------------------------------------------------------

# (batch, seq, q_heads, k_heads); the rows of a batch have different positions
QK_CASES = {
    "mha": (2, 5, 4, 4),
    "gqa": (2, 5, 4, 2),
    "mqa": (2, 5, 4, 1),
    "gqa-one-row": (1, 5, 8, 2),
    "mqa-one-row": (1, 5, 4, 1),
}
QK_KERNELS = ("qk_correct", "qk_optional_k", "qk_k_unrotated_mqa", "qk_k_wrong_head",
              "qk_k_row0_positions", "qk_bad_k_backward")
# the cases on which each broken kernel's k is wrong (q is right everywhere)
K_WRONG_ON = {
    "qk_k_unrotated_mqa": {"mqa", "mqa-one-row"},
    "qk_k_wrong_head": {"gqa", "gqa-one-row"},  # MHA and MQA have no head to confuse
    "qk_k_row0_positions": {"mha", "gqa", "mqa"},  # one row is its own row 0
}


def qk_inputs(case: str, storage: str, head_dim: int = 8):
    """q, k and positions; ``fused``: q and k are slices of one qkv tensor (shared storage)."""
    batch, seq, q_heads, k_heads = QK_CASES[case]
    if storage == "fused":
        qkv = randn(batch, seq, q_heads + 2 * k_heads, head_dim)
        q, k = qkv[:, :, :q_heads], qkv[:, :, q_heads:q_heads + k_heads]
    else:
        q, k = randn(batch, seq, q_heads, head_dim), randn(batch, seq, k_heads, head_dim, seed=2)
    return q, k, random_positions(batch, seq)


@pytest.mark.parametrize("storage", ["separate", "fused"])
@pytest.mark.parametrize("case", list(QK_CASES))
@pytest.mark.parametrize("name", QK_KERNELS)
def test_qk_kernel_against_reference(name, case, storage):
    q, k, positions = qk_inputs(case, storage)
    q_out, k_out = getattr(kernels, name)(q, k, positions)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    assert error(q_out, q, positions) < AGREE
    if case in K_WRONG_ON.get(name, ()):
        assert error(k_out, k, positions) > DISAGREE
    else:
        assert error(k_out, k, positions) < AGREE


def test_qk_row0_positions_is_right_when_the_rows_agree():
    q, k, positions = qk_inputs("gqa", "separate")
    positions = positions[:1].repeat(2, 1)
    q_out, k_out = kernels.qk_k_row0_positions(q, k, positions)
    assert error(k_out, k, positions) < AGREE


def test_qk_optional_k_takes_no_k():
    q, _, positions = qk_inputs("gqa", "separate")
    q_out, k_out = kernels.qk_optional_k(q, None, positions)
    assert k_out is None
    assert error(q_out, q, positions) < AGREE


def qk_grads(name: str, case: str = "gqa"):
    """(q, k, positions, grad_q, grad_k, dq, dk): the VJP of a qk kernel at random cotangents."""
    q, k, positions = qk_inputs(case, "separate")
    q, k = q.requires_grad_(), k.requires_grad_()
    grad_q, grad_k = randn(*q.shape, seed=3), randn(*k.shape, seed=4)
    q_out, k_out = getattr(kernels, name)(q, k, positions)
    dq, dk = torch.autograd.grad((q_out, k_out), (q, k), (grad_q, grad_k))
    return q, k, positions, grad_q, grad_k, dq, dk


@pytest.mark.parametrize("case", ["mha", "gqa", "mqa"])
@pytest.mark.parametrize("name", ["qk_correct", "qk_bad_k_backward"])
def test_qk_backward_against_reference(name, case):
    """The VJP is R_m^T g = R_{-m} g: right for both in q; wrong in k for the broken one."""
    q, k, positions, grad_q, grad_k, dq, dk = qk_grads(name, case)
    assert error(dq, grad_q, -positions) < AGREE
    k_error = error(dk, grad_k, -positions)
    assert k_error > DISAGREE if name == "qk_bad_k_backward" else k_error < AGREE


# --- the kernels alone: call packed -------------------------------------------------------

# (lengths, offsets): sequence i holds positions offsets[i] + 0 .. lengths[i] - 1 (an
# empty sequence's offset is never read)
PACKED_CASES = {
    "restart-at-0": ((3, 4, 2), (0, 0, 0)),
    "equal-offsets": ((3, 4, 2), (5, 5, 5)),
    "distinct-offsets": ((3, 4, 2), (0, 10, 3)),
    "empty-first": ((0, 3, 4), (0, 7, 2)),
    "empty-middle": ((3, 0, 4, 2), (1, 0, 6, 9)),
    "empty-last": ((3, 4, 0), (2, 2, 0)),
    "two-empties": ((2, 0, 0, 3), (4, 0, 0, 9)),  # the buggy walk steps over the second empty one
}
PACKED_KERNELS = ("packed_correct", "packed_offsets_correct", "packed_restart",
                  "packed_prev_offset", "packed_empty_skip")
PACKED_WRONG_ON = {
    "packed_restart": {"equal-offsets", "distinct-offsets", "empty-first", "empty-middle",
                       "empty-last", "two-empties"},
    "packed_prev_offset": {"distinct-offsets", "empty-first", "empty-middle", "two-empties"},
    "packed_empty_skip": {"empty-first", "empty-middle"},
}


def packed_inputs(lengths, offsets, heads: int = 3, head_dim: int = 8):
    cu_seqlens = torch.tensor(np.concatenate(([0], np.cumsum(lengths))), dtype=torch.int32)
    positions = torch.cat([offset + torch.arange(n) for n, offset in zip(lengths, offsets)])
    return randn(int(cu_seqlens[-1]), heads, head_dim), cu_seqlens, positions


@pytest.mark.parametrize("case", list(PACKED_CASES))
@pytest.mark.parametrize("name", PACKED_KERNELS)
def test_packed_kernel_against_reference(name, case):
    x, cu_seqlens, positions = packed_inputs(*PACKED_CASES[case])
    y = getattr(kernels, name)(x, cu_seqlens, positions)
    assert y.shape == x.shape
    # the reference takes (total,) positions leading a (total, heads, head_dim) x
    if case in PACKED_WRONG_ON.get(name, ()):
        assert error(y, x, positions) > DISAGREE
    else:
        assert error(y, x, positions) < AGREE


def test_packed_offsets_kernel_assumes_offset_plus_index():
    """packed_offsets_correct reads only each sequence's first position: right for the
    positions the packed form is given, wrong for any others (so ropecheck must keep
    to offset + arange in every call it makes)."""
    x, cu_seqlens, _ = packed_inputs((3, 4), (0, 0))
    gaps = torch.tensor([0, 2, 4, 10, 11, 13, 20])
    assert error(kernels.packed_correct(x, cu_seqlens, gaps), x, gaps) < AGREE
    assert error(kernels.packed_offsets_correct(x, cu_seqlens, gaps), x, gaps) > DISAGREE


# --- the kernels alone: call x -----------------------------------------------------------------

@pytest.mark.parametrize("view", ["contiguous", "transposed", "sbhd"])
def test_sbhd_kernel_against_reference(view):
    x = {"contiguous": lambda: randn(2, 5, 3, 8),
         "transposed": lambda: randn(2, 3, 5, 8).transpose(1, 2),  # HF's (b, h, s, d) storage
         "sbhd": lambda: randn(5, 2, 3, 8).transpose(0, 1)}[view]()
    positions = random_positions(2, 5)
    assert error(kernels.sbhd_correct(x, positions), x, positions) < AGREE


# (batch, seq, heads, head_dim): the fast path starts at batch * seq * heads = 2^14
FAST_PATH_CASES = {
    "2^14 - 1": ((3, 5461, 1, 8), False),
    "2^14": ((1, 512, 32, 256), True),  # the engine's large input: head_dim 256
    "2^15 + 1": ((1, 2**15 + 1, 1, 8), True),
}


@pytest.mark.parametrize("case", list(FAST_PATH_CASES))
def test_x_fast_path_kernel_is_wrong_from_2_14_tokens_x_heads(case):
    shape, wrong = FAST_PATH_CASES[case]
    x, positions = randn(*shape), random_positions(*shape[:2])
    e = error(kernels.x_fast_path_bug(x, positions), x, positions)
    assert e > DISAGREE if wrong else e < AGREE

