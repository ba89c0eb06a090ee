"""Behaviour of ``ropecheck check`` / ``ropecheck list``: exit statuses, messages, reports.

Exit statuses (ropecheck/cli.py): 0 every check passed, 1 a check failed, 2 usage error or
a target that cannot be loaded or called. Every case writes its own small target file into
tmp_path; every file is self-contained (no imports between target files: the loader puts
the file's folder on sys.path while importing it, and a module cached under a shared name
would leak from one test into the next).

Most cases run in-process through click's CliRunner (fast); the hang cases run the CLI in
a subprocess so that a broken time limit cannot take the test session down with it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from ropecheck.properties.checks import PROPERTIES
from ropecheck.cli import main

ROOT = Path(__file__).resolve().parents[1]

# Keep every run small: derandomized profile, few examples, one dtype.
FAST = ("--profile", "ci", "--max-examples", "5")
FP32 = ("--dtype", "float32")

# A correct half-layout (rotate_half) RoPE, angles and cos/sin formed in float32.
CORRECT = textwrap.dedent('''
    import torch


    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


    def correct_rope(x, positions):
        r = x.shape[-1]
        theta = 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float32) / r)
        angles = positions.float()[..., None] * theta
        angles = torch.cat((angles, angles), dim=-1)[:, :, None, :]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        return x * cos + rotate_half(x) * sin
''')

TARGETS = {
    "good": CORRECT + "\nrope = correct_rope\n",
    # rotates by -m instead of +m: a valid rotation, so only the reference checks see it
    "sign_flipped": CORRECT + textwrap.dedent('''
        def rope(x, positions):
            return correct_rope(x, -positions)
    '''),
    "wrong_shape": CORRECT + textwrap.dedent('''
        def rope(x, positions):
            return correct_rope(x, positions)[..., :-1]
    '''),
    "nan": CORRECT + textwrap.dedent('''
        def rope(x, positions):
            return torch.full_like(x, float("nan"))
    '''),
    "mutates_input": CORRECT + textwrap.dedent('''
        def rope(x, positions):
            y = correct_rope(x.clone(), positions)
            with torch.no_grad():
                x.mul_(1.0001)
            return y
    '''),
    "upcasts": CORRECT + textwrap.dedent('''
        def rope(x, positions):
            return correct_rope(x.float(), positions)  # float32 out for any x
    '''),
    "syntax_error": "def rope(x, positions)\n    return x\n",
    "import_error": "import ropecheck_no_such_module_xyz\n\n\ndef rope(x, positions):\n    return x\n",
    "one_argument": CORRECT + "\n\ndef rope(x):\n    return x\n",
    "raises": CORRECT + textwrap.dedent('''
        def rope(x, positions):
            raise ValueError("this target always fails")
    '''),
    "hangs": "def rope(x, positions):\n    while True:\n        pass\n",
    # answers quickly on the small smoke-call inputs, hangs on a large position
    "hangs_later": CORRECT + textwrap.dedent('''
        def rope(x, positions):
            if int(positions.max()) > 60000:
                while True:
                    pass
            return correct_rope(x, positions)
    '''),
    # only float32 is supported: every other dtype raises
    "float32_only": CORRECT + textwrap.dedent('''
        def rope(x, positions):
            if x.dtype != torch.float32:
                raise TypeError(f"unsupported dtype {x.dtype}")
            return correct_rope(x, positions)
    '''),
    # hangs in bfloat16 only
    "hangs_in_bfloat16": CORRECT + textwrap.dedent('''
        def rope(x, positions):
            if x.dtype == torch.bfloat16:
                while True:
                    pass
            return correct_rope(x, positions)
    '''),
    # wrong only on the batch=2, seq=1 input: the first of the critical cases
    "wrong_on_decode": CORRECT + textwrap.dedent('''
        def rope(x, positions):
            y = correct_rope(x, positions)
            return -y if tuple(x.shape[:2]) == (2, 1) else y
    '''),
    # right on the critical cases' head sizes (8, 80, 96), wrong on every other one, so
    # that the failure is found by generation, not by an explicit example
    "wrong_on_generated": CORRECT + textwrap.dedent('''
        def rope(x, positions):
            y = correct_rope(x, positions)
            return y if x.shape[-1] in (8, 80, 96) else -y
    '''),
}


def target(tmp_path: Path, kind: str, attr: str = "rope") -> str:
    path = tmp_path / f"{kind}.py"
    path.write_text(TARGETS[kind])
    return f"{path}:{attr}"


def run_cli(*args: str):
    """Invoke the CLI in-process; wide columns so rich does not wrap the words we look for."""
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": "250"})
    # an uncaught exception would be reported here, not in the output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"uncaught {result.exception!r}\n{result.output}")
    assert "Traceback" not in result.output, result.output
    return result


def check(*args: str):
    return run_cli("check", *args)


def run_subprocess(*args: str, timeout: float = 120, fresh_workers: bool = False):
    """The `ropecheck` command in a process of its own; ``fresh_workers``: its CLI entered
    without the command's zygote, so that every worker is a fresh interpreter, as in a
    user's program that called ropecheck.check after running torch."""
    env = dict(os.environ, COLUMNS="250")
    start = time.monotonic()
    command = ["-c", "from ropecheck.cli import main; main()"] if fresh_workers else ["-m", "ropecheck"]
    proc = subprocess.run([sys.executable, *command, *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    return proc, time.monotonic() - start


# every property offered to a target called as itself (a table-fed interface's are not), and the position-range probe
ROWS = sum(not prop.needs_table for prop in PROPERTIES.values()) + 1



def failed(output: str, prop: str, dtype: str) -> bool:
    """The output reports ``prop`` failing in ``dtype``: on its own, or taken down by a
    root cause shared with other properties."""
    if f"FAILED {prop} ({dtype})" in output:
        return True
    return any(re.search(rf"ROOT CAUSE C\d+ took down \d+ propert\w+ \(.*\b{re.escape(prop)}\b.*\) in .*{dtype}", line)
               for line in output.splitlines())


def reproduce_lines(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.strip().startswith("reproduce:")]


# --- exit 0 ----------------------------------------------------------------------------

def test_builtin_default_target_passes():
    result = check(*FP32, *FAST)
    assert result.exit_code == 0, result.output
    assert "rotate-half" in result.output
    assert "--layout half" in result.output  # the built-in declares its convention
    assert "PASSED" in result.output
    assert "FAIL" not in result.output


def test_correct_file_target_with_layout_passes(tmp_path):
    result = check(target(tmp_path, "good"), "--layout", "half", *FP32, *FAST)
    assert result.exit_code == 0, result.output
    assert "Convention: --layout half --base 10000" in result.output
    assert "reference" in result.output and "backward" in result.output
    assert "PASSED" in result.output


def test_no_layout_runs_spec_free_checks_only(tmp_path):
    result = check(target(tmp_path, "good"), *FP32, *FAST)
    assert result.exit_code == 0, result.output
    assert "spec-free" in result.output
    assert "PASSED" in result.output
    # reference and backward need a convention: skipped, not failed
    assert re.search(r"reference\s.*skip", result.output), result.output


def test_unusable_dtypes_are_skipped_when_none_is_requested(tmp_path):
    result = check(target(tmp_path, "float32_only"), "--layout", "half", *FAST)
    for dtype in ("bfloat16", "float16", "float64"):
        assert f"skipping {dtype}" in result.output
    assert "float32" in result.output


@pytest.mark.parametrize("dtypes", [(), FP32], ids=["skipped-dtypes", "explicit-float32"])
def test_float32_only_target_passes_in_float32(tmp_path, dtypes):
    result = check(target(tmp_path, "float32_only"), "--layout", "half", *dtypes, *FAST)
    assert result.exit_code == 0, result.output
    assert "PASSED" in result.output
    assert "FAILED" not in result.output and "raised TypeError" not in result.output.split("PASSED")[0].split("Profile")[-1]


# --- exit 1 ----------------------------------------------------------------------------

def test_sign_flipped_target_fails(tmp_path):
    result = check(target(tmp_path, "sign_flipped"), "--layout", "half", *FP32, *FAST)
    assert result.exit_code == 1, result.output
    assert failed(result.output, "reference", "float32"), result.output
    assert "outside the bound" in result.output
    assert result.output.rstrip().endswith("FAILED")


@pytest.mark.parametrize("kind, words", [
    ("wrong_shape", ["output shape", "differs from input shape"]),
    ("nan", ["non-finite output nan"]),
    ("mutates_input", ["modified its input x in place"]),
])
def test_contract_violations_fail(tmp_path, kind, words):
    # every property fails on these, each shrinking its own counterexample: run one
    result = check(target(tmp_path, kind), "--layout", "half", *FP32, *FAST, "--property", "contract")
    assert result.exit_code == 1, result.output
    assert "FAILED contract (float32)" in result.output
    for word in words:
        assert word in result.output


def test_output_dtype_changed_fails(tmp_path):
    result = check(target(tmp_path, "upcasts"), "--layout", "half", "--dtype", "bfloat16", *FAST,
                   "--property", "contract")
    assert result.exit_code == 1, result.output
    assert "FAILED contract (bfloat16)" in result.output
    assert "output dtype torch.float32 differs from input dtype torch.bfloat16" in result.output


def test_failure_report_names_property_counterexample_and_reproduce(tmp_path):
    spec = target(tmp_path, "sign_flipped")
    result = check(spec, "--layout", "half", *FP32, *FAST, "--seed", "123")
    assert result.exit_code == 1, result.output
    assert failed(result.output, "reference", "float32"), result.output
    assert "minimal counterexample:" in result.output
    lines = reproduce_lines(result.output)
    assert lines, result.output
    line = next(l for l in lines if "--property reference" in l)
    assert "ropecheck check" in line and spec in line
    assert "--seed 123" in line and "--layout half" in line and "--dtype float32" in line


def test_dev_profile_picks_prints_and_reproduces_a_seed(tmp_path):
    result = check(target(tmp_path, "sign_flipped"), "--layout", "half", *FP32,
                   "--profile", "dev", "--max-examples", "5", "--property", "reference")
    assert result.exit_code == 1, result.output
    seed = re.search(r"Profile dev, seed (\d+)", result.output)
    assert seed, result.output
    assert any(f"--seed {seed.group(1)}" in line for line in reproduce_lines(result.output))


# Regression: the counterexample shown is the input that failed (an earlier runner showed
# the last input run, a passing one, when a critical case failed).
def test_counterexample_is_the_failing_input(tmp_path):
    result = check(target(tmp_path, "wrong_on_decode"), "--layout", "half", *FP32, *FAST,
                   "--property", "reference")
    assert result.exit_code == 1, result.output
    assert "position=4097" in result.output  # the failing input: batch 2, seq 1
    counterexample = next(line for line in result.output.splitlines()
                          if "minimal counterexample:" in line)
    assert "shape (2, 1, 2, 128)" in counterexample, counterexample


# Regression: a failure found by generation is reproduced by the ropecheck command with
# --seed (an earlier runner printed only hypothesis' "@reproduce_failure ... as a decorator
# on your test function" note, which a CLI user cannot apply).
def test_reproduce_line_is_a_command_for_generated_failures(tmp_path):
    result = check(target(tmp_path, "wrong_on_generated"), "--layout", "half", *FP32,
                   "--profile", "ci", "--max-examples", "20", "--seed", "7", "--property", "reference")
    assert result.exit_code == 1, result.output
    lines = reproduce_lines(result.output)
    assert lines and all("ropecheck check" in line and "--seed 7" in line for line in lines), lines


# --- exit 2 ----------------------------------------------------------------------------

def test_no_such_file(tmp_path):
    result = check(f"{tmp_path / 'missing.py'}:rope", *FP32, *FAST)
    assert result.exit_code == 2, result.output
    assert "cannot load target" in result.output and "no such file" in result.output


def test_syntax_error(tmp_path):
    result = check(target(tmp_path, "syntax_error"), *FP32, *FAST)
    assert result.exit_code == 2, result.output
    assert "cannot load target" in result.output and "SyntaxError" in result.output


def test_import_error(tmp_path):
    result = check(target(tmp_path, "import_error"), *FP32, *FAST)
    assert result.exit_code == 2, result.output
    assert "ModuleNotFoundError" in result.output
    assert "ropecheck_no_such_module_xyz" in result.output


def test_missing_attribute_lists_what_the_file_has(tmp_path):
    result = check(target(tmp_path, "good", attr="apply_rope"), *FP32, *FAST)
    assert result.exit_code == 2, result.output
    assert "has no attribute 'apply_rope'" in result.output
    assert "it has:" in result.output
    for name in ("correct_rope", "rope", "rotate_half"):
        assert name in result.output


def test_wrong_signature(tmp_path):
    result = check(target(tmp_path, "one_argument"), *FP32, *FAST)
    assert result.exit_code == 2, result.output
    assert "must accept rope(x, positions)" in result.output
    assert "rope(x)" in result.output


def test_target_that_always_raises(tmp_path):
    result = check(target(tmp_path, "raises"), "--layout", "half", *FP32, *FAST)
    assert result.exit_code == 2, result.output
    assert "cannot be called" in result.output
    assert "ValueError" in result.output and "this target always fails" in result.output


def test_target_that_raises_in_every_dtype(tmp_path):
    result = check(target(tmp_path, "raises"), "--layout", "half", *FAST)
    assert result.exit_code == 2, result.output
    assert "cannot be called in any dtype" in result.output


def test_builtin_with_another_layout_is_refused():
    result = check("rotate-half", "--layout", "interleaved", *FP32, *FAST)
    assert result.exit_code == 2, result.output
    assert "half layout" in result.output


def test_unknown_dtype_is_a_usage_error(tmp_path):
    result = check(target(tmp_path, "good"), "--dtype", "float99", *FAST)
    assert result.exit_code == 2, result.output
    assert "Usage:" in result.output
    assert "unknown dtype 'float99'" in result.output


def test_unknown_property_is_a_usage_error(tmp_path):
    result = check(target(tmp_path, "good"), *FP32, *FAST, "--property", "no-such-property")
    assert result.exit_code == 2, result.output
    assert "Usage:" in result.output
    assert "unknown properties" in result.output and "no-such-property" in result.output


def test_hanging_target_is_unusable_within_the_timeout(tmp_path):
    # a worker that is a fresh interpreter (a Popen, not a fork of the zygote) is stopped as well
    proc, seconds = run_subprocess("check", target(tmp_path, "hangs"), *FP32, *FAST, "--timeout", "1",
                                   fresh_workers=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert seconds < 30, f"took {seconds:.1f} s"
    assert "cannot be called" in output and "did not return within 1 s" in output
    assert "Traceback" not in output


def test_target_hanging_mid_run_stops_the_run(tmp_path):
    proc, seconds = run_subprocess("check", target(tmp_path, "hangs_later"), "--layout", "half",
                                   *FP32, *FAST, "--timeout", "1")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert seconds < 30, f"took {seconds:.1f} s"
    assert "did not return within 1 s" in output and "stopped early" in output
    assert "Traceback" not in output


def test_hang_in_an_unrequested_dtype_does_not_block_the_requested_one(tmp_path):
    # a limit of 4 s: the float32 calls (a fresh worker's first backward among them) must not
    # pass it on a loaded machine; the bfloat16 warm-up is abandoned after a quarter of it
    proc, seconds = run_subprocess("check", target(tmp_path, "hangs_in_bfloat16"), "--layout", "half",
                                   *FP32, *FAST, "--timeout", "4")
    output = proc.stdout + proc.stderr
    assert seconds < 60, f"took {seconds:.1f} s"
    assert proc.returncode == 0, output


# --- reports ---------------------------------------------------------------------------

def test_json_report(tmp_path):
    path = tmp_path / "report.json"
    spec = target(tmp_path, "good")
    result = check(spec, "--layout", "half", *FP32, *FAST, "--json", str(path))
    assert result.exit_code == 0, result.output
    report = json.loads(path.read_text())
    assert report["target"] == spec
    assert report["verdict"] == "passed"
    assert len(report["results"]) == ROWS
    assert report["schema_version"] == 2 and report["exit_status"] == 0
    for r in report["results"]:
        assert {"property", "dtype", "status", "max_error", "notes", "cause"} <= set(r)
        assert r["dtype"] == "float32" and r["status"] == "passed"
        if r["property"] != "position-range":  # a probe: no error to measure
            assert isinstance(r["max_error"], float) and r["max_error"] <= 1.0


def test_json_report_of_a_failing_target(tmp_path):
    path = tmp_path / "report.json"
    result = check(target(tmp_path, "sign_flipped"), "--layout", "half", *FP32, *FAST,
                   "--json", str(path))
    assert result.exit_code == 1, result.output
    report = json.loads(path.read_text())
    assert report["verdict"] == "failed"
    statuses = {r["property"]: r["status"] for r in report["results"]}
    assert statuses["reference"] == "failed"
    assert next(r for r in report["results"] if r["property"] == "reference")["max_error"] > 1


def test_junit_report_of_a_failing_target(tmp_path):
    path = tmp_path / "report.xml"
    result = check(target(tmp_path, "sign_flipped"), "--layout", "half", *FP32, *FAST,
                   "--junit", str(path))
    assert result.exit_code == 1, result.output
    suite = ET.parse(path).getroot()
    cases = suite.findall(".//testcase")
    assert len(cases) == ROWS
    failed = {case.get("name") for case in cases if case.find("failure") is not None}
    assert "reference[float32]" in failed
    assert int(suite.get("failures")) == len(failed)


def test_junit_report_of_a_passing_target(tmp_path):
    path = tmp_path / "report.xml"
    result = check(*FP32, *FAST, "--junit", str(path))
    assert result.exit_code == 0, result.output
    suite = ET.parse(path).getroot()
    assert len(suite.findall(".//testcase")) == ROWS
    assert suite.findall(".//failure") == [] and suite.findall(".//error") == []


# --- check --help and --call -------------------------------------------------------------

HELP_GROUPS = {
    "Target": ("TARGET", "--call", "--api", "--cp-size", "--in-process", "--max-position", "--device", "--no-backward", "--inplace"),
    "Convention": ("--layout", "--base", "--rotary-dim", "--scaling", "--rotated-fraction", "--hf-config", "--layer-type"),
    "Family": ("--family", "--axes", "--sections", "--mrope-interleaved", "--split", "--nd-base", "--head-dim", "--pair-span", "--pair-table",
               "--positions", "--coord-range", "--coord-scale", "--coord-offset", "--scale-base", "--gamma"),
    "Run": ("--profile", "--sizes", "--seed", "--dtype", "--mode", "--property", "--max-examples", "--timeout", "--sanitize", "--opcheck", "--jobs",
            "--strict-layouts", "--known-failures", "--no-known-failures"),
    "Output": ("--json", "--junit", "--debug"),
    "Baseline": ("--baseline", "--regression-factor", "--update-baseline"),
}


def help_sections(text: str) -> dict:
    """{heading's first word: the flags (and TARGET) at the start of its rows}."""
    sections, current = {}, None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = sections.setdefault(line.split()[0].rstrip(":"), [])
        elif current is not None and line.startswith("  ") and line[2:3] not in ("", " "):
            current.append(line.split()[0].rstrip(","))
    return sections


def test_check_help_groups_the_options_by_what_they_configure():
    result = run_cli("check", "--help")
    assert result.exit_code == 0, result.output
    sections = help_sections(result.output)
    assert list(sections) == [*HELP_GROUPS, "Other"], result.output
    for title, flags in HELP_GROUPS.items():
        assert sections[title] == list(flags), (title, result.output)
    assert sections["Other"] == ["-h"]  # -h, --help
    # every option of the command is in exactly one group
    command = main.commands["check"]
    declared = {opt for p in command.params for opt in p.opts if opt.startswith("--")}
    assert declared == {f for flags in HELP_GROUPS.values() for f in flags if f != "TARGET"}


@pytest.mark.parametrize("form", ["x", "qk", "packed", None])
def test_call_is_parsed_and_stored(form):
    words = ["--call", form] if form else []
    ctx = main.commands["check"].make_context("check", [*words, "--layout", "half"])
    assert ctx.params["call"] == form
    assert ctx.params["layout"] == "half"


def test_unknown_call_form_is_a_usage_error():
    result = check("--call", "pair", *FP32, *FAST)
    assert result.exit_code == 2
    assert "--call" in result.output


def test_call_does_not_change_a_run_yet():
    result = check("--call", "x", "--property", "identity", *FP32, *FAST)
    assert result.exit_code == 0, result.output
    assert "PASSED" in result.output


# --- list ------------------------------------------------------------------------------

def test_list_names_the_builtins():
    result = run_cli("list")
    assert result.exit_code == 0, result.output
    for name in ("rotate-half", "llama-complex", "matrix", "cached"):
        assert name in result.output


# --- other ways to name a target -----------------------------------------------------

def test_module_attribute_targets():
    assert check("tests.mutants:rope", "--layout", "half", *FP32, *FAST).exit_code == 0
    failed = check("tests.mutants:sign_flipped", "--layout", "half", *FP32, *FAST)
    assert failed.exit_code == 1 and "reference" in failed.output


def test_module_that_cannot_be_imported():
    result = check("no_such_package.kernels:rope", *FP32, *FAST)
    assert result.exit_code == 2
    assert "ModuleNotFoundError" in result.output


def test_target_object_declares_its_own_convention(tmp_path):
    path = tmp_path / "declared.py"
    path.write_text(CORRECT + textwrap.dedent('''
        from ropecheck.targets.target import Convention, Target
        rope = Target("declared", correct_rope, Convention("half", 10000.0), backward=False)
    '''))
    result = check(f"{path}:rope", *FP32, *FAST)
    assert result.exit_code == 0, result.output
    assert "Convention: --layout half" in result.output
    assert re.search(r"backward\s.*skip", result.output), result.output
