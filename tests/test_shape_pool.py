"""The shape pool (issue 44): a target that compiles per shape (its calls launch Triton
kernels) draws its batch, heads and head size from a few shapes per call form, so that a
GPU compiles a few kernels per run, not one per draw; sequences, positions, layouts and
values stay drawn, the fixed inputs move onto the pool, and the bugs the shapes carry
(MQA, GQA, a head size that is not a power of two, batch rows) are still caught."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ropecheck
from ropecheck.properties.core.sizes import HUGE_ELEMENTS, POOLS, SIZES, TOY, parse, pool_head_dim, pool_shapes
from ropecheck.properties.inputs.fixed_cases import critical_cases, gqa_case, huge_case, large_cases, onto_pool
from ropecheck.properties.inputs.strategies import cases, partial_head_dims

HERE = Path(__file__).parent
CALL_FORMS = str(HERE / "call_form_kernels.py")
SIZE_KERNELS = str(HERE / "size_kernels.py")


def _shapes(sizes, call: str, rotary_dim=None) -> set:
    """(batch, heads, k heads, head size) of each pool shape in a call form."""
    dims = sizes.head_dims if rotary_dim is None else partial_head_dims(rotary_dim)
    out = set()
    for s in pool_shapes(sizes):
        heads, k = (s.q_heads, s.k_heads) if call == "qk" else (s.heads, 0)
        out.add((s.batch, heads, k, pool_head_dim(s.head, dims)))
    return out


def test_the_pool_is_chosen_by_the_sizes_and_the_switch():
    assert pool_shapes(TOY) == () and pool_shapes(TOY.pooled()) == POOLS[False]
    assert pool_shapes(SIZES["production"].pooled()) == POOLS[True]
    assert pool_shapes(TOY.pooled().one_model()) == ()  # one model's run draws its own one shape
    assert parse("toy,pool=yes").pool == "yes" and parse("toy,pool=no").spec() == "toy,pool=no"
    with pytest.raises(ValueError, match="pool: auto, yes or no"):
        parse("toy,pool=maybe")


@pytest.mark.parametrize("call", ["x", "qk", "packed"])
@pytest.mark.parametrize("name", ["toy", "production"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_pooled_draws_take_the_pool_s_shapes(name, call, data):
    """Every drawn input is in one of the pool's shapes (a packed input's batch is its
    sequences); the sequence, positions and layout still vary."""
    sizes = SIZES[name].pooled()
    for rotary_dim in (None, 32):
        case = data.draw(cases("float32", rotary_dim, call=call, sizes=sizes))
        shapes = _shapes(sizes, call, rotary_dim)
        if call == "packed":
            assert {(h, k, d) for _, h, k, d in shapes} >= {(case.heads, case.k_heads, case.head_dim)}
        else:
            assert (case.batch, case.heads, case.k_heads, case.head_dim) in shapes


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_property_needing_rows_draws_the_pool_s_shapes_with_rows(data):
    case = data.draw(cases("float32", call="qk", min_batch=2, sizes=TOY.pooled()))
    assert case.batch >= 2 and (case.batch, case.heads, case.k_heads, case.head_dim) in _shapes(TOY.pooled(), "qk")


@pytest.mark.parametrize("call", ["x", "qk"])
def test_fixed_inputs_move_onto_the_pool_keeping_their_point(call):
    """Small fixed inputs keep every row of positions (repeated up to the shape's batch);
    large ones keep their token x head product (q's and k's heads together), and the
    input past 2^31 elements stays past it; the grouped-query input stays grouped."""
    sizes = TOY.pooled()
    shapes = _shapes(sizes, call)
    for case in critical_cases("float32", None, call) + ([gqa_case("float32", 8)] if call == "qk" else []):
        moved = onto_pool(case, sizes, None)
        assert (moved.batch, moved.heads, moved.k_heads, moved.head_dim) in shapes
        assert set(moved.positions) >= {
            tuple(min(p, max(max(r) for r in moved.positions)) for p in row) for row in case.positions
        }
    grouped = onto_pool(gqa_case("float32", 8), sizes, None)
    assert 1 < grouped.k_heads < grouped.heads
    for case in large_cases("float32", None, call):
        moved = onto_pool(case, sizes, None, large=True)
        assert (moved.batch, moved.heads, moved.k_heads, moved.head_dim) in shapes
        width = moved.batch * (moved.heads + moved.k_heads)
        before, after = (
            case.batch * case.seq * (case.heads + case.k_heads),
            moved.batch * moved.seq * (moved.heads + moved.k_heads),
        )
        assert before <= after < before + width


@pytest.mark.parametrize("rotary_dim", [None, 32])
@pytest.mark.parametrize("call", ["x", "qk"])
def test_the_huge_input_stays_past_2_31_elements_in_the_pool(call, rotary_dim):
    huge = huge_case("bfloat16", rotary_dim, call)
    moved = onto_pool(huge, SIZES["production"].pooled(), rotary_dim, large=True)
    assert HUGE_ELEMENTS <= math.prod(moved.shape) < math.prod(huge.shape) + moved.batch * math.prod(moved.shape[2:])


def _turn(x: torch.Tensor, positions: torch.Tensor, sign: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = positions.to(torch.float64)[..., None] * inv
    cos, sin = angles.cos().repeat(1, 1, 2)[:, :, None], sign * angles.sin().repeat(1, 1, 2)[:, :, None]
    x1, x2 = x.to(torch.float64).chunk(2, dim=-1)
    return (x.to(torch.float64) * cos + torch.cat((-x2, x1), -1) * sin).to(x.dtype)


def _shape_keys(sizes: str) -> dict:
    """Run the ci profile on a correct (q, k) kernel that records what a kernel compiled
    per shape would specialize on, as Liger's Triton RoPE does: its batch, head counts and
    head size (constexpr), the sequence's class (1, a multiple of 16, other: an integer
    argument), and forward or backward (a constexpr). dtype -> its distinct keys."""
    keys: dict = {}

    def record(q, k, direction):
        seq = q.shape[1]
        kind = "1" if seq == 1 else "16n" if seq % 16 == 0 else "other"
        keys.setdefault(str(q.dtype).split(".")[-1], set()).add(
            (q.shape[0], q.shape[2], k.shape[2], q.shape[3], kind, direction)
        )

    class Rope(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, positions):
            record(q, k, "forward")
            ctx.save_for_backward(positions)
            return _turn(q, positions, 1.0), _turn(k, positions, 1.0)

        @staticmethod
        def backward(ctx, dq, dk):
            record(dq, dk, "backward")
            (positions,) = ctx.saved_tensors
            return _turn(dq, positions, -1.0), _turn(dk, positions, -1.0), None

    report = ropecheck.check(Rope.apply, call="qk", layout="half", dtypes=["float32"], sizes=sizes, backward=True)
    assert report.passed, report.summary()
    return keys


def test_a_kernel_compiled_per_shape_compiles_a_few_kernels_per_pool_shape():
    """The bound of issue 44, by design: a pooled ci run calls a kernel that specializes on
    its whole shape (batch, heads, head size) in the pool's shapes only, besides the
    warm-up's, the position-range probe's and the accuracy sweep's inputs: at most its 3 integer
    classes x forward and backward per shape. Free draws give it several times as many: the
    test fails when a change multiplies them. (liger-kernel, which specializes so, counts
    15 in bfloat16 at the ci profile, 113 with free draws: docs/gpu.md.)"""
    pooled = _shape_keys("toy,pool=yes")["float32"]
    shapes = {(s.batch, s.q_heads, s.k_heads, pool_head_dim(s.head, TOY.head_dims)) for s in pool_shapes(TOY.pooled())}
    outside = {key[:4] for key in pooled} - shapes
    # the warm-up's and the probe's one head, the accuracy sweep's three (head size 8, so
    # that their positions reach 2^24), each one call form
    assert outside <= {(1, 1, 1, 8), (1, 3, 1, 8)}, outside
    assert len(pooled) <= 3 * 2 * len(shapes) + 3, sorted(pooled)
    free = _shape_keys("toy,pool=no")["float32"]
    assert len(free) > 4 * len(pooled)


def test_a_pooled_run_still_sees_a_row_that_depends_on_the_others():
    """batch-independence in a pooled run calls each row repeated over the batch's shape:
    a kernel that gives every row row 0's positions still fails it."""
    report = ropecheck.check(
        f"{HERE / 'mutants.py'}:first_row_positions",
        layout="half",
        dtypes=["float32"],
        sizes="toy,pool=yes",
        properties=["batch-independence"],
    )
    assert report.verdict == "failed", report.summary()
    right = ropecheck.check(
        f"{CALL_FORMS}:qk_correct",
        call="qk",
        layout="half",
        dtypes=["float32"],
        sizes="toy,pool=yes",
        properties=["batch-independence"],
    )
    assert right.passed, right.summary()


@pytest.mark.parametrize(
    "kernel, call, layout",
    [
        ("qk_k_unrotated_mqa", "qk", "half"),  # MQA's one k head
        ("qk_k_wrong_head", "qk", "half"),  # GQA's head map
        ("qk_k_row0_positions", "qk", "half"),  # batch rows
        ("x_fast_path_bug", "x", "half"),  # seq 1
        ("packed_prev_offset", "packed", "half"),
    ],
)
def test_a_pooled_run_still_catches_the_shape_bugs(kernel, call, layout):
    target = f"{CALL_FORMS}:{kernel}"
    report = ropecheck.check(
        target, call=call, layout=layout, dtypes=["float32"], sizes="toy,pool=yes", properties=["reference"]
    )
    assert report.verdict == "failed", report.summary()


def test_a_pooled_run_catches_a_head_size_bug_and_passes_the_right_kernel():
    """A head size past 128 that is not a power of two (the exponent taken over the padded
    block: 192 -> 256) is in the production pool; the correct kernel passes a pooled run."""
    wrong = ropecheck.check(
        f"{SIZE_KERNELS}:padded_exponent",
        layout="half",
        dtypes=["float32"],
        profile="production",
        sizes="production,pool=yes,huge=no",
        properties=["reference"],
    )
    assert wrong.verdict == "failed", wrong.summary()
    assert ", 192) float32" in wrong.summary()
    right = ropecheck.check(f"{SIZE_KERNELS}:correct", layout="half", dtypes=["float32"], sizes="toy,pool=yes")
    assert right.passed, right.summary()
