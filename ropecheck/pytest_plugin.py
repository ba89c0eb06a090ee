"""pytest front door: ``pytest --pyargs properties --rope-target TARGET ...``.

The same engine as ``ropecheck check``; pytest supplies JUnit (--junitxml), -k, -x and
xdist. Options mirror the CLI's flags with a ``--rope-`` prefix.
"""

from __future__ import annotations

import pytest

from properties.runner import DEFAULT_PROFILE, PROFILES, RunOptions, replay_pytest_command
from ropecheck.calling import DEFAULT_TIMEOUT
from ropecheck.session import (TargetSpec, UnusableTarget, callable_in, default_seed,
                               probe_position_range, resolve_dtypes, warm_up)
from ropecheck.call_forms import CALL_FORMS


def pytest_addoption(parser):
    group = parser.getgroup("ropecheck", "RoPE property checks (ropecheck)")
    group.addoption("--rope-target", default=None,
                    help="target: path/to/file.py:func, package.module:attr or a built-in name")
    group.addoption("--rope-layout", choices=("interleaved", "half"), default=None)
    group.addoption("--rope-base", type=float, default=None)
    group.addoption("--rope-rotary-dim", type=int, default=None)
    group.addoption("--rope-scaling", default=None,
                    help="position scaling, as ropecheck check --scaling")
    group.addoption("--rope-dtype", action="append", default=[],
                    help="dtype to check; repeat or comma-separate (default: all)")
    group.addoption("--rope-no-backward", action="store_true")
    group.addoption("--rope-inplace", action="store_true")
    group.addoption("--rope-profile", choices=tuple(PROFILES), default=DEFAULT_PROFILE)
    group.addoption("--rope-seed", type=int, default=None)
    group.addoption("--rope-max-examples", type=int, default=None)
    group.addoption("--rope-timeout", type=float, default=DEFAULT_TIMEOUT)
    group.addoption("--rope-max-position", type=int, default=None,
                    help="declared position range 0 .. N (default 2^24), as ropecheck check --max-position")
    group.addoption("--rope-strict-layouts", action="store_true",
                    help="a refusal of an exotic memory layout fails instead of being a note")
    group.addoption("--rope-in-process", action="store_true",
                    help="call the target in pytest's process, not in a worker process")
    group.addoption("--rope-call", choices=tuple(CALL_FORMS), default=None,
                    help="the target's call form, as ropecheck check --call (default: what the "
                         "target declares, else x)")


def _spec(config) -> TargetSpec:
    get = config.getoption
    return TargetSpec(get("--rope-target"), get("--rope-layout"), get("--rope-base"),
                      get("--rope-rotary-dim"), backward=not get("--rope-no-backward"),
                      inplace=get("--rope-inplace"), scaling=get("--rope-scaling"),
                      max_position=get("--rope-max-position"), in_process=get("--rope-in-process"),
                      call=get("--rope-call"))


def _target(config):
    """The target, built once per pytest session (in its worker process, unless
    --rope-in-process); raises UnusableTarget."""
    if getattr(config, "_ropecheck_target", None) is None:
        config._ropecheck_target = _spec(config).build()
        config.add_cleanup(config._ropecheck_target.executor_close)
    return config._ropecheck_target


def pytest_generate_tests(metafunc):
    if "rope_dtype" not in metafunc.fixturenames:
        return
    config = metafunc.config
    try:
        target = _target(config)
        dtypes, _ = resolve_dtypes(config.getoption("--rope-dtype"), target)
    except (UnusableTarget, ValueError) as exc:
        pytest.exit(f"ropecheck: cannot load target: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
    metafunc.parametrize("rope_dtype", dtypes)


def pytest_configure(config):
    """Fail fast, as a usage error, on a target that cannot be loaded; and pick a random
    seed unless one is given (ci is derandomized), so every run can be replayed."""
    position_range = config.getoption("--rope-max-position")
    if position_range is not None and not 255 <= position_range <= 2**24:
        raise pytest.UsageError(f"ropecheck: --rope-max-position must be in 255 .. 2^24, got {position_range}")
    if config.getoption("--rope-target"):
        try:
            _target(config)
        except UnusableTarget as exc:
            raise pytest.UsageError(f"ropecheck: cannot load target: {exc}") from None
    if config.getoption("--rope-seed") is None and config.getoption("--rope-profile") != "ci":
        config.option.rope_seed = default_seed()


def pytest_report_header(config):
    if config.getoption("--rope-target") or config.getoption("--rope-seed") is not None:
        return [f"ropecheck: target {_spec(config).name}, profile {config.getoption('--rope-profile')}, "
                f"seed {config.getoption('--rope-seed')}"]
    return []


@pytest.fixture(scope="session")
def rope_target(request):
    try:
        return _target(request.config)
    except UnusableTarget as exc:
        pytest.exit(f"ropecheck: cannot load target: {exc}", returncode=2)


@pytest.fixture(scope="session")
def rope_options(request) -> RunOptions:
    get = request.config.getoption
    return RunOptions(profile=get("--rope-profile"), seed=get("--rope-seed"),
                      timeout=get("--rope-timeout"), max_examples=get("--rope-max-examples"),
                      strict_layouts=get("--rope-strict-layouts"))


@pytest.fixture(scope="session")
def rope_warm_up(request, rope_target, rope_options) -> dict:
    """Smoke calls in every dtype, lowest precision first, once per session."""
    dtypes, _ = resolve_dtypes(request.config.getoption("--rope-dtype"), rope_target)
    return warm_up(rope_target, dtypes, rope_options.timeout)


@pytest.fixture
def rope_callable(rope_target, rope_dtype, rope_warm_up):
    """The target, once it has been shown callable in this dtype."""
    problem = rope_warm_up.get(rope_dtype)
    if problem is not None:
        pytest.fail(f"target cannot be called: {problem}", pytrace=False)
    return callable_in(rope_target, rope_warm_up)


_ranges: dict = {}


@pytest.fixture
def rope_range(rope_callable, rope_dtype, rope_options, request):
    """(the position-range finding, the target restricted to the positions it accepts),
    probed once per dtype."""
    if rope_dtype not in _ranges:
        _ranges[rope_dtype] = probe_position_range(
            rope_callable, rope_dtype, rope_options,
            replay_pytest_command(request.config, "position-range", rope_dtype))
    return _ranges[rope_dtype]
