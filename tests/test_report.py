"""`ropecheck report`: markdown, JSON with its execution envelope, plots; a regeneration
reproduces the JSON up to timing fields."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from click.testing import CliRunner

from ropecheck.cli import main


def _strip_timing(value):
    if isinstance(value, dict):
        return {k: _strip_timing(v) for k, v in value.items() if k not in ("seconds", "generated")}
    if isinstance(value, list):
        return [_strip_timing(v) for v in value]
    return value


def _report(out):
    """One regeneration = one process (the `ropecheck` command, as a user runs it)."""
    result = subprocess.run([sys.executable, "-m", "ropecheck", "report", "--out", str(out),
                             "--target", "rotate-half", "--target", "cached", "--dtype", "float32"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "report.json").read_text())


def test_report_renders_and_regenerates(tmp_path):
    first = _report(tmp_path / "a")
    envelope = first["envelope"]
    assert {"suite", "python", "torch", "device", "libraries", "profile", "seed"} <= set(envelope)
    summary = first["targets"]["rotate-half"]["dtypes"]["float32"]
    assert summary["verdict"] == "passed" and 0 < summary["max_normalised_error"] <= 1
    assert summary["accuracy_horizon"] >= 1 and summary["error_profile"]["positions"][-1] > 2**20
    assert set(summary["properties"]) >= {"reference", "relativity", "orthogonality"}
    markdown = (tmp_path / "a" / "report.md").read_text()
    assert "| `rotate-half` |" in markdown and "ropecheck report --out" in markdown
    png = (tmp_path / "a" / "error_vs_position_float32.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert _strip_timing(_report(tmp_path / "b")) == _strip_timing(first)


def test_an_n_d_adapter_gets_its_row_and_a_builder_is_refused(tmp_path):
    """N-D rotations are judged at the convention they imply; builders, whose checks take
    no tensors, stay with `ropecheck check --family`."""
    result = CliRunner().invoke(main, ["report", "--out", str(tmp_path), "--target", "rotary-embedding-torch-axial",
                                       "--dtype", "float32"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "report.json").read_text())["targets"]["rotary-embedding-torch-axial"]["dtypes"]
    assert summary["float32"]["verdict"] == "passed", summary
    result = CliRunner().invoke(main, ["report", "--out", str(tmp_path), "--target", "hf-qwen2vl-rope-index"])
    assert result.exit_code == 2 and "unknown target" in result.output


def test_report_refuses_unknown_targets(tmp_path):
    result = CliRunner().invoke(main, ["report", "--out", str(tmp_path), "--target", "nope"])
    assert result.exit_code == 2 and "unknown target" in result.output


def test_outputs_that_must_differ_but_are_equal_score_inf_in_strict_json():
    import math

    from ropecheck.properties.assertions import CheckFailure, assert_distinct
    from ropecheck.properties.runner import Result

    with pytest.raises(CheckFailure) as failure:
        assert_distinct(np.ones(3), np.ones(3), 1e-6, what="moved")
    assert math.isinf(failure.value.error)
    assert assert_distinct(np.zeros(3), np.ones(3), 0.5, what="moved") == 0.5
    result = Result("invertibility", "float32", "failed", "f", max_error=failure.value.error)
    assert json.loads(json.dumps(result.to_dict(), allow_nan=False))["max_error"] == "inf"
