"""Accuracy regressions gated like speed regressions (``--baseline``): the comparison of two
records (ropecheck/report/baseline.py) on made-up figures, then whole runs of kernels that
pass every check and differ only in precision (tests/precision_kernels.py) through each
front door: the CLI, ``ropecheck.check``, the pytest plugin and ``ropecheck report``."""

from __future__ import annotations

import copy
import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import ropecheck
from ropecheck.properties.checks import PROPERTIES
from ropecheck.cli import main
from ropecheck.report.baseline import compare, run_of_record
from tests import precision_kernels

pytest_plugins = ["pytester"]

KERNELS = Path(__file__).with_name("precision_kernels.py")
REFERENCE_ONLY = ("--layout", "half", "--profile", "ci", "--dtype", "float32", "--property", "reference")


def cli(*args: str):
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": "250"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output, result.output
    return result


# --- the comparison, on made-up records -------------------------------------------------------

SWEEP = [0, 1, 2, 64, 2**20, 2**24]


def record(dtype_figures: dict, profile: str = "ci", seed=None, target: str = "k.py:rope", unsupported=None) -> dict:
    """A check record: dtype -> {property: (status, max_error)}; reference also gets a sweep
    (horizon, relative error per position) from ("reference", dtype) -> (horizon, errors)."""
    results = []
    for dtype, figures in dtype_figures.items():
        for prop, value in figures.items():
            status, error, *sweep = value
            accuracy = None
            if sweep:
                horizon, errors = sweep
                accuracy = {"positions": SWEEP, "relative_error": errors, "horizon": horizon}
            results.append(
                {
                    "property": prop,
                    "dtype": dtype,
                    "mode": "eager",
                    "status": status,
                    "max_error": error,
                    "accuracy": accuracy,
                }
            )
    return {
        "target": target,
        "call": "x",
        "profile": profile,
        "seed": seed,
        "sizes": "toy",
        "options": {},
        "unsupported_dtypes": unsupported or {},
        "convention": None,
        "results": results,
    }


FLAT = [6e-8] * len(SWEEP)


def compared(before: dict, after: dict, factor: float = 2.0):
    return compare(run_of_record(before, "main.json"), run_of_record(after, "this run"), factor)


def kinds(comparison, finding: str) -> set:
    return {(d.key[0], d.kind) for d in comparison.deltas if d.finding == finding}


def test_identical_records_compare_clean():
    same = record({"float32": {"linearity": ("passed", 0.1), "reference": ("passed", 0.3, 2**24, FLAT)}})
    result = compared(same, copy.deepcopy(same))
    assert result.compared == 2 and result.deltas == [] and result.not_compared == [] and not result.failed


def test_a_horizon_halved_fails_and_one_that_shrinks_less_does_not():
    before = record({"float32": {"reference": ("passed", 0.3, 2**24, FLAT)}})
    halved = record({"float32": {"reference": ("passed", 0.3, 2**23, FLAT)}})
    assert kinds(compared(before, halved), "regression") == {("reference", "horizon")}
    less = record({"float32": {"reference": ("passed", 0.3, 3 * 2**22, FLAT)}})  # 3/4 of it: not a power of two
    assert compared(before, less).regressions == [] and compared(before, less).deltas[0].kind == "horizon"
    none = record({"float32": {"reference": ("passed", 0.3, None, FLAT)}})  # fails the strict bound at 0
    assert kinds(compared(before, none), "regression") == {("reference", "horizon")}


def test_an_error_past_the_factor_fails_and_passes_at_a_looser_factor():
    before = record({"float32": {"orthogonality": ("passed", 0.2)}})
    after = record({"float32": {"orthogonality": ("passed", 0.5)}})
    assert kinds(compared(before, after), "regression") == {("orthogonality", "max_error")}
    assert compared(before, after, factor=3.0).regressions == []


def test_errors_below_one_rounding_are_not_ratios():
    """0 -> 0.1 tolerance units is less than one rounding of the compute dtype (1/6 unit):
    not a regression, though the ratio of the raw figures is infinite."""
    before = record({"float32": {"identity": ("passed", 0.0)}})
    assert compared(before, record({"float32": {"identity": ("passed", 0.1)}})).regressions == []
    assert len(compared(before, record({"float32": {"identity": ("passed", 0.4)}})).regressions) == 1


def test_the_error_profile_is_compared_per_position():
    before = record({"float32": {"reference": ("passed", 0.3, 2**24, FLAT)}})
    worse_far_out = record({"float32": {"reference": ("passed", 0.3, 2**24, FLAT[:-1] + [6e-7])}})
    (delta,) = compared(before, worse_far_out).regressions
    assert (delta.kind, delta.where) == ("profile", f"position {2**24}") and delta.factor == pytest.approx(10)


def test_improvements_are_reported_never_failed():
    before = record({"float32": {"reference": ("failed", 3.0, 64, [6e-6] * 6), "inverse": ("passed", 0.9)}})
    after = record({"float32": {"reference": ("passed", 0.3, 2**24, FLAT), "inverse": ("passed", 0.2)}})
    result = compared(before, after)
    assert not result.failed and kinds(result, "improvement") == {("reference", "verdict"), ("inverse", "max_error")}


def test_a_property_that_passed_and_now_fails_or_is_skipped_fails():
    before = record({"float32": {"relativity": ("passed", 0.1), "backward": ("passed", 0.2)}})
    after = record({"float32": {"relativity": ("failed", 7.0), "backward": ("skipped", None)}})
    assert kinds(compared(before, after), "regression") == {("relativity", "verdict"), ("backward", "refused")}


def test_a_dtype_that_was_checked_and_is_now_refused_fails():
    before = record({"float32": {"identity": ("passed", 0.0)}, "float16": {"identity": ("passed", 0.0)}})
    after = record({"float32": {"identity": ("passed", 0.0)}}, unsupported={"float16": "the target raised TypeError"})
    assert kinds(compared(before, after), "regression") == {("identity", "refused")}


def test_mismatched_runs_say_what_was_not_compared():
    before = record(
        {"float32": {"linearity": ("passed", 0.1)}, "float16": {"linearity": ("passed", 0.1)}}, profile="dev", seed=7
    )
    after = record(
        {
            "float32": {"linearity": ("passed", 0.9), "identity": ("passed", 0.0)},
            "bfloat16": {"linearity": ("passed", 0.1)},
        }
    )
    result = compared(before, after)
    assert not result.failed  # 0.1 -> 0.9 is 9x, but the inputs were drawn otherwise
    said = "\n".join(result.not_compared)
    assert "largest errors: the two runs drew different inputs (profile dev -> ci, seed 7 -> None)" in said
    assert "float16: in the baseline, not in this run" in said and "bfloat16: not in the baseline" in said
    assert "identity (float32): not in the baseline" in said
    fewer = record({"float32": {"linearity": ("passed", 0.9)}})
    fewer["options"] = {"max_examples": 5}  # the same profile and seed, another example budget
    said = "\n".join(compared(record({"float32": {"linearity": ("passed", 0.1)}}), fewer).not_compared)
    assert "drew different inputs (max_examples None -> 5)" in said


def test_a_bad_baseline_is_a_usage_error(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    for path, said in ((tmp_path / "none.json", "cannot read"), (tmp_path / "bad.json", "is not JSON")):
        result = cli("check", "--baseline", str(path), "--dtype", "float32")
        assert result.exit_code == 2 and said in result.output
    result = cli("check", "--update-baseline", "--dtype", "float32")
    assert result.exit_code == 2 and "--update-baseline needs --baseline" in result.output
    report = Path(__file__).parents[1] / "docs/report/report.json"  # a report without this target
    result = cli("check", f"{KERNELS}:angles64", *REFERENCE_ONLY, "--baseline", str(report))
    assert result.exit_code == 2 and "the report has no target" in result.output


# --- whole runs ----------------------------------------------------------------------------------


def test_float32_angles_fail_the_gate_on_the_horizon_and_pass_the_verdict(tmp_path):
    """The edit of a kernel that forms m * theta_i in float64 into one that forms it in
    float32 (what HF does): every check passes, the horizon falls from 2^24 to 64."""
    base = tmp_path / "main.json"
    first = cli("check", f"{KERNELS}:angles64", *REFERENCE_ONLY, "--baseline", str(base), "--update-baseline")
    assert first.exit_code == 0 and base.exists(), first.output
    plain = cli("check", f"{KERNELS}:angles32", *REFERENCE_ONLY)
    assert plain.exit_code == 0 and "PASSED" in plain.output
    gated = cli(
        "check", f"{KERNELS}:angles32", *REFERENCE_ONLY, "--baseline", str(base), "--json", str(tmp_path / "pr.json")
    )
    assert gated.exit_code == 1, gated.output
    assert "FAIL" not in gated.output.split("against the baseline")[0]  # the verdict table passes
    assert "FAILED (2 accuracy regressions against the baseline)" in gated.output
    row = next(line for line in gated.output.splitlines() if "horizon" in line and "REGRESSION" in line)
    assert "16777216 -> 64" in row
    saved = json.loads((tmp_path / "pr.json").read_text())
    assert saved["verdict"] == "failed" and saved["exit_status"] == 1
    assert {d["figure"] for d in saved["baseline"]["deltas"] if d["finding"] == "regression"} == {"horizon", "profile"}
    # the other way round it is an improvement: reported, not failed
    better = cli("check", f"{KERNELS}:angles64", *REFERENCE_ONLY, "--baseline", str(tmp_path / "pr.json"))
    assert better.exit_code == 0 and "improved" in better.output and "PASSED" in better.output


def test_an_error_that_grows_fails_at_the_default_factor_and_passes_at_a_looser_one(tmp_path):
    """gain4's errors are about 2.5 times gain1's (an output scaled by 1 + 4u against 1 + u,
    plus the rounding both have), every one within the error model."""
    keywords = dict(layout="half", dtypes=["float32"], properties=["reference", "orthogonality"])
    ropecheck.check(precision_kernels.gain1, **keywords).to_json(tmp_path / "main.json")
    strict = ropecheck.check(precision_kernels.gain4, **keywords, baseline=tmp_path / "main.json")
    assert strict.verdict == "failed" and all(r.status == "passed" for r in strict.results)
    assert {(d.key[0], d.kind) for d in strict.comparison.regressions} >= {
        ("reference", "max_error"),
        ("orthogonality", "max_error"),
    }
    assert "accuracy regressions against the baseline" in strict.summary()
    loose = ropecheck.check(precision_kernels.gain4, **keywords, baseline=tmp_path / "main.json", regression_factor=4)
    assert loose.passed and loose.comparison.regressions == [] and loose.comparison.shown


def test_two_runs_of_the_same_commit_compare_clean_in_every_dtype(tmp_path):
    """The ci profile is derandomized and the sweep fixed: every figure of every dtype is
    the same on a second run (rotate-half, the four dtypes, every property)."""
    base = tmp_path / "main.json"
    # --in-process: what is compared is the runs' figures, not where the target ran
    first = cli("check", "--profile", "ci", "--json", str(base), "--in-process")
    assert first.exit_code == 0, first.output
    assert json.loads(base.read_text())["dtypes"] == ["float32", "bfloat16", "float16", "float64"]
    again = cli("check", "--profile", "ci", "--baseline", str(base), "--json", str(tmp_path / "again.json"),
                "--in-process")
    assert again.exit_code == 0, again.output
    comparison = json.loads((tmp_path / "again.json").read_text())["baseline"]
    assert comparison["figures_compared"] == 4 * (sum(not p.needs_table for p in PROPERTIES.values()) + 1) and comparison["deltas"] == [] and comparison["not_compared"] == []


def test_the_pytest_plugin_fails_the_test_of_the_property_that_regressed(pytester, tmp_path):
    base = tmp_path / "main.json"
    assert cli("check", f"{KERNELS}:angles64", *REFERENCE_ONLY, "--json", str(base)).exit_code == 0
    pytester.makeini(
        textwrap.dedent(f"""
        [pytest]
        rope_target = {KERNELS}:angles32
        rope_layout = half
        rope_profile = ci
        rope_dtype = float32
        rope_baseline = {base}
    """)
    )
    result = pytester.runpytest_subprocess(
        "--pyargs", "ropecheck.properties", "-p", "no:cacheprovider", "-k", "reference or identity"
    )
    result.assert_outcomes(passed=1, failed=1)  # identity: not in the baseline, not compared
    result.stdout.fnmatch_lines(["*test_property*float32-reference*", "*regression: horizon 16777216 -> 64*",
                                 "ropecheck baseline *main.json: each check compared at --rope-regression-factor 2"])


def test_report_baseline_tables_what_changed_per_target(tmp_path):
    """``ropecheck report --baseline``: the shipped report, with rotate-half's float32 horizon
    made 2^20 times larger and one property made to fail in it."""
    old = json.loads((Path(__file__).parents[1] / "docs/report/report.json").read_text())
    summary = old["targets"]["rotate-half"]["dtypes"]["float32"]
    summary["accuracy_horizon"] = 64 * 2**20
    summary["properties"]["linearity"]["status"] = "failed"
    (tmp_path / "old.json").write_text(json.dumps(old))
    result = cli(
        "report",
        "--baseline",
        str(tmp_path / "old.json"),
        "--target",
        "rotate-half",
        "--dtype",
        "float32",
        "--out",
        str(tmp_path / "new"),
    )
    assert result.exit_code == 1, result.output
    rows = [line for line in result.output.splitlines() if "rotate-half" in line and "reference" in line]
    assert any("horizon" in line and "REGRESSION" in line for line in rows), result.output
    assert any("linearity" in line and "improved" in line for line in result.output.splitlines())
    assert "targets in the baseline, not in this report" in result.output
    assert "rotate-half: bfloat16: in the baseline, not in this run" in result.output
