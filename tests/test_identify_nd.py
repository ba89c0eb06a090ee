"""``ropecheck identify --family nd``: N-D kernels are named with the flags of the family
that declares them (axial, M-RoPE, else a pair table), and ``ropecheck check`` with those
flags passes them (the round trip, on the reference property); maps that are not N-D
rotations are refused with their reason, never a traceback."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from ropecheck.cli import main
from ropecheck.identification.nd import identify_nd
from ropecheck.session.loading import load_here

COORD, ACCEPT, OWN = "tests/nd_coordinate_kernels.py", "acceptance/kernels/nd.py", "tests/nd_identify_kernels.py"

NAMED = [  # spec, axes, the flags identify prints
    (
        f"{COORD}:qwen25vl_vision",
        2,
        "--family axial --axes 2 --layout half --split 32,32 --pair-span head --base 10000",
    ),
    (f"{ACCEPT}:axial_interleaved", 2, "--family axial --axes 2 --layout interleaved --split 32,32 --base 10000"),
    (f"{OWN}:axial_two_bases", 2, "--family axial --axes 2 --layout half --split 32,32 --base 10000,100"),
    (
        f"{COORD}:wan",
        3,
        "--family axial --axes 3 --layout interleaved --split 24,20,20 --base 10000 --max-position 1023",
    ),
    (f"{COORD}:vjepa2", 3, "--family axial --axes 3 --layout interleaved --split 20,20,20 --base 10000"),
    (f"{COORD}:flux2", 4, "--family axial --axes 4 --layout interleaved --split 32,32,32,32 --base 2000"),
    (f"{ACCEPT}:mrope_toy", 3, "--family mrope --sections 2,3,3 --layout half --base 10000"),
    (f"{ACCEPT}:qwen2vl_mrope", 3, "--family mrope --sections 16,24,24 --layout half --base 1e+06"),
    (f"{ACCEPT}:qwen3vl_mrope", 3, "--family mrope --sections 24,20,20 --layout half --mrope-interleaved --base 5e+06"),
]


def _identify(spec, axes, **kwargs):
    return identify_nd(load_here(spec, family="nd"), axes, **kwargs)


def _check(spec, flags):
    """``ropecheck check`` with identify's flags, on the reference (float32, in process)."""
    args = ["check", spec, *shlex.split(flags), "--property", "reference", "--dtype", "float32", "--in-process"]
    args += ["--profile", "ci"]
    return CliRunner().invoke(main, args)


def _named_and_checked(spec, axes, flags, **kwargs):
    """identify prints ``flags``, and ``ropecheck check`` with them passes the target."""
    ident = _identify(spec, axes, **kwargs)
    assert ident.rotary and ident.confidence == "high", (ident.reasons, ident.notes)
    assert ident.flags == flags
    result = _check(spec, flags)
    assert result.exit_code == 0 and "PASSED" in result.output, result.output
    return ident


@pytest.mark.parametrize("spec, axes, flags", NAMED, ids=[n[0].split(":")[1] for n in NAMED])
def test_named_and_checked(spec, axes, flags):
    _named_and_checked(spec, axes, flags)


def test_offset_grid_is_named_with_its_offset():
    """Angles theta (x + 8): every pair turns at x = 0 by theta 8, an offset per axis."""
    flags = "--family axial --axes 2 --layout interleaved --split 32,32 --base 10000 --coord-offset 8"
    ident = _named_and_checked(f"{COORD}:offset_grid", 2, flags)
    assert any(note.startswith("offset: 32 pairs turn at x = 0") for note in ident.notes), ident.notes


def test_interpolated_grid_is_named_with_its_scale_and_offset():
    """Angles theta (2 (x + 3) / 3): a coordinate scale and an offset, both per axis."""
    flags = "--family axial --axes 2 --layout interleaved --split 32,32 --base 10000 --coord-scale 0.6666667"
    _named_and_checked(f"{OWN}:interpolated", 2, flags + " --coord-offset 2")


def test_dinov3_coordinates_are_probed_as_floats():
    """DINOv3: 2 pi x / period on float coordinates; theta_0 = 2 pi per unit, which integer
    positions cannot tell from 0: --positions float probes fractions of a unit."""
    flags = "--family axial --axes 2 --layout half --split 32,32 --pair-span head --base 100 --coord-scale 6.283185"
    _named_and_checked(f"{COORD}:dinov3", 2, flags + " --positions float", float_positions=True)


def test_api_identifies_nd_objects():
    import ropecheck
    from tests.nd_coordinate_kernels import wan

    found = ropecheck.identify(wan, family="nd", axes=3)
    assert found.flags.startswith("--family axial --axes 3 --layout interleaved --split 24,20,20"), found.flags
    with pytest.raises(ValueError, match="axes applies to an N-D family"):
        ropecheck.identify(wan, axes=3)


def test_axes_default_to_what_the_target_implies():
    """An adapter's implied --sections (or --axes) give the axes when --axes is left out."""
    from acceptance.kernels.nd import mrope_toy
    from ropecheck.identification.nd import identify_nd_spec
    from ropecheck.targets.target import Target

    target = Target("toy", mrope_toy, family="mrope", implies={"sections": [2, 3, 3], "layout": "half"})
    found = identify_nd_spec(target, in_process=True)
    assert found.n_axes == 3 and found.flags == "--family mrope --sections 2,3,3 --layout half --base 10000"


def test_clockwise_is_a_pair_table(tmp_path):
    """Turned the other way: no family's orientation; the table written and checked."""
    spec, table = f"{OWN}:clockwise", tmp_path / "pairs.json"
    ident = _identify(spec, 2, table_path=str(table))
    assert ident.rotary and ident.family == "pairs", ident.reasons
    written = json.loads(table.read_text())
    assert written["head_dim"] == 64 and written["n_axes"] == 2 and len(written["pairs"]) == 32
    assert written["pairs"][0] == [16, 0, 0, 1.0, 0.0]  # second feature first: clockwise
    assert ident.flags == f"--family pairs --pair-table {table}"
    result = _check(spec, ident.flags)
    assert result.exit_code == 0 and "PASSED" in result.output, result.output


def test_a_printed_pair_table_is_json_one_pair_per_line():
    """Without --write-table the table is printed: the file's JSON, no line a screen of numbers."""
    from ropecheck.identification.output import table_json

    ident = _identify(f"{OWN}:clockwise", 2)
    printed = table_json(ident.table)
    assert json.loads(printed) == ident.table and len(ident.table["pairs"]) == 32
    assert max(len(line) for line in printed.splitlines()) < 200, printed


def test_cli_prints_flags_and_table(tmp_path):
    out = tmp_path / "id.json"
    result = CliRunner().invoke(
        main, ["identify", f"{ACCEPT}:mrope_toy", "--family", "nd", "--axes", "3", "--in-process", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "flags: --family mrope --sections 2,3,3 --layout half --base 10000" in result.output
    data = json.loads(out.read_text())["identification"]
    assert data["rotary"] and data["family"] == "mrope" and len(data["table"]["pairs"]) == 8
    result = CliRunner().invoke(main, ["identify", f"{OWN}:clockwise", "--family", "nd", "--in-process"])
    assert result.exit_code == 0, result.output
    assert "flags: --family pairs --pair-table FILE.json" in result.output
    assert '"pairs":[[0,16,0,' not in result.output and "[16,0,0,1.0,0.0]" in result.output  # the table printed


@pytest.mark.parametrize(
    "spec, axes, words",
    [
        (f"{OWN}:additive", 2, ["f(0, m) = p_m != 0", "additive"]),
        (f"{ACCEPT}:axial_summed_positions", 2, ["turn with axes [0, 1] together"]),
        (f"{COORD}:ltx", 3, ["depends on the token's other heads", "out of identify's reach"]),  # pairs over heads
    ],
)
def test_cli_refuses_what_is_not_an_nd_rotation(spec, axes, words):
    result = CliRunner().invoke(main, ["identify", spec, "--family", "nd", "--axes", str(axes), "--in-process"])
    assert result.exit_code == 1, result.output
    assert "not an N-D rotary embedding ropecheck can name" in result.output
    for word in words:
        assert word in result.output, result.output
    assert "Traceback" not in result.output


def test_cli_unusable_and_usage(tmp_path):
    path = tmp_path / "target.py"
    path.write_text("def rope(x, positions):\n    raise RuntimeError('no kernel for this input')\n")
    result = CliRunner().invoke(main, ["identify", f"{path}:rope", "--family", "nd", "--in-process"])
    assert result.exit_code == 2 and "RuntimeError: no kernel for this input" in result.output, result.output
    result = CliRunner().invoke(main, ["identify", f"{path}:rope", "--axes", "3"])
    assert (
        result.exit_code == 2 and "--axes, --positions and --write-table apply to identify --family nd" in result.output
    )
    result = CliRunner().invoke(main, ["identify", f"{path}:rope", "--family", "xpos"])
    assert result.exit_code == 2 and "identify takes --family rope or an N-D rotation" in result.output
