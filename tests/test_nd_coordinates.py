"""Image and video RoPE on coordinates (properties/nd/coordinates.py, --positions,
--coord-range, --coord-scale, --coord-offset) and pairs that span the head (--pair-span
head): each convention's right kernel passes and its real bug fails, through the CLI as a
user runs it (kernels: tests/nd_coordinate_kernels.py)."""

import math

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ropecheck.cli import main
from ropecheck.properties.nd.coordinates import Coordinates, grid_sides
from ropecheck.reference.nd import axial

KERNELS = "tests/nd_coordinate_kernels.py"
DINO = ("--family", "axial", "--layout", "half", "--pair-span", "head", "--base", "100", "--positions", "float",
        "--coord-range=-1:1", "--coord-scale", repr(2 * math.pi))
FAST = ("--family", "axial", "--layout", "half", "--positions", "float", "--coord-range=-1:1", "--coord-scale", "10000")
QWEN25VL = ("--family", "axial", "--layout", "half", "--pair-span", "head", "--split", "40,40")
QWEN_IMAGE = ("--family", "axial", "--axes", "3", "--layout", "interleaved", "--split", "16,56,56",
              "--coord-range=-32:32")
FLUX = ("--family", "axial", "--axes", "3", "--layout", "interleaved", "--split", "16,56,56", "--positions", "float",
        "--coord-range", "0:512")
OFFSET = ("--family", "axial", "--layout", "interleaved", "--coord-range", "0:64")


def _check(kernel, *flags, dtype="float32"):
    # --in-process: plain torch kernels, whose tensors a worker would be sent and send back
    # each call; a worker is not what these tests are about
    return CliRunner().invoke(
        main, ["check", f"{KERNELS}:{kernel}", *flags, "--profile", "ci", "--dtype", dtype, "--in-process"]
    )


def _expect(code: int) -> tuple:
    """The flags a case expecting ``code`` adds: a right kernel runs every check (none may
    give a false alarm); a bug only the reference, which fails on every bug here (the
    acceptance corpus' coords-* entries record which other checks fail too)."""
    return ("--property", "reference") if code == 1 else ()


@pytest.mark.parametrize("kernel, flags, dtype, code", [
    ("dinov3", DINO, "float32", 0),
    ("dinov3", DINO, "bfloat16", 0),
    ("dinov3_bf16_angles", DINO, "float32", 1),  # dinov3 #243
    ("fast_axial", FAST, "float32", 0),  # coordinates of size 1, frequencies up to 1e4 rad per unit
    ("fast_axial_bf16_angles", FAST, "float32", 1),
    ("qwen25vl_vision", QWEN25VL, "float32", 0),
    ("qwen25vl_vision", QWEN25VL[:-4] + ("--layout", "half", "--split", "40,40"), "float32", 1),  # pairs per block
    ("qwen_image", QWEN_IMAGE, "float32", 0),  # a centred grid: negative rows and columns
    ("qwen_image_table_wraps", QWEN_IMAGE, "float32", 1),
    ("flux", FLUX, "float32", 0),
    ("flux_ids_in_bf16", FLUX, "float32", 1),  # ids above 256 rounded in bf16
    ("offset_grid", OFFSET + ("--coord-offset", "8"), "float32", 0),
    ("offset_grid", OFFSET, "float32", 1),
])
def test_conventions_on_coordinates(kernel, flags, dtype, code):
    r = _check(kernel, *flags, *_expect(code), dtype=dtype)
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output


def test_an_offset_sets_identity_and_commutation_aside_and_the_reference_judges():
    r = _check("offset_grid", *OFFSET, "--coord-offset", "8")
    for name in ("identity", "commutation"):
        assert any(name in line and "skip" in line for line in r.output.splitlines()), r.output
    assert any("reference" in line and "pass" in line for line in r.output.splitlines()), r.output
    r = _check("offset_grid", "--family", "nd", "--coord-range", "0:64", "--coord-offset", "8")  # spec-free
    assert r.exit_code == 0, r.output


def test_the_reproduce_line_spells_coordinates_exactly():
    r = _check("dinov3_bf16_angles", *DINO, "--coord-offset=-0.5")
    assert r.exit_code == 1
    line = next(line for line in r.output.splitlines() if "reproduce:" in line)
    assert "--coord-range=-1:1" in line and f"--coord-scale {2 * math.pi!r}" in line and "--coord-offset=-0.5" in line


@pytest.mark.parametrize("flags, words", [
    (("--family", "axial", "--layout", "half", "--coord-range", "3:1"), "LO < HI"),
    (("--family", "axial", "--layout", "half", "--coord-range", "0:1.5"), "integer bounds"),
    (("--family", "axial", "--layout", "half", "--coord-scale", "1,2,3"), "one per axis"),
    (("--family", "axial", "--layout", "half", "--coord-range", "nope"), "LO:HI"),
    (("--family", "axial", "--layout", "interleaved", "--pair-span", "head"), "--layout half"),
    (("--family", "axial", "--layout", "half", "--positions", "complex"), "'int', 'float'"),
])
def test_bad_coordinate_flags_are_usage_errors(flags, words):
    r = _check("dinov3", *flags)
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output


def test_pair_span_head_is_rotate_half_of_the_head_dealt_to_the_axes():
    conv = axial(12, 2, layout="half", split=[8, 4], pair_span="head")
    # r = 12, pairs (p, p + 6): axis 0 takes pairs 0..3 with 10000^(-2j/8), axis 1 pairs 4..5 with 10000^(-2j/4)
    assert conv.first == (0, 1, 2, 3, 4, 5) and conv.second == (6, 7, 8, 9, 10, 11)
    assert conv.axis == (0, 0, 0, 0, 1, 1)
    assert np.allclose(conv.theta, [1, 10000 ** -0.25, 10000 ** -0.5, 10000 ** -0.75, 1, 10000 ** -0.5])
    per_block = axial(12, 2, layout="half", split=[8, 4])  # today's map: pairs inside each axis' block
    assert per_block.first == (0, 1, 2, 3, 8, 9) and per_block.second == (4, 5, 6, 7, 10, 11)


def test_scale_offset_and_the_inverse():
    conv = axial(4, 2, layout="interleaved").with_coordinates((2.0,), (0.0, 8.0))
    x = np.arange(4.0).reshape(1, 1, 1, 4) + 1
    p = np.array([[[0.25, -1.5]]], dtype=np.float32)
    assert np.allclose(conv.angles(p)[0, 0], [2 * 0.25, 2 * -1.5 + 8])
    assert np.allclose(conv.apply(conv.apply(x, p), p, inverse=True), x)  # R_P^T R_P = I with the offset
    assert conv.turns_at_zero and not axial(4, 2).with_coordinates((3.0,)).turns_at_zero


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from(["int", "float"]), st.integers(1, 3), st.integers(1, 40))
def test_drawn_coordinates_stay_in_their_ranges(data, kind, n_axes, seq):
    ranges = ((-7, 5), (0, 3), (-100, -90))[:n_axes]
    coords = Coordinates(kind, ranges)
    p = coords.draw(data.draw, 2, seq, n_axes)
    assert p.shape == (2, seq, n_axes) and p.dtype == coords.dtype
    lo, hi = coords.bounds(n_axes)
    assert (p >= lo).all() and (p <= hi).all()


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from(["int", "float"]), st.integers(1, 3), st.integers(1, 40), st.booleans())
def test_shifted_coordinates_stay_in_a_declared_range(data, kind, n_axes, seq, as_position):
    """A declared range is the target's domain: positions drawn with room for shifts (its
    lower half), P + c (and c itself where commutation hands it as positions) stay in it,
    and so do the invertibility check's P +- c along axes."""
    ranges = ((-7, 5), (0, 1023), (65536, 66559))[:n_axes]
    coords = Coordinates(kind, ranges)
    lo, hi = coords.bounds(n_axes)
    p = coords.draw(data.draw, 2, seq, n_axes, room=True)
    as_position = as_position and coords.holds_zero(n_axes)  # commutation is skipped without 0
    c = np.asarray(data.draw(coords.shifts(p, as_position=as_position)))
    moved = coords.given(p + c)
    assert (moved >= lo).all() and (moved <= hi).all(), (p, c)
    if as_position:
        assert (c >= lo).all() and (c <= hi).all()
    axis = data.draw(st.integers(0, n_axes - 1))
    one = data.draw(coords.shift(p, axis, nonzero=True))
    assert one != 0 and lo[axis] <= (p[..., axis] + one).min() and (p[..., axis] + one).max() <= hi[axis]
    steps = coords.turning_shifts([0.3, 2.0, 50.0], n_axes)
    base = coords.invertibility_base(p, max(steps))
    for c in steps:
        for sign in (1, -1):
            q = base[..., 0] + sign * c
            assert (q >= lo[0]).all() and (q <= hi[0]).all(), (c, steps)


def test_a_grid_holds_the_sequence():
    for seq in range(1, 70):
        for n_axes in (1, 2, 3):
            sides = grid_sides(seq, n_axes)
            assert math.prod(sides) >= seq and len(sides) == n_axes


# --- --family pairs --pair-table ------------------------------------------------------------


def _ltx_table_file(tmp_path, heads=4, head_dim=16):
    import json

    from tests.nd_coordinate_kernels import ltx_table

    path = tmp_path / "ltx.json"
    path.write_text(json.dumps(ltx_table(heads, head_dim)))
    return str(path)


@pytest.mark.parametrize("kernel, code", [("ltx", 0), ("ltx_per_head", 1)])
def test_a_rotation_across_heads_as_a_pair_table(tmp_path, kernel, code):
    r = _check(kernel, "--family", "pairs", "--pair-table", _ltx_table_file(tmp_path), "--positions", "float",
               "--coord-range", "0:1", *_expect(code))
    assert r.exit_code == code, r.output


def test_every_nd_family_is_a_pair_table():
    from ropecheck.reference.nd import from_table, mrope, to_table

    x = np.random.default_rng(0).standard_normal((2, 3, 2, 16))
    p = np.random.default_rng(1).integers(-50, 50, (2, 3, 3))
    for conv in (axial(16, 3, layout="half", split=[4, 4, 8], pair_span="head").with_coordinates((0.5,), (1.0,)),
                 mrope([2, 3, 3], interleaved=True)):
        again = from_table(to_table(conv))
        assert np.allclose(again.apply(x, p), conv.apply(x, p), rtol=0, atol=1e-12)


@pytest.mark.parametrize("table, words", [
    ("not json", "not JSON"),
    ('{"head_dim": 8, "pairs": [[0, 9, 0, 1.0]]}', "distinct features inside head_dim"),
    ('{"head_dim": 8, "pairs": [[0, 1, 0]]}', "[first, second, axis, theta]"),
    ('{"head_dim": 8, "n_axes": 1, "pairs": [[0, 1, 1, 1.0]]}', "axes must lie in 0 .. 0"),
    ('{"pairs": [[0, 1, 0, 1.0]]}', "missing 'head_dim'"),
    ('{"head_dim": 8, "pairs": [], "colour": 1}', "unknown keys"),
])
def test_a_bad_pair_table_is_a_usage_error(tmp_path, table, words):
    path = tmp_path / "t.json"
    path.write_text(table)
    r = _check("ltx", "--family", "pairs", "--pair-table", str(path))
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output
    r = _check("ltx", "--family", "pairs")
    assert r.exit_code == 2 and "--pair-table" in r.output, r.output


# --- --api diffusers: the applier fed tables made from the declared rotation -------------------
@pytest.mark.parametrize("kernel, flags, code", [
    ("apply_rotary_emb", DINO, 0),  # pairs half a head apart: use_real_unbind_dim=-2
    ("apply_rotary_emb", FLUX, 0),  # adjacent pairs: -1
    ("apply_rotary_emb_unbind_ignored", DINO, 1),  # a half-layout table applied with the interleaved rotation
    ("apply_rotary_emb_sequence_dim_ignored", DINO, 1),  # (B, S, H, D) read as (B, H, S, D)
])
def test_diffusers_applier(kernel, flags, code):
    r = _check(kernel, "--api", "diffusers", *flags, *_expect(code))
    assert r.exit_code == code, r.output
    if code:
        assert "--api diffusers" in next(line for line in r.output.splitlines() if "reproduce:" in line)


@pytest.mark.parametrize("flags, words", [
    (("--family", "nd"), "does not apply to --family nd"),
    (("--family", "rope", "--layout", "half"), "applies an N-D rotation"),
    (DINO + ("--call", "x"), "is called as --call diffusers"),
    (("--family", "axial", "--layout", "half"), "neither adjacent features nor half a head apart"),
])
def test_diffusers_applier_needs_a_declared_nd_rotation(flags, words):
    r = _check("apply_rotary_emb", "--api", "diffusers", *flags)
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output


def test_applier_tables_hold_each_pair_at_both_features():
    import torch

    from ropecheck.calling.forms import applier_tables, unbind_dim

    conv = axial(8, 2, layout="half", split=[4, 2], pair_span="head")  # pairs (p, p + 3): features 6, 7 pass through
    p = np.array([[3, -2], [0, 5]])
    cos, sin = applier_tables(conv, p, 8)
    phi = conv.angles(p)
    assert torch.equal(cos[:, list(conv.first)], cos[:, list(conv.second)])
    assert np.allclose(sin[:, list(conv.first)].numpy(), np.sin(phi), atol=1e-7)
    assert unbind_dim(axial(8, 2, layout="interleaved")) == -1
    assert unbind_dim(axial(8, 2, layout="half", pair_span="head")) == -2
    with pytest.raises(ValueError, match="neither adjacent"):
        unbind_dim(axial(8, 2, layout="half"))  # pairs inside each block: (0, 2), (4, 6)


# --- the real bugs of image and video RoPE at their models' configurations (issue 43) --------
WAN = ("--family", "axial", "--axes", "3", "--layout", "interleaved", "--split", "24,20,20", "--max-position", "1023")
FLUX2 = ("--family", "axial", "--axes", "4", "--layout", "interleaved", "--split", "32,32,32,32", "--base", "2000",
         "--coord-range", "0:512")
TIMM_DINOV3 = DINO + ("--split", "32,32")  # ViT-B: head 64
IDEOGRAM4 = ("--family", "mrope", "--sections", "88,20,20", "--mrope-interleaved", "--layout", "half", "--base",
             "5000000", "--coord-range", "65536:66559")


WAN_DOMAIN = WAN[:-2] + ("--coord-range", "0:1023")  # the table's rows as the declared domain


@pytest.mark.parametrize("kernel, flags, code", [
    ("wan", WAN, 0),  # head 64: the table cut at 24, 20, 20
    ("wan_split_mismatch", WAN, 1),  # diffusers #12538: cut at 22, 21, 21
    ("wan", WAN_DOMAIN, 0),  # a table-backed kernel: every position handed, shifted too, is a row of it
    ("flux2", FLUX2, 0),
    ("flux2_theta_dropped", FLUX2, 1),  # diffusers #10111: 10000 for FLUX.2's 2000
    ("timm_dinov3", TIMM_DINOV3, 0),
    ("timm_dinov3_naflex_rot", TIMM_DINOV3, 1),  # timm PR #2692: the half table with rot()
    ("ideogram4", IDEOGRAM4 + ("--mode", "autocast"), 0),  # the angles with autocast disabled
    ("ideogram4_autocast_angles", IDEOGRAM4 + ("--mode", "autocast"), 1),  # diffusers #13920
])
def test_real_bugs_at_their_models(kernel, flags, code):
    r = _check(kernel, *flags, *_expect(code))
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output


def test_a_range_without_0_leaves_identity_and_commutation_to_the_reference():
    r = _check("dinov3", *DINO[:-3], "--coord-range", "0.5:1", *DINO[-2:])
    assert r.exit_code == 0, r.output
    for name in ("identity", "commutation"):
        assert any(name in line and "skip" in line for line in r.output.splitlines()), r.output


def test_axes_drawn_far_apart_show_a_mixed_up_slow_pair_in_bfloat16():
    """Wan's split bug turns its slow pairs 11 and 21 by the wrong axis: invisible while
    every axis sits near one base (bf16's bound stayed 1.5x above it at 200 examples), seen
    once the token-index draws put the frame index far from the row and column."""
    r = _check("wan_split_mismatch", *WAN, *_expect(1), dtype="bfloat16")
    assert r.exit_code == 1, r.output


@pytest.mark.parametrize("kernel, code", [("vjepa2", 0), ("vjepa2_repeat", 1)])  # vjepa2 PR #15
def test_vjepa2_blocks_with_a_passed_through_tail(tmp_path, kernel, code):
    """V-JEPA 2 ViT-L: three blocks of 20 features in a head of 64, the last 4 passed
    through: as a pair table, and as axial blocks with --head-dim 64."""
    import json

    from tests.nd_coordinate_kernels import vjepa2_table

    path = tmp_path / "vjepa2.json"
    path.write_text(json.dumps(vjepa2_table()))
    assert json.loads(path.read_text()) == json.load(open("acceptance/kernels/vjepa2_pairs.json"))
    r = _check(kernel, "--family", "pairs", "--pair-table", str(path), "--coord-range", "0:63", *_expect(code))
    assert r.exit_code == code, r.output
    r = _check(kernel, "--family", "axial", "--axes", "3", "--split", "20,20,20", "--head-dim", "64", "--layout",
               "interleaved", "--coord-range", "0:63", *_expect(code))
    assert r.exit_code == code, r.output


def test_a_head_dim_below_the_split_is_a_usage_error():
    r = _check("vjepa2", "--family", "axial", "--axes", "3", "--split", "20,20,20", "--head-dim", "48", "--layout",
               "interleaved")
    assert r.exit_code == 2 and "more than --head-dim 48" in r.output and "Traceback" not in r.output, r.output


# --- table builders of N-D rotations: --call builder, --family table-builder with N-D options --
FLUX_BUILDER = ("--family", "axial", "--axes", "3", "--layout", "interleaved", "--split", "16,56,56", "--positions",
                "float", "--coord-range", "0:512", "--call", "builder")
FLUX2_BUILDER = ("--family", "table-builder", "--axes", "4", "--layout", "interleaved", "--split", "32,32,32,32",
                 "--base", "2000", "--coord-range", "0:512")  # the alias: axial, --call builder


@pytest.mark.parametrize("kernel, flags, code", [
    ("flux_builder", FLUX_BUILDER, 0),
    ("flux_builder_complex", FLUX_BUILDER, 0),  # use_real=False: complex (S, D/2) in the pairs' order
    ("flux_builder_half_tables", FLUX_BUILDER, 1),  # cat(f, f) tables for adjacent pairs
    ("flux_builder_ids_in_bf16", FLUX_BUILDER, 1),
    ("flux2_builder", FLUX2_BUILDER, 0),
    ("flux2_builder_theta_dropped", FLUX2_BUILDER, 1),  # diffusers #10111 at FLUX.2's theta 2000
])
def test_a_table_builder_is_judged_by_the_rotation_its_tables_make(kernel, flags, code):
    r = _check(kernel, *flags, *_expect(code))
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output


def test_a_builder_has_no_backward_of_its_own_and_its_alias_reproduces_as_the_call_form():
    r = _check("flux2_builder_theta_dropped", *FLUX2_BUILDER, "--property", "reference")
    line = next(line for line in r.output.splitlines() if "reproduce:" in line)
    assert "--call builder" in line and "--family axial" in line, line
    r = _check("flux_builder", *FLUX_BUILDER, "--property", "backward")
    assert r.exit_code == 0 and "skip" in r.output, r.output


def test_a_builder_s_tables_of_the_wrong_shape_or_without_a_declared_rotation_are_told():
    r = _check("builder_wrong_shape", *FLUX_BUILDER, "--property", "contract")
    assert r.exit_code == 1 and "expected a float (" in r.output, r.output
    r = _check("flux_builder", "--family", "nd", "--axes", "3", "--call", "builder")
    assert r.exit_code == 2 and "declares none" in r.output and "Traceback" not in r.output, r.output
