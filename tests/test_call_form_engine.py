"""The calling layer of the call forms (ropecheck/call_forms.py) and what the engine draws
for each form: q/k splits, fused or separate storage, packed sequences that keep counting up,
targets that take per-row offsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from ropecheck.properties.checks import PROPERTIES
from ropecheck.properties.runner import RunOptions, call_time_limit, run_property
from ropecheck.properties.inputs.fixed_cases import counts_up, critical_cases, in_form, large_cases, within
from ropecheck.properties.inputs.strategies import cases
from ropecheck.calling.forms import segment_lengths
from ropecheck.properties.core.contract import CallError
from ropecheck.targets.target import Convention, Target
from tests import call_form_kernels as kernels
from tests.test_cli import check

QUICK = RunOptions(profile="ci", max_examples=10)


def test_segments_of_a_packed_row_end_where_positions_stop_counting_up():
    assert segment_lengths(np.array([5, 6, 7, 0, 1, 9])) == (3, 2, 1)
    assert segment_lengths(np.array([], dtype=np.int64)) == ()


@pytest.mark.parametrize("call", ["x", "qk", "packed"])
def test_fixed_inputs_in_every_form_keep_their_values(call):
    for case in critical_cases("float32", None, call) + large_cases("float32", None, call):
        assert case.call == call
        assert case.tensor().shape == case.shape
        if call == "packed":
            assert case.batch == 1 and sum(case.lengths) == case.seq and 0 in case.lengths
            assert sum(segment_lengths(case.positions_array()[0])) == case.seq


def test_large_inputs_reach_the_sizes_the_issue_names():
    x = large_cases("float32")
    token_heads = [c.batch * c.seq * c.heads for c in x]
    assert 2**14 in token_heads and 2**15 + 1 in token_heads
    assert any(c.head_dim == 256 for c in x)
    qk = large_cases("float32", call="qk")
    assert any(c.heads == 32 and c.k_heads == 1 for c in qk)


def test_packed_inputs_moved_into_a_smaller_range_keep_counting_up():
    case = in_form(critical_cases("float32")[2], "packed")
    moved = within(case, 65535)
    assert moved.positions_array().max() <= 65535
    row, start = moved.positions_array()[0], 0
    for n in case.lengths:
        assert (np.diff(row[start:start + n]) == 1).all()
        start += n


@settings(max_examples=40, deadline=None, database=None)
@given(cases("float32", call="qk"))
def test_qk_draws_divide_q_heads(case):
    assert case.k_heads >= 1 and case.heads % case.k_heads == 0


@settings(max_examples=40, deadline=None, database=None)
@given(cases("float32", row_offsets=True))
def test_row_offset_draws_count_up_in_every_row(case):
    assert counts_up(case)


def test_a_qk_call_splits_heads_as_the_case_says():
    seen = {}

    def rope(q, k, positions):
        seen["q"], seen["k"] = q.shape, k.shape
        seen["shared"] = q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
        return q.clone(), k.clone()

    case = in_form(critical_cases("float32")[3], "qk")  # seed 4: one key head, separate storage
    caller = Target("t", rope, call="qk").caller()
    y = caller(case.tensor(), case.positions_tensor(), case=case)
    assert seen["q"][2] == case.heads and seen["k"][2] == case.k_heads == 1
    assert not seen["shared"] and y.shape == case.shape


def test_writing_into_a_separate_k_is_an_input_modified_in_place():
    def rope(q, k, positions):
        k.mul_(2.0)
        return q.clone(), k.clone()

    case = in_form(critical_cases("float32")[3], "qk")
    with pytest.raises(CallError, match="modified its input"):
        Target("t", rope, call="qk").caller()(case.tensor(), case.positions_tensor(), case=case)


def test_a_call_on_some_packed_tokens_gets_their_own_sequences():
    got = {}

    def rope(x, cu_seqlens, positions):
        got["cu"] = cu_seqlens.tolist()
        return x.clone()

    caller = Target("t", rope, call="packed").caller()
    caller(torch.zeros(1, 5, 1, 8), torch.tensor([[3, 4, 5, 0, 1]]))
    assert got["cu"] == [0, 3, 5]


def test_qk_outputs_that_do_not_fit_are_contract_findings():
    case = in_form(critical_cases("float32")[0], "qk")
    caller = Target("t", lambda q, k, p: (q.clone(), None), call="qk").caller()
    with pytest.raises(CallError, match="no k_out"):
        caller(case.tensor(), case.positions_tensor(), case=case)


def test_a_qk_vjp_with_one_output_cut_from_autograd_names_it():
    case = in_form(critical_cases("float32")[3], "qk")  # one key head
    caller = Target("t", lambda q, k, p: (q * 2, k.detach() * 2), call="qk").caller()
    caller.case = case
    with pytest.raises(CallError, match="k_out does not require grad while q_out does"):
        caller.vjp(case.tensor(), case.positions_tensor(), case.tensor(1))


def _offsets_only(x, positions):
    """A kernel taking per-row offsets: refuses positions that do not count up."""
    if not bool((positions[:, 1:] - positions[:, :-1] == 1).all()):
        raise ValueError("positions must be offset + arange(seq) per row")
    return kernels.sbhd_correct(x, positions)


def test_a_target_declaring_row_offsets_is_judged_on_the_positions_it_takes():
    declared = Target("offsets", _offsets_only, Convention("half"), row_offsets=True)
    for name in ("reference", "relativity", "statelessness"):
        assert run_property(PROPERTIES[name], declared, "float32", QUICK).status == "passed", name
    assert run_property(PROPERTIES["identity"], declared, "float32", QUICK).status == "skipped"
    undeclared = declared.with_(row_offsets=False)
    assert run_property(PROPERTIES["reference"], undeclared, "float32", QUICK).status == "failed"


def test_large_inputs_get_a_longer_call_time_limit():
    small, large = critical_cases("float32")[0], large_cases("float32")[1]
    assert call_time_limit(20.0, small) == 20.0
    assert call_time_limit(20.0, large) > 20.0
    assert call_time_limit(None, large) is None


def test_a_call_form_a_family_does_not_have_is_a_usage_error():
    result = check("rotate-half", "--family", "xpos", "--call", "packed")
    assert result.exit_code == 2 and "--call packed is not available with --family xpos" in result.output
    result = check("rotate-half", "--family", "xpos", "--call", "x")
    assert result.exit_code == 2 and "--call x is not available with --family xpos" in result.output


def _nd_qk(forget_mqa_k: bool):
    """An M-RoPE kernel in its (q, k) form from the float64 reference (no autograd); the
    broken one leaves k unrotated when it has one head."""
    from ropecheck.reference.nd import mrope
    conv = mrope([2, 1, 1], layout="half")

    def rotate(t, positions):
        return torch.from_numpy(conv.apply(t.double().numpy(), positions.numpy())).to(t.dtype)

    def rope(q, k, positions):
        k_out = k.clone() if forget_mqa_k and k.shape[2] == 1 else rotate(k, positions)
        return rotate(q, positions), k_out
    return conv, rope


@pytest.mark.parametrize("broken", [False, True])
def test_nd_family_in_the_qk_form(broken):
    from ropecheck.properties.nd.checks import ND_PROPERTIES
    conv, rope = _nd_qk(broken)
    target = Target("mrope-qk", rope, conv, family="mrope", n_axes=3, head_dims=(conv.head_dim,), backward=False,
                    call="qk")
    result = run_property(ND_PROPERTIES["reference"], target, "float32", QUICK)
    assert result.status == ("failed" if broken else "passed"), result.message
    if broken:
        assert "call qk" in result.counterexample and "k's head" in result.message


def _nd_packed(bug: str = ""):
    """An M-RoPE kernel in the packed form, rope(x (total, heads, head_dim), cu_seqlens,
    positions (total, 3)), from the float64 reference, sequence by sequence as a varlen
    kernel walks cu_seqlens. Bugs: "empty-skips-next" (an empty sequence makes the loop
    skip the one after it, left unrotated), "counting" (a 1-D habit: each token at its
    sequence's first position + its index, not its own)."""
    from ropecheck.reference.nd import mrope
    conv = mrope([2, 1, 1], layout="half")

    def rope(x, cu_seqlens, positions):
        out = x.clone()
        skip = False
        for a, b in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
            if skip or a == b:
                skip = bug == "empty-skips-next" and a == b
                continue
            p = positions[a:b].numpy()
            if bug == "counting":
                p = p[:1] + np.arange(b - a)[:, None]
            out[a:b] = torch.from_numpy(conv.apply(x[None, a:b].double().numpy(), p[None]))[0].to(x.dtype)
        return out
    return conv, rope


@pytest.mark.parametrize("bug", ["", "empty-skips-next", "counting"])
def test_nd_family_in_the_packed_form(bug):
    from ropecheck.properties.nd.checks import ND_PROPERTIES
    conv, rope = _nd_packed(bug)
    target = Target("mrope-packed", rope, conv, family="mrope", n_axes=3, head_dims=(conv.head_dim,),
                    backward=False, call="packed")
    if not bug:
        for name, prop in ND_PROPERTIES.items():
            result = run_property(prop, target, "float32", QUICK)
            assert result.status in ("passed", "skipped"), (name, result.message)
        return
    result = run_property(ND_PROPERTIES["reference"], target, "float32", RunOptions(profile="ci"))
    assert result.status == "failed" and "call packed" in result.counterexample, result
