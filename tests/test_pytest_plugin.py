"""The pytest front door: ``pytest --pyargs properties --rope-target T ...`` run in a
subprocess through pytester, the way a user runs it: from a directory outside the
project, finding ``properties`` through the installed package alone (no PYTHONPATH).

If every test here fails with "module or package not found: properties", the editable
install is stale: one made before properties/__init__.py existed maps ``properties`` to a
namespace package, which ``--pyargs`` cannot collect; ``pip install -e .`` again.
"""

from __future__ import annotations

import textwrap
import xml.etree.ElementTree as ET

import pytest

from properties.checks import PROPERTIES

pytest_plugins = ["pytester"]

# one test per property, and the position-range test before them
N_TESTS = len(PROPERTIES) + 1

BASE_ARGS = ("--pyargs", "properties", "--rope-dtype", "float32", "--rope-max-examples", "5",
             "--rope-profile", "ci", "-p", "no:cacheprovider")

SIGN_FLIPPED = textwrap.dedent('''
    import torch


    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


    def rope(x, positions):
        """A half-layout RoPE rotating by -m instead of +m."""
        r = x.shape[-1]
        theta = 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float32) / r)
        angles = positions.float()[..., None] * theta
        angles = torch.cat((angles, angles), dim=-1)[:, :, None, :]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        return x * cos - rotate_half(x) * sin
''')


def run(pytester, *args):
    return pytester.runpytest_subprocess(*BASE_ARGS, *args)


def test_builtin_target_passes_every_property(pytester):
    report = pytester.path / "report.xml"
    result = run(pytester, "--rope-target", "rotate-half", f"--junitxml={report}")
    result.assert_outcomes(passed=N_TESTS)
    assert result.ret == pytest.ExitCode.OK
    root = ET.parse(report).getroot()
    assert len(root.findall(".//testcase")) == N_TESTS
    assert root.findall(".//failure") == [] and root.findall(".//error") == []


def test_sign_flipped_file_target_fails_reference(pytester):
    pytester.makepyfile(flipped=SIGN_FLIPPED)
    report = pytester.path / "report.xml"
    result = run(pytester, "--rope-target", "flipped.py:rope", "--rope-layout", "half",
                 f"--junitxml={report}")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, outcomes
    assert outcomes.get("failed", 0) + outcomes.get("passed", 0) == N_TESTS, outcomes
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "FAILED test_properties.py::test_property[float32-reference]" in out
    assert "minimal counterexample:" in out and "reproduce:" in out
    # --junitxml: one testcase per test, a failure element on the failing ones
    root = ET.parse(report).getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == N_TESTS
    failed = {case.get("name") for case in cases if case.find("failure") is not None}
    assert "test_property[float32-reference]" in failed
    assert len(failed) == outcomes["failed"]


def test_keyword_selects_one_property(pytester):
    result = run(pytester, "--rope-target", "rotate-half", "-k", "identity", "-v")
    result.assert_outcomes(passed=1, deselected=N_TESTS - 1)
    result.stdout.fnmatch_lines(["*test_property?float32-identity? PASSED*"])


def test_target_without_convention_skips_reference_checks(pytester):
    pytester.makepyfile(flipped=SIGN_FLIPPED)
    result = run(pytester, "--rope-target", "flipped.py:rope")
    # a rotation by -m is a valid RoPE: without --rope-layout only the reference check,
    # which needs a convention, could tell; it is skipped
    result.assert_outcomes(passed=N_TESTS - 1, skipped=1)


def test_reproduce_hint_names_the_target(pytester):
    pytester.makepyfile(flipped=SIGN_FLIPPED)
    result = run(pytester, "--rope-target", "flipped.py:rope", "--rope-layout", "half",
                 "-k", "reference")
    hints = [line for line in result.stdout.lines if line.startswith("reproduce:")]
    assert hints
    assert all("--rope-target flipped.py:rope" in h and "--rope-layout half" in h for h in hints), hints


def test_rope_call_reaches_the_engine(pytester):
    """--rope-call qk checks a kernel in its (q, k) signature; a rope(x, positions) target
    asked for it is a clean usage error."""
    pytester.makeconftest('''
        def pytest_report_header(config):
            return [f"rope_call={config.getoption('rope_call')!r}"]
    ''')
    pytester.makepyfile(qk_kernel='''
        from ropecheck.builtins import make_rotate_half
        _rope = make_rotate_half()
        def rope(q, k, positions):
            return _rope(q, positions), _rope(k, positions)
    ''')
    result = run(pytester, "--rope-target", "qk_kernel.py:rope", "--rope-call", "qk",
                 "--rope-layout", "half", "-k", "reference")
    result.assert_outcomes(passed=1, deselected=N_TESTS - 1)
    result.stdout.fnmatch_lines(["rope_call='qk'"])
    result = run(pytester, "--rope-target", "rotate-half", "--rope-call", "qk", "-k", "identity")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "rope(q, k, positions)" in result.stdout.str() + result.stderr.str()
    result = run(pytester, "--rope-target", "rotate-half", "-k", "identity")
    result.stdout.fnmatch_lines(["rope_call=None"])


def test_unknown_rope_call_is_a_usage_error(pytester):
    result = run(pytester, "--rope-target", "rotate-half", "--rope-call", "pair")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--rope-call" in result.stderr.str()


def test_unloadable_target_is_a_clean_usage_error(pytester):
    result = run(pytester, "--rope-target", "missing.py:rope")
    out = result.stdout.str() + result.stderr.str()
    assert "cannot load target" in out and "no such file" in out
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert "_pytest" not in out and "pluggy" not in out, out
