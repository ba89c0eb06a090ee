"""The pytest front door: ``pytest --pyargs ropecheck.properties --rope-target T ...`` run
in a subprocess through pytester, the way a user runs it: from a directory outside the
project, finding ``ropecheck.properties`` through the installed package alone (no
PYTHONPATH).

If every test here fails with "module or package not found: ropecheck.properties", the
editable install is stale (made before properties/ installed as ropecheck.properties):
``pip install -e .`` again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ropecheck.calling.worker import cores
from ropecheck.properties.checks import PROPERTIES

pytest_plugins = ["pytester"]

# one test per property, and the position-range test before them
# the properties of library interfaces with a table (--api) are not offered to the targets here
TABLE = sum(prop.needs_table for prop in PROPERTIES.values())
ALL = len(PROPERTIES) + 1 - TABLE  # the tests collected
N_TESTS = ALL  # the tests that run

BASE_ARGS = ("--pyargs", "ropecheck.properties", "--rope-dtype", "float32", "--rope-max-examples", "5",
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


def runpytest_in(path: Path, *args: str) -> pytest.RunResult:
    """pytester.runpytest_subprocess's run, from a folder a module-scoped fixture made (a
    pytester folder is one test's): pytest in a fresh interpreter run from ``path``, that
    folder first on PYTHONPATH, HOME there, no PYTEST_ADDOPTS, no colours. For the runs
    whose output several tests read (each run is an interpreter importing torch: 4 s here,
    10 to 14 s under CI's load)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "TOX_ENV_DIR")}
    env.update(HOME=str(path), USERPROFILE=str(path), PY_COLORS="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH", "")])))
    start = time.time()
    done = subprocess.run([sys.executable, "-mpytest", f"--basetemp={path / 'basetemp'}", *args], cwd=path, env=env,
                          capture_output=True, text=True, timeout=600)
    return pytest.RunResult(done.returncode, done.stdout.splitlines(), done.stderr.splitlines(), time.time() - start)


@pytest.fixture(scope="module")
def flipped_run(tmp_path_factory):
    """The whole suite on the sign-flipped kernel declared half, with --junitxml: its
    failing reference test, the JUnit record and the reproduce lines (two tests read it)."""
    path = tmp_path_factory.mktemp("flipped")
    (path / "flipped.py").write_text(SIGN_FLIPPED)
    result = runpytest_in(path, *BASE_ARGS, "--rope-target", "flipped.py:rope", "--rope-layout", "half",
                          f"--junitxml={path / 'report.xml'}")
    return result, path / "report.xml"


HEADER = """
def pytest_report_header(config):
    return [f"rope_call={config.getoption('rope_call')!r}"]
"""


@pytest.fixture(scope="module")
def identity_run(tmp_path_factory):
    """The built-in target's identity test alone (-k identity -v), with a conftest printing
    --rope-call's value in the header (two tests read it)."""
    path = tmp_path_factory.mktemp("identity")
    (path / "conftest.py").write_text(HEADER)
    return runpytest_in(path, *BASE_ARGS, "--rope-target", "rotate-half", "-k", "identity", "-v")


def test_builtin_target_passes_every_property(pytester):
    report = pytester.path / "report.xml"
    result = run(pytester, "--rope-target", "rotate-half", f"--junitxml={report}")
    result.assert_outcomes(passed=N_TESTS)
    assert result.ret == pytest.ExitCode.OK
    root = ET.parse(report).getroot()
    assert len(root.findall(".//testcase")) == ALL
    assert root.findall(".//failure") == [] and root.findall(".//error") == []


def test_sign_flipped_file_target_fails_reference(flipped_run):
    result, report = flipped_run
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, outcomes
    assert outcomes.get("failed", 0) + outcomes.get("passed", 0) == N_TESTS, outcomes
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "FAILED test_properties.py::test_property[flipped.py:rope-float32-reference]" in out
    assert "minimal counterexample:" in out and "reproduce:" in out
    # --junitxml: one testcase per test, a failure element on the failing ones
    root = ET.parse(report).getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == ALL
    failed = {case.get("name") for case in cases if case.find("failure") is not None}
    assert "test_property[flipped.py:rope-float32-reference]" in failed
    assert len(failed) == outcomes["failed"]


def test_keyword_selects_one_property(identity_run):
    result = identity_run
    result.assert_outcomes(passed=1, deselected=ALL - 1)
    result.stdout.fnmatch_lines(["*test_property?rotate-half-float32-identity? PASSED*"])


def test_target_without_convention_skips_reference_checks(pytester):
    pytester.makepyfile(flipped=SIGN_FLIPPED)
    result = run(pytester, "--rope-target", "flipped.py:rope")
    # a rotation by -m is a valid RoPE: without --rope-layout only the reference check,
    # which needs a convention, could tell; it is skipped
    result.assert_outcomes(passed=N_TESTS - 1, skipped=1)


def test_reproduce_hint_names_the_target(flipped_run):
    result, _ = flipped_run  # the whole suite's run: its reference test fails
    hints = [line for line in result.stdout.lines if line.startswith("reproduce:")]
    assert hints
    assert all("--rope-target flipped.py:rope" in h and "--rope-layout half" in h for h in hints), hints


ORIGIN = """
import os
with open("worker_origin.txt", "a") as _log:  # the process the target is loaded in, and its parent
    _log.write(f"{os.getpid()} {os.getppid()}\\n")
"""
RECORD_PID = """
import os
def pytest_configure(config):
    with open("pytest_pid.txt", "w") as log:
        log.write(str(os.getpid()))
"""


def test_the_target_s_worker_is_forked_unless_torch_ran_before_the_suite(pytester):
    """The worker forks from a zygote of the pytest process (no second interpreter importing
    torch); a conftest that ran torch (OpenMP's pool started) leaves it a fresh interpreter,
    which a fork past that pool would not be (it would deadlock)."""
    pytester.makepyfile(origin=SIGN_FLIPPED + ORIGIN)

    def parents(conftest: str) -> tuple:
        pytester.makeconftest(conftest)
        (pytester.path / "worker_origin.txt").unlink(missing_ok=True)
        result = run(pytester, "--rope-target", "origin.py:rope", "--rope-layout", "half", "-k", "identity")
        result.assert_outcomes(passed=1, deselected=ALL - 1)
        pytest_pid = int((pytester.path / "pytest_pid.txt").read_text())
        lines = (pytester.path / "worker_origin.txt").read_text().split("\n")
        workers = [tuple(map(int, line.split())) for line in lines if line]
        assert workers and all(pid != pytest_pid for pid, _ in workers), (pytest_pid, workers)
        return pytest_pid, {parent for _, parent in workers}

    pytest_pid, forked = parents(RECORD_PID)
    assert pytest_pid not in forked  # the zygote's child
    pytest_pid, fresh = parents(RECORD_PID + "import torch\ntorch.ones(10**6).exp()\n")
    if cores() > 1:  # one core: torch's pool starts no thread
        assert fresh == {pytest_pid}


def test_rope_call_reaches_the_engine(pytester, identity_run):
    """--rope-call qk checks a kernel in its (q, k) signature; a rope(x, positions) target
    asked for it is a clean usage error."""
    pytester.makeconftest(HEADER)
    pytester.makepyfile(qk_kernel='''
        from ropecheck.targets.builtins import make_rotate_half
        _rope = make_rotate_half()
        def rope(q, k, positions):
            return _rope(q, positions), _rope(k, positions)
    ''')
    result = run(pytester, "--rope-target", "qk_kernel.py:rope", "--rope-call", "qk",
                 "--rope-layout", "half", "-k", "reference")
    result.assert_outcomes(passed=1, deselected=ALL - 1)
    result.stdout.fnmatch_lines(["rope_call='qk'"])
    result = run(pytester, "--rope-target", "rotate-half", "--rope-call", "qk", "-k", "identity")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "rope(q, k, positions)" in result.stdout.str() + result.stderr.str()
    identity_run.stdout.fnmatch_lines(["rope_call=None"])  # not given: None (the same header, another run)


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


# --- in a project's own pytest run: ini options, no adapter file ---------------------------

PROJECT_TEST = '''
def test_the_projects_own_test():
    assert True
'''


def project(pytester, *ini_lines: str):
    """A kernel project: its kernel, its own test, and ropecheck set up in pyproject.toml."""
    pytester.makepyfile(flipped=SIGN_FLIPPED, test_own=PROJECT_TEST)
    pytester.makefile(".toml", pyproject="\n".join(["[tool.pytest.ini_options]", *ini_lines]))


SET_UP = ('rope_target = "flipped.py:rope"', 'rope_dtype = "float32"', 'rope_max_examples = "5"',
          'rope_profile = "ci"')


@pytest.fixture(scope="module")
def ini_project(tmp_path_factory):
    """A kernel project with rope_target and rope_layout = "interleaved" in its ini file, and
    its plain `pytest` run with --junitxml (two tests read it)."""
    path = tmp_path_factory.mktemp("project")
    (path / "flipped.py").write_text(SIGN_FLIPPED)
    (path / "test_own.py").write_text(PROJECT_TEST)
    (path / "pyproject.toml").write_text("\n".join(["[tool.pytest.ini_options]", *SET_UP, 'rope_layout = "interleaved"']))
    return path, runpytest_in(path, "-p", "no:cacheprovider", f"--junitxml={path / 'report.xml'}")


def test_ini_options_add_the_suite_to_a_plain_pytest_run(ini_project):
    """rope_target in the ini file puts the suite into `pytest`; the flags override it."""
    path, result = ini_project
    # the project's own test, and the suite: rotation by -m in the half layout is not the
    # interleaved reference
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] + outcomes["failed"] == N_TESTS + 1, outcomes
    result.stdout.fnmatch_lines(["*test_own.py .*", "*FAILED*test_property?flipped.py:rope-float32-reference?*"])
    # -k, and a flag overriding the ini value (--rope-layout half: still wrong, by its sign)
    result = runpytest_in(path, "-p", "no:cacheprovider", "-k", "reference", "--rope-layout", "half")
    result.assert_outcomes(failed=1, deselected=ALL)
    assert "the target rotates clockwise" in result.stdout.str()
    # -x stops at the first failure
    result = runpytest_in(path, "-p", "no:cacheprovider", "-x")
    assert result.parseoutcomes()["failed"] == 1
    # paths on the command line: only those run
    result = runpytest_in(path, "-p", "no:cacheprovider", "test_own.py")
    result.assert_outcomes(passed=1)


def test_the_suite_joins_whatever_the_projects_python_files(pytester):
    project(pytester, *SET_UP, 'rope_layout = "half"', 'python_files = ["check_*.py"]')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "reference")
    result.assert_outcomes(failed=1, deselected=ALL - 1)  # test_own.py is not collected


def test_junit_names_carry_the_target(ini_project):
    # the names of the three kinds of test, in the JUnit record of the ini test's whole run
    cases = list(ET.parse(ini_project[0] / "report.xml").getroot().iter("testcase"))
    names = {case.get("name") for case in cases}
    assert {case.get("classname") for case in cases} == {"test_own", "test_properties"}
    assert "test_the_projects_own_test" in names
    assert "test_position_range[flipped.py:rope-float32]" in names
    assert "test_property[flipped.py:rope-float32-reference]" in names


def test_a_bad_ini_value_is_a_usage_error(pytester):
    project(pytester, *SET_UP, 'rope_layout = "diagonal"')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "rope_layout must be one of interleaved, half" in result.stderr.str()


def test_rope_sizes_reach_the_run_and_a_bad_one_is_a_usage_error(pytester):
    project(pytester, *SET_UP, 'rope_layout = "half"', 'rope_sizes = "production,head_dims=192,max_seq=64"')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "test_property and reference")
    assert result.parseoutcomes()["failed"] == 1  # the sign-flipped kernel, at head size 192
    assert ", 192) float32" in result.stdout.str()
    project(pytester, *SET_UP, 'rope_sizes = "huge"')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "unknown size set 'huge'" in result.stderr.str()


def test_the_old_package_name_gets_a_one_line_hint(pytester):
    result = pytester.runpytest_subprocess("--pyargs", "properties", "--rope-target", "rotate-half")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert errors == ["ERROR: ropecheck: 'properties' is now 'ropecheck.properties': "
                      "pytest --pyargs ropecheck.properties ..."], errors


def test_xdist_gives_the_same_verdicts(pytester):
    """-n 2 without a seed: the controller picks one (dev draws at random) and every
    worker draws with it (their reproduce lines name it); one process given that seed runs
    the same tests with the same outcomes."""
    pytest.importorskip("xdist")
    pytester.makepyfile(flipped=SIGN_FLIPPED)

    def verdicts(*extra):
        report = pytester.path / "report.xml"
        result = run(pytester, "--rope-target", "flipped.py:rope", "--rope-layout", "half",
                     "--rope-profile", "dev", f"--junitxml={report}", *extra)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        cases = ET.parse(report).getroot().iter("testcase")
        return result, {case.get("name"): [child.tag for child in case if child.tag in ("failure", "skipped")]
                        for case in cases}

    shared, in_workers = verdicts("-n", "2")
    header = re.search(r"ropecheck: target flipped.py:rope, profile dev, seed (\d+)", shared.stdout.str())
    assert header, shared.stdout.str()
    assert set(re.findall(r"--rope-seed=(\d+)", shared.stdout.str())) == {header.group(1)}
    _, alone = verdicts("--rope-seed", header.group(1))
    assert len(alone) == ALL and alone == in_workers


def test_rope_mode_parametrizes_the_suite(pytester):
    """--rope-mode eager,autocast: each test once per mode, the mode in its name; a kernel whose
    angles come from a matmul fails under autocast only."""
    pytester.makepyfile(kernel=(Path(__file__).with_name("mode_kernels.py")).read_text())
    result = run(pytester, "--rope-target", "kernel.py:matmul_angles", "--rope-layout", "half",
                 "--rope-mode", "eager,autocast", "-k", "reference")
    result.assert_outcomes(passed=1, failed=1, deselected=2 * (ALL - 1) - 1)
    result.stdout.fnmatch_lines(["FAILED *test_property?kernel.py:matmul_angles-float32-autocast-reference?*"])


HF_KERNEL = '''
import torch


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
'''


def test_a_run_through_an_interface_says_which_pairs_of_its_argument_classes_it_called(pytester):
    pytester.makepyfile(hfkernel=HF_KERNEL)
    pytester.makefile(".toml", pyproject="\n".join([
        "[tool.pytest.ini_options]", 'rope_target = "hfkernel.py:rope"', 'rope_api = "hf"', 'rope_layout = "half"',
        'rope_dtype = "float32"', 'rope_profile = "ci"']))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "reference")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.re_match_lines([r"interface paths: (\d+)/\1 pairs of argument classes in every column"])
