"""Known failures as data: records excuse failures (status 'known'), never passes, and
bad files are refused with their name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ropecheck.properties.runner import Result
from ropecheck.session import known_failures

RECORD = """
[[known]]
target = "t"
property = "reference"
dtypes = ["bfloat16"]
reason = "angles in bf16"
"""


def _result(status, dtype="bfloat16", prop="reference"):
    return Result(prop, dtype, status, "formula", max_error=3.0, message="m")


def test_record_excuses_only_the_failure_it_names(tmp_path):
    path = tmp_path / "known.toml"
    path.write_text(RECORD)
    records = known_failures.load([path])
    applied = known_failures.apply("t", [_result("failed"), _result("failed", "float32"),
                                         _result("failed", prop="orthogonality")], records)
    assert [r.status for r in applied] == ["known", "failed", "failed"]
    assert "angles in bf16" in applied[0].message
    assert known_failures.apply("other", [_result("failed")], records)[0].status == "failed"


def test_a_record_that_now_passes_is_listed_as_fixed(tmp_path):
    path = tmp_path / "known.toml"
    path.write_text(RECORD)
    records = known_failures.load([path])
    assert known_failures.fixed("t", [_result("passed")], records) == records
    assert known_failures.fixed("t", [_result("failed")], records) == []


@pytest.mark.parametrize("text, message", [("[[known]]\ntarget = 't'\n", "lacks property, reason"),
                                           ("not toml [", "cannot read")])
def test_malformed_files_are_refused(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        known_failures.load([path])


def test_cli_known_failure_turns_a_failing_run_green(tmp_path):
    """A kernel with a sign bug fails; recorded as known, the run exits 0 and still shows it."""
    kernel = tmp_path / "flipped.py"
    kernel.write_text("from ropecheck.targets.builtins import make_rotate_half\n"
                      "_good = make_rotate_half()\n"
                      "def rope(x, p):\n    return _good(x, -p)\n")
    known = tmp_path / "known.toml"
    known.write_text(f'[[known]]\ntarget = "{kernel}:rope"\nproperty = "reference"\n'
                     'reason = "rotates clockwise"\n')
    base = [sys.executable, "-m", "ropecheck", "check", f"{kernel}:rope", "--layout", "half",
            "--dtype", "float32", "--property", "reference", "--profile", "ci", "--max-examples", "5"]
    failing = subprocess.run(base, capture_output=True, text=True)
    assert failing.returncode == 1, failing.stdout
    out = tmp_path / "r.json"
    green = subprocess.run(base + ["--known-failures", str(known), "--json", str(out)],
                           capture_output=True, text=True)
    assert green.returncode == 0, green.stdout + green.stderr
    assert "KNOWN" in green.stdout and "rotates clockwise" in green.stdout
    assert json.loads(out.read_text())["results"][0]["status"] == "known"
