"""pytest front door: ``pytest --pyargs ropecheck.properties --rope-target TARGET ...``.

The same engine as ``ropecheck check``; pytest supplies JUnit (--junitxml), -k, -x and
xdist. Options mirror the CLI's flags with a ``--rope-`` prefix.
"""

from __future__ import annotations

import importlib.util
from fnmatch import fnmatch
from pathlib import Path
from typing import NamedTuple

import pytest

from ropecheck.properties.runner import DEFAULT_PROFILE, PROFILES, RunOptions, replay_pytest_command
from ropecheck.properties.sizes import parse as parse_sizes
from ropecheck.calling import DEFAULT_TIMEOUT
from ropecheck.session import (TargetSpec, UnusableTarget, callable_in, run_seed,
                               probe_position_range, resolve_dtypes, warm_up)
from ropecheck import modes
from ropecheck.call_forms import CALL_FORMS

ENGINE_PACKAGES = ("properties", "reference")  # installed as ropecheck.properties, ropecheck.reference


class RopeOption(NamedTuple):
    """One plugin option: the flag ``--rope-NAME`` and the ini option ``rope_NAME``
    (``[tool.pytest.ini_options]`` or pytest.ini), the flag overriding the ini value."""

    name: str  # the ini name; the flag is --rope-... with dashes
    help: str
    kind: type = str  # str, int, float, bool (a switch) or list (repeatable, comma-separated)
    choices: tuple = ()
    default: object = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def convert(self, text: str):
        """An ini value as the flag's type; a pytest.UsageError if it is not one."""
        if self.kind is list:
            return [word for word in text.replace(",", " ").split() if word]
        try:
            value = self.kind(text)
        except ValueError:
            raise pytest.UsageError(f"ropecheck: ini option {self.name} must be {self.kind.__name__}, "
                                    f"got {text!r}") from None
        if self.choices and value not in self.choices:
            raise pytest.UsageError(f"ropecheck: ini option {self.name} must be one of "
                                    f"{', '.join(self.choices)}, got {text!r}")
        return value


OPTIONS = (
    RopeOption("rope_target", "target: path/to/file.py:func, package.module:attr or a built-in name; "
               "set in the ini file, it adds the property suite to a plain `pytest` run"),
    RopeOption("rope_layout", "pairing layout", choices=("interleaved", "half")),
    RopeOption("rope_base", "frequency base (default 10000)", float),
    RopeOption("rope_rotary_dim", "rotated features (default: all of head_dim)", int),
    RopeOption("rope_scaling", "position scaling, as ropecheck check --scaling"),
    RopeOption("rope_dtype", "dtype to check; repeat or comma-separate (default: all)", list, default=[]),
    RopeOption("rope_no_backward", "the target has no backward: skip gradient checks", bool),
    RopeOption("rope_inplace", "the target writes its output into x and returns it", bool),
    RopeOption("rope_profile", f"example budget (default {DEFAULT_PROFILE})", choices=tuple(PROFILES),
               default=DEFAULT_PROFILE),
    RopeOption("rope_sizes", "input sizes: toy or production, then key=value overrides, as ropecheck check "
               "--sizes (default: the profile's)"),
    RopeOption("rope_seed", "hypothesis seed (default: random, shown in the header)", int),
    RopeOption("rope_max_examples", "override the profile's examples per check", int),
    RopeOption("rope_timeout", f"seconds one call of the target may take (default {DEFAULT_TIMEOUT:g})", float,
               default=DEFAULT_TIMEOUT),
    RopeOption("rope_max_position", "declared position range 0 .. N (default 2^24), as ropecheck check "
               "--max-position", int),
    RopeOption("rope_strict_layouts", "a refusal of an exotic memory layout fails instead of being a note", bool),
    RopeOption("rope_in_process", "call the target in pytest's process, not in a worker process", bool),
    RopeOption("rope_device", "where the inputs are made: cpu, cuda or cuda:N (default: cpu, or the "
               "target's own), as ropecheck check --device"),
    RopeOption("rope_mode", "how the target is run: eager, compile, autocast, autocast-fp16, cudagraph; "
               "repeat or comma-separate (default eager), as ropecheck check --mode", list),
    RopeOption("rope_call", "the target's call form, as ropecheck check --call (default: what the target "
               "declares, else x)", choices=tuple(CALL_FORMS)),
)


def pytest_addoption(parser):
    group = parser.getgroup("ropecheck", "RoPE property checks (ropecheck); each flag is also an ini "
                            "option (rope_target = ...), the flag overriding it")
    for option in OPTIONS:
        if option.kind is bool:
            group.addoption(option.flag, action="store_true", default=None, help=option.help)
        elif option.kind is list:
            group.addoption(option.flag, action="append", default=None, help=option.help)
        else:
            group.addoption(option.flag, type=option.kind, default=None, help=option.help,
                            **({"choices": option.choices} if option.choices else {}))
        parser.addini(option.name, option.help, type="bool" if option.kind is bool else "string",
                      default=False if option.kind is bool else "")


def _settle_options(config) -> None:
    """Each option's value: the flag's, else the ini file's, else the default (on
    ``config.option``, where the rest of the plugin reads it)."""
    for option in OPTIONS:
        if getattr(config.option, option.name) is not None:
            continue
        raw = config.getini(option.name)
        if option.kind is bool:
            value = bool(raw)
        elif raw not in ("", None):
            value = option.convert(str(raw))
            if option.name == "rope_target":
                value = _relative_to_ini(config, value)
        else:
            value = option.default
        setattr(config.option, option.name, value)


def _relative_to_ini(config, spec: str) -> str:
    """A file target in the ini file is relative to the ini file's folder (where pytest
    runs from need not be)."""
    where, colon, attr = spec.rpartition(":")
    if colon and config.inipath is not None and where.endswith(".py"):
        path = Path(where)
        if not path.is_absolute():
            return f"{config.inipath.parent / path}:{attr}"
    return spec


def _spec(config) -> TargetSpec:
    get = config.getoption
    return TargetSpec(get("--rope-target"), get("--rope-layout"), get("--rope-base"),
                      get("--rope-rotary-dim"), backward=not get("--rope-no-backward"),
                      inplace=get("--rope-inplace"), scaling=get("--rope-scaling"),
                      max_position=get("--rope-max-position"), in_process=get("--rope-in-process"),
                      call=get("--rope-call"), device=get("--rope-device"))


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
    # the target's name in every test's name, so JUnit records and -k can tell targets apart
    name = short_name(_spec(config).name)
    metafunc.parametrize("rope_dtype", dtypes, ids=[f"{name}-{dtype}" for dtype in dtypes])
    run_modes = config.getoption("--rope-mode")  # parsed in pytest_configure
    if "rope_mode" in metafunc.fixturenames and run_modes != ["eager"]:
        metafunc.parametrize("rope_mode", run_modes)


def short_name(name: str) -> str:
    """A target's name for test ids: a file target without its folders (rope.py:rope)."""
    where, colon, attr = name.rpartition(":")
    return f"{Path(where).name}:{attr}" if colon and where.endswith(".py") else name


def _old_spelling(config) -> str | None:
    """The suite's old top-level name, if the command line asks for it: ``--pyargs
    properties`` (or ``reference``) that finds nothing, or finds ropecheck's own folder."""
    if not config.option.pyargs:
        return None
    for arg in config.args:
        name = str(arg).split("::")[0]
        top = name.split(".")[0]
        if top not in ENGINE_PACKAGES:
            continue
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            found = None
        ours = importlib.util.find_spec(f"ropecheck.{top}")
        if found is None or (ours is not None and found.origin == ours.origin):
            return name
    return None


def suite_path() -> Path:
    """The property suite's test module, wherever ropecheck is installed."""
    from ropecheck import properties

    return Path(properties.__file__).with_name("test_properties.py")


def _add_suite(config) -> bool:
    """A run with a target and no paths on its command line (plain ``pytest`` in a project
    whose ini file sets rope_target) collects the property suite besides its own tests.
    Its folder is the collection root, so test ids and JUnit class names read
    ``test_properties.py::test_property[...]`` / ``test_properties``."""
    if config.option.rope_target and config.args_source != pytest.Config.ArgsSource.ARGS:
        folder = str(suite_path().parent)
        if folder not in config.args:
            config.args.append(folder)
        return True
    return False


def pytest_collect_file(file_path, parent):
    """The suite's module even where the project's python_files would not match its name."""
    if file_path == suite_path() and not any(fnmatch(file_path.name, pattern)
                                             for pattern in parent.config.getini("python_files")):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_configure(config):
    """Settle the options (flag, else ini, else default); fail fast, as a usage error, on a
    target that cannot be loaded, given on the command line or whose suite joins the run; pick a random seed unless one
    is given (ci is derandomized), so every run can be replayed (xdist's workers get the
    controller's options, its seed included)."""
    old = _old_spelling(config)
    if old is not None:
        raise pytest.UsageError(f"ropecheck: {old!r} is now 'ropecheck.{old}': "
                                f"pytest --pyargs ropecheck.{old} ...")
    from_command_line = config.option.rope_target is not None
    if config.option.rope_seed is None and "rope_seed" in getattr(config, "workerinput", {}):
        config.option.rope_seed = config.workerinput["rope_seed"]  # an xdist worker: the controller's
    _settle_options(config)
    position_range = config.getoption("--rope-max-position")
    if position_range is not None and not 255 <= position_range <= 2**24:
        raise pytest.UsageError(f"ropecheck: --rope-max-position must be in 255 .. 2^24, got {position_range}")
    try:
        run_modes = config.option.rope_mode = modes.parse(config.getoption("--rope-mode"))
        if config.getoption("--rope-sizes"):  # parsed once: the fixture's RunOptions takes the Sizes
            config.option.rope_sizes = parse_sizes(config.getoption("--rope-sizes"))
    except ValueError as exc:
        raise pytest.UsageError(f"ropecheck: {exc}") from None
    added = _add_suite(config)
    if (from_command_line or added) and not hasattr(config, "workerinput"):
        try:
            target = _target(config)
            modes.require(run_modes, target.device)
        except (UnusableTarget, ValueError) as exc:
            raise pytest.UsageError(f"ropecheck: cannot load target: {exc}") from None
    config.option.rope_seed = run_seed(config.option.rope_seed, config.option.rope_profile)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: every worker draws with the controller's seed."""
    node.workerinput["rope_seed"] = node.config.option.rope_seed


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
                      strict_layouts=get("--rope-strict-layouts"), sizes=get("--rope-sizes"))


@pytest.fixture(scope="session")
def rope_warm_up(request, rope_target, rope_options) -> dict:
    """Smoke calls in every dtype, lowest precision first, once per session."""
    dtypes, _ = resolve_dtypes(request.config.getoption("--rope-dtype"), rope_target)
    return warm_up(rope_target, dtypes, rope_options.timeout)


@pytest.fixture
def rope_mode() -> str:
    """How the target is run (``ropecheck.modes``): eager, unless --rope-mode parametrizes it."""
    return "eager"


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
