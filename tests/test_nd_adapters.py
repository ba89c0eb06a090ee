"""N-D adapters (timm, rotary-embedding-torch, transformers) through `ropecheck check`, the
largest position a grid-table target declares, and the rotary-embedding-torch offsets defect."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ropecheck.properties.nd.checks import INVERTIBILITY_STEP, ND_PROPERTIES, limit
from ropecheck.properties.inputs.strategies import prime_step
from ropecheck.targets.target import Target
from ropecheck.properties.runner import run_property
from ropecheck.properties.runner import RunOptions
from ropecheck.reference.nd import axial
from ropecheck.adapters import ADAPTERS
from ropecheck.cli import main
from tests.test_nd_checks import _torch

OPTIONS = RunOptions(profile="ci", max_examples=6)
# diffusers' are checked in tests/test_diffusers_adapters.py, in process (its import takes seconds a worker)
ROTATIONS = sorted(n for n, a in ADAPTERS.items() if a.family in ("axial", "mrope", "nd") and a.library != "diffusers")
# library defects these adapters expose (README, "Findings"): the check must fail them in
# float32, and the shipped known-failure record must excuse exactly that
DEFECTIVE = {"rotary-embedding-torch-axial-offsets"}


def _check(*args):
    # in-process: a worker forked per check imported transformers' modeling code anew (5 s
    # of an HF adapter's 6; the test process imports it once)
    return CliRunner().invoke(main, ["check", *args, "--profile", "ci", "--max-examples", "4",
                                     "--dtype", "float32", "--in-process"])


@pytest.mark.parametrize("name", ROTATIONS)
def test_nd_adapter_verdict(name):
    why = ADAPTERS[name].why_unavailable()
    if why:
        result = _check(name)
        assert result.exit_code == 2 and "not available here" in result.output and "Traceback" not in result.output
        pytest.skip(why)
    result = _check(name)
    assert result.exit_code == 0, result.output
    if name in DEFECTIVE:
        assert "known" in result.output
        assert _check(name, "--no-known-failures").exit_code == 1


def test_rotary_embedding_torch_axial_offsets_ignore_the_offset_after_the_first_axis():
    """get_axial_freqs(..., offsets=) caches the first axis' shifted frequencies as positions
    0.. and serves them to the second axis (and to every later call)."""
    if ADAPTERS["rotary-embedding-torch-axial"].why_unavailable():
        pytest.skip("rotary-embedding-torch is not installed")
    from rotary_embedding_torch import RotaryEmbedding
    cached = RotaryEmbedding(dim=8).get_axial_freqs(1, 1, offsets=(5, 7)).flatten()
    fresh = RotaryEmbedding(dim=8, cache_if_possible=False).get_axial_freqs(1, 1, offsets=(5, 7)).flatten()
    assert fresh[8].item() == 7.0  # column 7 times theta_0 = 1: right without the cache
    assert cached[8].item() == 5.0  # the row's position instead


CONV = axial(8, 2, layout="interleaved")


def _table_rope(limit):
    """A correct 2-D RoPE (with autograd) that, like a grid table, refuses positions past ``limit``."""
    correct = _torch(CONV)

    def rope(x, positions):
        if int(positions.max()) > limit or int(positions.min()) < 0:
            raise IndexError(f"positions {int(positions.min())} .. {int(positions.max())} are off the table ({limit})")
        return correct(x, positions)
    return rope


@pytest.mark.parametrize("prop", sorted(ND_PROPERTIES))
def test_checks_stay_within_a_declared_max_position(prop):
    target = Target("table", _table_rope(300), CONV, family="axial", n_axes=2, head_dims=(8,), max_position=300)
    assert prime_step(INVERTIBILITY_STEP, limit(target) // 4) == 73  # the largest prime <= 300 / 4
    assert run_property(ND_PROPERTIES[prop], target, "float32", OPTIONS).status == "passed"


@pytest.mark.parametrize("prop", sorted(ND_PROPERTIES))
def test_a_grid_table_of_32_per_axis_is_declared_and_kept_to(prop):
    """A video model's table is built for a whole grid (32^3 tokens at 31 per axis): an N-D
    target may declare less than 1-D's 255, and its inputs are then drawn in 0 .. 15 (they
    were drawn from -1, past half the limit: the offsets' spread of 64 was larger than it)."""
    target = Target("grid", _table_rope(31), CONV, family="axial", n_axes=2, head_dims=(8,), max_position=31)
    assert run_property(ND_PROPERTIES[prop], target, "float32", OPTIONS).status == "passed"
    with pytest.raises(ValueError, match="at least 255"):
        Target("one-d", _table_rope(31), max_position=31)


def test_without_the_declaration_the_table_target_is_driven_past_its_end():
    target = Target("table", _table_rope(300), CONV, family="axial", n_axes=2, head_dims=(8,))
    assert run_property(ND_PROPERTIES["relativity-axis"], target, "float32", OPTIONS).status == "failed"


def test_max_position_below_the_smallest_usable_range_is_refused(tmp_path):
    # an N-D rotation may declare down to 31 per axis (a video grid of 32^3 tokens), 1-D ones 255
    with pytest.raises(ValueError, match="at least 31"):
        Target("table", _table_rope(20), CONV, family="axial", n_axes=2, head_dims=(8,), max_position=20)
    Target("table", _table_rope(31), CONV, family="axial", n_axes=2, head_dims=(8,), max_position=31)
    module = tmp_path / "tiny.py"
    module.write_text("from ropecheck.targets.target import Target\n"
                      "TINY = Target(name='tiny', fn=lambda x, positions: x, max_position=100)\n")
    result = _check(f"{module}:TINY", "--family", "nd", "--axes", "2")
    assert result.exit_code == 2 and "at least 255" in result.output and "Traceback" not in result.output
