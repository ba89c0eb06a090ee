"""The call forms (issue 11): ropecheck on kernels written in production signatures,
``rope(q, k, positions)`` (--call qk), ``rope(x, cu_seqlens, positions)`` (--call packed)
and ``rope(x, positions)`` (--call x), from tests/call_form_kernels.py.

Two halves:
- the kernels alone, against the float64 reference: the correct ones agree, each broken
  one disagrees exactly on the inputs that expose it and agrees on the others (cheap;
  they guard the kernels, so that a verdict below is about ropecheck, not the kernel);
- ropecheck on them through the CLI (in-process, as tests/test_cli.py runs it): every
  correct kernel passes, every broken one fails with a finding that names its form.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from ropecheck import reference
from ropecheck.properties.checks import PROPERTIES
from ropecheck.properties.runner import RunOptions
from ropecheck.targets.target import Convention, Target
from tests import call_form_kernels as kernels
from tests.test_cli import FP32, check

KERNELS = Path(kernels.__file__).resolve()

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


# --- ropecheck on the kernels -------------------------------------------------------------------


def run_ropecheck(tmp_path: Path, name: str, form: str, *args: str):
    """``ropecheck check tests/call_form_kernels.py:NAME --call FORM --layout half
    --profile ci --dtype float32 ARGS``; the result and its JSON report."""
    out = tmp_path / f"{name}.json"
    result = check(f"{KERNELS}:{name}", "--call", form, "--layout", "half", "--profile", "ci",
                   *FP32, "--json", str(out), *args)
    assert out.exists(), result.output
    return result, json.loads(out.read_text())


def failures(report: dict) -> list[str]:
    """What each failed result says: its message, counterexample and diagnosis."""
    return [" | ".join(filter(None, (r["property"], r.get("message"), r.get("counterexample"),
                                     r.get("diagnosis"))))
            for r in report["results"] if r["status"] == "failed"]


def qk_shapes(text: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The (q shape, k shape) pairs a qk case description names, e.g.
    ``call qk: q (2, 3, 4, 8), k (2, 3, 1, 8)``."""
    shape = r"\((\d+), (\d+), (\d+), (\d+)\)"
    return [(tuple(map(int, m[:4])), tuple(map(int, m[4:])))
            for m in re.findall(rf"\bq:?\s*(?:shape\s*)?{shape}.*?\bk:?\s*(?:shape\s*)?{shape}", text)]


def cu_seqlens_lists(text: str) -> list[list[int]]:
    """The cu_seqlens a packed case description names, e.g. ``cu_seqlens [0, 3, 3, 5]``."""
    return [list(map(int, re.findall(r"-?\d+", m)))
            for m in re.findall(r"cu_seqlens\W{0,4}[\[(]([\d,\s]*)[\])]", text)]


def has_empty_before_nonempty(cu: list[int]) -> bool:
    lengths = np.diff(cu)
    return any(a == 0 and b > 0 for a, b in zip(lengths, lengths[1:]))


K_NAMED = r"\bk\b|k_heads|k head"
# name, form, properties to run (none: the default run), patterns one finding must all
# match (the form it exposes), and a check of the shapes a qk finding names
BROKEN = {
    "qk_k_unrotated_mqa": ("qk", ("reference",), (r"\bqk\b", K_NAMED),
                           lambda q, k: k[2] == 1),
    "qk_k_wrong_head": ("qk", ("reference",), (r"\bqk\b", K_NAMED),
                        lambda q, k: 1 < k[2] < q[2]),
    "qk_k_row0_positions": ("qk", ("reference",), (r"\bqk\b", K_NAMED),
                            lambda q, k: k[0] > 1),
    "qk_bad_k_backward": ("qk", ("backward", "inverse"), (r"\bqk\b", K_NAMED), None),
    "packed_restart": ("packed", ("reference",), (r"cu_seqlens",), None),
    "packed_prev_offset": ("packed", ("reference",), (r"cu_seqlens",), None),
    "packed_empty_skip": ("packed", ("reference",), (r"cu_seqlens",), None),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_kernel_fails_naming_its_form(tmp_path, name):
    form, properties, patterns, shapes_ok = BROKEN[name]
    args = [a for p in properties for a in ("--property", p)]
    result, report = run_ropecheck(tmp_path, name, form, *args)
    assert result.exit_code == 1, result.output
    found = failures(report)
    assert found, result.output
    naming = [text for text in found if all(re.search(p, text) for p in patterns)]
    assert naming, f"no finding names the {form} form {patterns}:\n" + "\n".join(found)
    if shapes_ok is not None:
        shapes = [pair for text in naming for pair in qk_shapes(text)]
        assert shapes, "no q/k shapes in:\n" + "\n".join(naming)
        assert any(shapes_ok(q, k) for q, k in shapes), shapes
    if name == "packed_empty_skip":  # only an empty sequence before a non-empty one exposes it
        lists = [cu for text in naming for cu in cu_seqlens_lists(text)]
        assert lists, "no cu_seqlens in:\n" + "\n".join(naming)
        assert any(has_empty_before_nonempty(cu) for cu in lists), lists


def test_the_fixed_gqa_input_catches_a_head_mapping_bug_whatever_the_draws(tmp_path):
    """qk_k_wrong_head is wrong only when 1 < k_heads < q_heads, which one drawn example
    seldom is; the qk form's fixed grouped-query input (strategies.gqa_case: 4 q heads, 2 k
    heads) is, on every run."""
    result, report = run_ropecheck(tmp_path, "qk_k_wrong_head", "qk", "--property", "reference",
                                   "--max-examples", "1")
    assert result.exit_code == 1, result.output
    shapes = [pair for text in failures(report) for pair in qk_shapes(text)]
    assert (tuple(shapes[0][0])[2], tuple(shapes[0][1])[2]) == (4, 2), shapes
    result, _ = run_ropecheck(tmp_path, "qk_correct", "qk", "--property", "reference", "--max-examples", "1")
    assert result.exit_code == 0, result.output


def test_x_fast_path_bug_fails_the_default_run(tmp_path):
    """THE DEFAULT RUN (no --property, no --max-examples): only the large fixed inputs the
    engine adds (tokens x heads 2^14 and 2^15 + 1, head_dim 256) reach the fast path, and
    the default run must include them."""
    result, report = run_ropecheck(tmp_path, "x_fast_path_bug", "x")
    assert result.exit_code == 1, result.output
    found = failures(report)
    assert found, result.output
    shapes = [tuple(map(int, m)) for text in found
              for m in re.findall(r"\((\d+), (\d+), (\d+), (\d+)\)", text)]
    assert any(b * s * h >= kernels.FAST_PATH_MIN for b, s, h, _ in shapes), "\n".join(found)


@pytest.mark.parametrize("name, form", [
    ("qk_correct", "qk"),
    ("packed_correct", "packed"),
    # its offsets are right only if every call ropecheck makes keeps positions offset + arange
    ("packed_offsets_correct", "packed"),
    ("sbhd_correct", "x"),
])
def test_correct_kernel_passes_the_default_run(tmp_path, name, form):
    result, report = run_ropecheck(tmp_path, name, form)
    assert result.exit_code == 0, result.output
    statuses = {r["property"]: r["status"] for r in report["results"]}
    assert set(statuses.values()) <= {"passed", "skipped"}, statuses
    # a form may leave out a property its calls cannot express, never these
    assert all(statuses.get(p) == "passed" for p in ("contract", "reference", "backward")), statuses


def test_optional_k_kernel_passes_with_k(tmp_path):
    """On the CLI k is always given (k_optional is declared only by a Target or Adapter)."""
    result, _ = run_ropecheck(tmp_path, "qk_optional_k", "qk", "--property", "reference",
                              "--property", "backward")
    assert result.exit_code == 0, result.output


def run_declared(fn, **declared):
    """Every property, in this process, on a qk Target declared with ``declared``."""
    from ropecheck.session.session import Session

    target = Target(name=fn.__name__, fn=fn, convention=Convention("half"), **declared)
    session = Session(target, ["float32"], list(PROPERTIES.values()), RunOptions(profile="ci"))
    session.run()
    return session


def test_optional_k_kernel_passes_when_k_may_be_none():
    session = run_declared(kernels.qk_optional_k, call="qk", k_optional=True)
    assert session.verdict == "passed", [(r.property, r.message) for r in session.results
                                         if r.status != "passed"]


def test_declared_optional_k_is_called_without_k():
    """A kernel that needs k, declared k_optional: the k=None calls must find it out."""
    session = run_declared(kernels.qk_correct, call="qk", k_optional=True)
    assert session.verdict == "failed"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_finite_output_check_sees_every_inf_and_nan_and_no_overflowing_sum(dtype):
    """validate looks at the sum first: finite, no inf or nan among the terms; an inf or a
    nan anywhere, or finite values whose sum overflows, take the element-wise look."""
    from ropecheck.calling.caller import validate
    from ropecheck.properties.core.contract import CallError

    big = torch.full((4, 64, 2, 8), torch.finfo(dtype).max / 2, dtype=dtype)  # its sum is inf
    validate(big, big)
    for bad, at in ((float("inf"), (1, 2, 0, 3)), (float("-inf"), (3, 63, 1, 7)), (float("nan"), (0, 0, 0, 0))):
        y = torch.randn(4, 64, 2, 8, dtype=dtype)
        y[at] = bad
        with pytest.raises(CallError, match=rf"non-finite output .* at index \({', '.join(map(str, at))}\)"):
            validate(y, y.clone().nan_to_num_())
