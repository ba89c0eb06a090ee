"""--sizes and the production profile: what the production sizes draw, the float64 reference
compared a chunk at a time (same verdict, same worst element, a dynamic scaling's theta
from the whole call), the input past 2^31 elements (planned, never made here), and two
kernels: one wrong only past head_dim 128, one that ignores the stride of dim 0."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ropecheck.properties.inputs import cases as case_module
from ropecheck.properties import checks, one_d
from ropecheck.properties.core import sizes as size_sets
from ropecheck.properties.assertions import CheckFailure
from ropecheck.properties.inputs.cases import Case, as_float64
from ropecheck.properties.checks import Context
from ropecheck.properties.runner import RunOptions
from ropecheck.properties.core.sizes import HUGE_ELEMENTS, SIZES, TOY, huge_plan, parse
from ropecheck.properties.inputs.fixed_cases import huge_case, production_cases
from ropecheck.properties.inputs.strategies import cases
from ropecheck.reference.scaling import parse as parse_scaling
from ropecheck.targets.target import Convention, Target
from tests.test_cli import FP32, check

KERNELS = str(Path(__file__).with_name("size_kernels.py"))
PRODUCTION = SIZES["production"]


# --- the size sets -------------------------------------------------------------------

def test_size_sets_and_overrides():
    assert parse("toy") == TOY and parse("production") == PRODUCTION
    narrowed = parse("production,head_dims=192/256,max_seq=4096,huge=no")
    assert (narrowed.head_dims, narrowed.max_seq, narrowed.huge) == ((192, 256), 4096, "no")
    assert parse(narrowed.spec()) == narrowed  # the reproduce line's --sizes gives them back
    assert PRODUCTION.spec() == "production"
    for bad, said in (("huge", "unknown size set"), ("production,seq=5", "key=value"),
                      ("production,max_seq=1/2", "one integer"), ("toy,head_dims=0", "positive"),
                      ("toy,huge=maybe", "auto, yes or no")):
        with pytest.raises(ValueError, match=said):
            parse(bad)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.data())
def test_one_model_draws_one_head_size_head_count_and_layout(data):
    """What a compiled model sees (``Sizes.one_model``, the compile and cudagraph modes):
    the batch, the sequence and the positions vary; nothing else does."""
    base = data.draw(st.sampled_from((TOY, PRODUCTION)))
    model = base.one_model()
    assert model.model and model.head_dims == (128,) and model.heads == (max(base.heads),)
    assert parse(model.spec()) == model and "model=yes" in model.spec()
    call = data.draw(st.sampled_from(("x", "qk", "packed")))
    case = data.draw(cases("float32", call=call, sizes=model))
    wide = data.draw(cases("float32", call=call, sizes=model, rotary_dim=32))
    assert case.head_dim == 128 and wide.head_dim == 128  # 4 x 32, the common size
    assert case.memory == "contiguous" and wide.memory == "contiguous"
    if call == "qk":
        assert (case.heads, case.k_heads, case.separate) == ((32, 8, True) if base.ratios else (4, 2, True))
    else:
        assert case.heads == max(base.heads)
    with pytest.raises(ValueError, match="yes or no"):
        parse("toy,model=1")


def test_one_models_fixed_inputs_keep_their_positions_in_the_models_shapes():
    from ropecheck.properties.inputs.fixed_cases import critical_cases, for_model
    from ropecheck.properties.inputs.strategies import max_position_for

    model = TOY.one_model()
    for call in ("x", "qk", "packed"):
        for case in critical_cases("float32", call=call):
            mine = for_model(case, model, None, ("transposed", "contiguous"))
            assert mine.head_dim == 128 and mine.positions_array().max() <= max_position_for(128)
            assert mine.memory == ("contiguous" if call == "packed" else "transposed")
            assert (mine.batch, mine.seq, mine.lengths) == (case.batch, case.seq, case.lengths)


def test_profiles_choose_their_sizes():
    assert RunOptions(profile="ci").sizes == TOY
    assert RunOptions(profile="production").sizes == PRODUCTION
    assert RunOptions(profile="ci", sizes="production").sizes_flag == ["--sizes", "production"]
    assert RunOptions(profile="production").sizes_flag == []


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.data())
def test_production_draws_stay_within_the_element_budget(data):
    call = data.draw(st.sampled_from(("x", "qk", "packed")))
    case = data.draw(cases("bfloat16", call=call, sizes=PRODUCTION))
    assert int(np.prod(case.shape)) <= PRODUCTION.max_elements
    # each sequence at most max_seq (a packed batch holds up to four: "packed sequences are
    # as long"); the whole input within the element budget (above)
    longest = max(case.lengths) if call == "packed" else case.seq
    assert case.head_dim in PRODUCTION.head_dims and longest <= PRODUCTION.max_seq
    if call == "qk" and case.k_heads:
        assert case.heads // case.k_heads in PRODUCTION.ratios and case.heads % case.k_heads == 0


def test_production_sizes_reach_what_the_toy_ones_never_draw():
    seen = {"head_dims": set(), "ratio": set(), "seq": 0, "tokens_x_heads": 0}

    @settings(max_examples=300, derandomize=True, deadline=None)
    @given(cases("float32", call="qk", sizes=PRODUCTION))
    def draw(case):
        seen["head_dims"].add(case.head_dim)
        seen["ratio"].add(case.heads // max(case.k_heads, 1))
        seen["seq"] = max(seen["seq"], case.seq)
        seen["tokens_x_heads"] = max(seen["tokens_x_heads"], case.batch * case.seq * case.heads)

    draw()
    assert {192, 256, 512} <= seen["head_dims"] and seen["ratio"] >= {1, 4, 8, 32}
    assert seen["seq"] >= 4096 and seen["tokens_x_heads"] > 2**14
    fixed = production_cases("float32", sizes=PRODUCTION)
    assert max(c.seq for c in fixed) == 8192 and {192, 512} <= {c.head_dim for c in fixed}
    assert production_cases("float32", sizes=TOY) == []


def test_toy_sizes_stay_small():
    @settings(max_examples=100, derandomize=True, deadline=None)
    @given(cases("float32", sizes=TOY))
    def draw(case):
        assert case.seq <= 24 and case.heads <= 3 and case.head_dim in (8, 80, 128)

    draw()


# --- the reference a chunk at a time -------------------------------------------------

def _context(convention: Convention, dtype: str = "float32") -> Context:
    target = Target("reference", lambda x, p: x, convention=convention, dtypes=(dtype,))
    return Context(target, dtype)


def _rotated(ctx: Context, case: Case, wrong_at: int | None = None) -> torch.Tensor:
    """The exact rotation of the case's input in its dtype; ``wrong_at``: one token off."""
    x = case.tensor()
    y = ctx.convention.apply(as_float64(x), case.positions_array())
    if wrong_at is not None:
        y[0, wrong_at, 0, 1] += 0.5
    return torch.from_numpy(y).to(x.dtype)


@pytest.mark.parametrize("scaling", ["default", "dynamic:factor=4,max_position_embeddings=64"])
def test_chunked_reference_gives_the_unchunked_verdict(monkeypatch, scaling):
    """A dynamic scaling takes theta from the call's largest position: every chunk must
    use the whole call's, or the chunks before the last would be judged at another theta."""
    ctx = _context(Convention("half", scaling=parse_scaling(scaling)))
    case = Case("float32", 2, 300, 3, 64, tuple(tuple(range(o, o + 300)) for o in (0, 90)))
    p, x = case.positions_array(), case.tensor()
    y = _rotated(ctx, case)
    whole = one_d.against_reference(ctx, y, x, p, what="whole")
    monkeypatch.setattr(one_d, "REFERENCE_CHUNK", 2 * 3 * 64 * 7)  # 7 tokens a chunk
    assert one_d.against_reference(ctx, y, x, p, what="chunked") == pytest.approx(whole, rel=1e-12)
    assert whole <= 1.0


def test_a_chunked_failure_names_its_place_in_the_whole(monkeypatch):
    monkeypatch.setattr(one_d, "REFERENCE_CHUNK", 1 * 2 * 16 * 10)  # 10 tokens a chunk
    ctx = _context(Convention("interleaved"))
    case = Case("float32", 1, 95, 2, 16, (tuple(range(1000, 1095)),))
    y = _rotated(ctx, case, wrong_at=87)
    with pytest.raises(CheckFailure) as failure:
        one_d.against_reference(ctx, y, case.tensor(), case.positions_array(), what="f against R")
    assert failure.value.where == {"batch": 0, "seq": 87, "head": 0, "feature": 1}
    assert "position=1087" in str(failure.value) and "1 / 3040" in str(failure.value)


def test_a_large_input_is_made_a_chunk_at_a_time(monkeypatch):
    monkeypatch.setattr(case_module, "VALUES_CHUNK", 3 * 16 * 5)  # 15 head vectors a chunk
    case = Case("bfloat16", 2, 20, 3, 16, tuple(tuple(range(20)) for _ in range(2)), scale=2.0, seed=9)
    values = case.values()
    assert torch.equal(case.tensor(), torch.from_numpy(values).to(torch.bfloat16))
    assert values.std() == pytest.approx(2.0, rel=0.1)
    assert not np.allclose(values, case.values(salt=1))


def test_a_large_input_s_chunks_are_drawn_on_every_core_to_the_same_values(monkeypatch):
    """Each chunk has its own seeded stream: drawn by threads (the input past 2^31 elements
    on a GPU machine's 16 cores) or one after another, the same values, in order."""
    monkeypatch.setattr(case_module, "VALUES_CHUNK", 4 * 16)  # 4 head vectors a chunk: 24 chunks
    case = Case("float32", 2, 12, 4, 16, tuple(tuple(range(12)) for _ in range(2)), seed=5)
    threaded = case.values()
    monkeypatch.setattr(case_module.os, "cpu_count", lambda: 1)
    assert np.array_equal(case.values(), threaded)
    first = np.random.default_rng([5, 0, 0]).standard_normal((4, 16))
    assert np.array_equal(threaded.reshape(-1, 16)[:4], first)


# --- past 2^31 elements ---------------------------------------------------------------

def test_the_huge_input_is_past_int32_indexing_and_planned_not_made_here(monkeypatch):
    for call in ("x", "qk", "packed"):
        case = huge_case("bfloat16", call=call)
        assert int(np.prod(case.shape)) >= HUGE_ELEMENTS > 2**31
        assert case.positions_array().max() < 2**20  # within a table of 2^27 floats at head_dim 128
    tried, why = huge_plan(PRODUCTION, "cpu", "bfloat16")
    assert not tried and "not tried on cpu" in why and "huge=yes" in why
    assert huge_plan(TOY, "cpu", "bfloat16") == (False, "")
    anywhere = replace(PRODUCTION, huge="yes")
    monkeypatch.setattr(size_sets, "_host_available", lambda: 2**30)
    tried, why = huge_plan(anywhere, "cpu", "bfloat16")
    assert not tried and "the host has 1 GiB free of the 33 GiB it needs" in why
    monkeypatch.setattr(size_sets, "_host_available", lambda: 2**40)
    assert huge_plan(anywhere, "cpu", "float32")[0]


# --- kernels wrong only at some sizes, or on some strides ----------------------------

def run(tmp_path, kernel: str, *args: str):
    record = tmp_path / f"{kernel}.json"
    result = check(f"{KERNELS}:{kernel}", "--layout", "half", *FP32, *args, "--json", str(record))
    return result, json.loads(record.read_text())


def test_a_kernel_wrong_only_past_head_dim_128_fails_production_only(tmp_path):
    result, record = run(tmp_path, "padded_exponent", "--profile", "ci")
    assert result.exit_code == 0, result.output  # 8, 80, 128 and the fixed 256 are right
    result, record = run(tmp_path, "padded_exponent", "--profile", "production", "--property", "reference")
    assert result.exit_code == 1, result.output
    failed = record["results"][0]
    assert failed["status"] == "failed" and record["sizes"] == "production"
    assert ", 192) float32" in failed["counterexample"]
    assert failed["reproduce"].split("  (in Python")[0].endswith("--profile production --property reference")
    assert "seq up to 8192" in result.output and "past 2^31 elements" in result.output


def test_sizes_narrow_a_run_and_its_reproduce_line(tmp_path):
    result, record = run(tmp_path, "padded_exponent", "--profile", "ci", "--sizes",
                         "production,head_dims=192,max_seq=64", "--property", "reference")
    assert result.exit_code == 1, result.output
    assert record["sizes"] == "production,head_dims=192,max_seq=64"
    assert "--sizes production,head_dims=192,max_seq=64" in record["results"][0]["reproduce"]
    result, _ = run(tmp_path, "correct", "--profile", "ci", "--sizes", "production,head_dims=192,max_seq=64",
                    "--property", "reference")
    assert result.exit_code == 0, result.output
    result = check(f"{KERNELS}:correct", "--layout", "half", "--sizes", "large")
    assert result.exit_code == 2 and "unknown size set 'large'" in result.output


def test_a_kernel_ignoring_the_batch_stride_fails_on_views_and_is_right_on_contiguous_input(tmp_path):
    from tests.size_kernels import batch_stride, correct

    x, p = torch.randn(3, 7, 2, 16), torch.arange(7).repeat(3, 1)
    assert torch.equal(batch_stride(x, p), correct(x, p))
    result, record = run(tmp_path, "batch_stride", "--profile", "ci", "--property", "reference",
                         "--property", "contract")
    assert result.exit_code == 1, result.output
    for failed in record["results"]:
        assert failed["status"] == "failed"
        batch, layout = re.match(r"x: shape \((\d+), .*\) float32, ([\w-]+),", failed["counterexample"]).groups()
        assert layout in ("transposed", "sbhd") and int(batch) >= 2, failed["counterexample"]


def test_every_family_draws_at_the_sizes_and_score_checks_stay_short():
    """N-D and xPos targets keep their own head sizes and take the production sequences,
    heads and q/k ratios; checks that compare (seq x seq) scores stop at SCORES_MAX_SEQ."""
    from ropecheck.properties.nd.checks import ND_PROPERTIES, nd_cases
    from ropecheck.properties.inputs.strategies import SCORES_MAX_SEQ
    from ropecheck.properties.xpos_checks import XPOS_MAX_POSITION, xpos_cases

    nd = Target("nd", lambda x, p: x, family="nd", n_axes=3, head_dims=(16,), call="qk")
    xpos = Target("xpos", lambda q, k, p: (q, k), family="xpos", call="qk", head_dims=(8, 64),
                  max_position=XPOS_MAX_POSITION)
    assert ND_PROPERTIES["relativity-axis"].case_options["max_seq"] == SCORES_MAX_SEQ
    assert checks.PROPERTIES["relativity"].case_options["max_seq"] == SCORES_MAX_SEQ
    longest = {"nd": 0, "nd-scores": 0, "xpos": 0}

    @settings(max_examples=120, derandomize=True, deadline=None)
    @given(st.data())
    def draw(data):
        for name, strategy in (("nd", nd_cases(nd, "float32", PRODUCTION)),
                               ("nd-scores", nd_cases(nd, "float32", PRODUCTION, SCORES_MAX_SEQ)),
                               ("xpos", xpos_cases(xpos, "float32", sizes=PRODUCTION))):
            case = data.draw(strategy)
            assert int(np.prod(case.shape)) <= PRODUCTION.max_elements
            assert case.heads // max(case.k_heads, 1) in PRODUCTION.ratios
            longest[name] = max(longest[name], case.seq)

    draw()
    from ropecheck.properties.core.sizes import sizes_lines
    assert sizes_lines(PRODUCTION, nd, ["float32"]) == [
        "sizes production: head sizes 16 (the target's), seq up to 8192, heads 1/2/8/32, q/k ratios 1/4/8/32"]
    assert sizes_lines(TOY, nd, ["float32"]) == []
    assert longest["nd"] > 1000 and SCORES_MAX_SEQ >= longest["nd-scores"] > 24
    assert SCORES_MAX_SEQ >= longest["xpos"] > 24


def test_sizes_from_python():
    import ropecheck
    from tests.size_kernels import padded_exponent

    report = ropecheck.check(padded_exponent, layout="half", dtypes="float32", properties="reference",
                             sizes="production,head_dims=192,max_seq=64")
    assert report.verdict == "failed"
    assert "sizes='production,head_dims=192,max_seq=64'" in report.failures[0].reproduce
    with pytest.raises(ValueError, match="unknown size set"):
        ropecheck.check(padded_exponent, layout="half", sizes="big")
