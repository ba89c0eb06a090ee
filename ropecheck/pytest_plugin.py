"""pytest front door: ``pytest --pyargs ropecheck.properties --rope-target TARGET ...``.

The same engine as ``ropecheck check``: the option table (each option a flag ``--rope-*``
and an ini option ``rope_*``, the flag overriding the ini value), the one preparation path
(``ropecheck.session.prepare``), every family and call form, known failures (a known
failure is an xfail) and root causes (grouped in the terminal summary). pytest supplies
JUnit (--junitxml), -k, -x and xdist.
"""

from __future__ import annotations

import importlib.util
from fnmatch import fnmatch
from pathlib import Path

import pytest

from ropecheck.bench import pytest_items as bench_plugin
from ropecheck.calling import spawn
from ropecheck.properties.property import RANGE_PROBE
from ropecheck.properties.runner import Result
from ropecheck.report import gate
from ropecheck.session import helper, opcheck_row
from ropecheck.session import options as table
from ropecheck.session.options import Options, UsageError, parse
from ropecheck.session.prepare import prepare, run_seed
from ropecheck.session.session import Session, column_label, group_causes
from ropecheck.session.spec import UnusableTarget

# OS threads when the plugin was imported (torch imported, nothing run: pytest loads its
# plugins before any conftest): the workers fork from a zygote while no more are running
THREADS_AT_IMPORT = spawn.threads()
ENGINE_PACKAGES = ("properties", "reference")  # installed as ropecheck.properties, ropecheck.reference
CHECK_OPTIONS = [o for o in table.for_command("check") if o.pytest]
# with --rope-bench: the bench's own options too (its target options are check's)
BENCH_OPTIONS = [o for o in table.for_command("bench") if o.pytest and o not in CHECK_OPTIONS]
PYTEST_OPTIONS = CHECK_OPTIONS + table.for_command("pytest") + BENCH_OPTIONS


def pytest_addoption(parser):
    group = parser.getgroup(
        "ropecheck",
        "RoPE property checks (ropecheck); each flag is also an ini option (rope_target = ...), the flag overriding it",
    )
    for option in PYTEST_OPTIONS:
        if option.kind == table.SWITCH:
            group.addoption(option.pytest_flag, action="store_true", default=None, dest=option.ini, help=option.help)
        elif option.flag_value is not None:  # --rope-sanitize alone, or --rope-sanitize TOOL
            group.addoption(
                option.pytest_flag,
                nargs="?",
                const=option.flag_value,
                default=None,
                dest=option.ini,
                help=option.help,
                choices=option.choices,
            )
        elif option.kind == table.LIST and not option.joined:
            group.addoption(option.pytest_flag, action="append", default=None, dest=option.ini, help=option.help)
        else:
            group.addoption(
                option.pytest_flag,
                default=None,
                dest=option.ini,
                help=option.help,
                **({"choices": option.choices} if option.choices else {}),
            )
        parser.addini(
            option.ini,
            option.help,
            type="bool" if option.kind == table.SWITCH else "string",
            default=False if option.kind == table.SWITCH else "",
        )


def _raw(config) -> tuple[dict, dict]:
    """What the flags say, else the ini file (a file target, a baseline or a model config
    relative to the ini file); and which values came from the ini file."""
    raw, sources = {}, {}
    for option in PYTEST_OPTIONS:
        value = getattr(config.option, option.ini)
        if value is None:
            value = config.getini(option.ini)
            if value in ("", False):
                continue
            sources[option.name] = "ini"
            if option.name == "target":
                value = _relative_to_ini(config, str(value))
            elif (
                option.name in ("baseline", "hf_config")
                and config.inipath is not None
                and not Path(str(value)).is_absolute()
            ):
                value = str(config.inipath.parent / str(value))
        raw[option.name] = value
    return raw, sources


def _relative_to_ini(config, spec: str) -> str:
    """A file target in the ini file is relative to the ini file's folder (where pytest
    runs from need not be)."""
    where, colon, attr = spec.rpartition(":")
    if colon and config.inipath is not None and where.endswith(".py"):
        path = Path(where)
        if not path.is_absolute():
            return f"{config.inipath.parent / path}:{attr}"
    return spec


def options_of(config) -> Options:
    return config._ropecheck_options


def session_of(config) -> Session:
    """The check session, prepared once per pytest process (an xdist worker prepares its
    own, with the controller's seed); pytest.exit (usage error) when it cannot be."""
    if getattr(config, "_ropecheck_session", None) is None:
        spawn.fork_zygote_if_unthreaded(THREADS_AT_IMPORT, helper.LOADERS)
        try:
            config._ropecheck_session = prepare(
                options_of(config), seed=config._ropecheck_seed, pytest_args=list(config.invocation_params.args)
            )
        except (UnusableTarget, UsageError) as exc:
            pytest.exit(f"ropecheck: cannot load target: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        try:
            config._ropecheck_baseline = gate.baseline_for(config._ropecheck_baseline, config._ropecheck_session)
        except UsageError as exc:
            pytest.exit(f"ropecheck: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        config.add_cleanup(config._ropecheck_session.close)
    return config._ropecheck_session


def short_name(name: str) -> str:
    """A target's name for test ids: a file target without its folders (rope.py:rope)."""
    where, colon, attr = name.rpartition(":")
    return f"{Path(where).name}:{attr}" if colon and where.endswith(".py") else name


def pytest_generate_tests(metafunc):
    """test_position_range per dtype; test_property per dtype x property x mode, the
    target's family's properties; with --rope-opcheck, test_opcheck per dtype x mode; dtypes
    the target does not support are skipped cases;
    with --rope-bench, test_bench per shape x dtype (``bench_plugin``)."""
    if "rope_bench_row" in metafunc.fixturenames:
        bench_plugin.parametrize(metafunc)
        return
    if "rope_check" not in metafunc.fixturenames:
        return
    session = session_of(metafunc.config)
    name = short_name(session.target.name)
    dtypes = list(session.dtypes) + list(session.unsupported)
    if metafunc.function.__name__ == "test_position_range":
        checks = [(d, RANGE_PROBE, "eager") for d in dtypes] if session.range_probe else []
    elif metafunc.function.__name__ == "test_opcheck":  # after the properties: made of their calls
        checks = [(d, opcheck_row.NAME, m) for d in dtypes for m in session.modes] if session.opcheck else []
    else:
        checks = [(d, p.name, m) for d in dtypes for p in session.properties for m in session.modes]
    ids = [f"{name}-{d}-" + ("" if len(session.modes) == 1 else f"{m}-") + p for d, p, m in checks]
    if metafunc.function.__name__ == "test_position_range":
        ids = [f"{name}-{d}" for d, _, _ in checks]
    metafunc.parametrize("rope_check", checks, ids=ids)


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
    if options_of(config).target is not None and config.args_source != pytest.Config.ArgsSource.ARGS:
        folder = str(suite_path().parent)
        if folder not in config.args:
            config.args.append(folder)
        return True
    return False


def pytest_collect_file(file_path, parent):
    """The suite's module even where the project's python_files would not match its name."""
    if file_path == suite_path() and not any(
        fnmatch(file_path.name, pattern) for pattern in parent.config.getini("python_files")
    ):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_configure(config):
    """Settle the options (flag, else ini, else default) through the option table; fail
    fast, as a usage error, on a target that cannot be loaded, given on the command line or
    whose suite joins the run; pick a random seed unless one is given (ci is
    derandomized), so every run can be replayed (xdist's workers get the controller's)."""
    old = _old_spelling(config)
    if old is not None:
        raise pytest.UsageError(f"ropecheck: {old!r} is now 'ropecheck.{old}': pytest --pyargs ropecheck.{old} ...")
    try:
        raw, sources = _raw(config)
        checked = {o.name for o in CHECK_OPTIONS}
        options = config._ropecheck_options = parse(
            "check", {k: v for k, v in raw.items() if k in checked}, door="pytest", sources=sources
        )
        config._ropecheck_bench = bench_plugin.options(raw, sources) if raw.get("bench") else None
    except UsageError as exc:
        raise pytest.UsageError(f"ropecheck: {exc}") from None
    try:
        config._ropecheck_baseline = gate.baseline_of(options)
    except UsageError as exc:
        raise pytest.UsageError(f"ropecheck: {exc}") from None
    if "rope_seed" in getattr(config, "workerinput", {}):
        config._ropecheck_seed = config.workerinput["rope_seed"]  # an xdist worker: the controller's
    else:
        config._ropecheck_seed = run_seed(options.seed, options.profile)
    added = _add_suite(config)
    if (options.target is not None or added) and not hasattr(config, "workerinput"):
        session_of(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: every worker draws with the controller's seed."""
    node.workerinput["rope_seed"] = node.config._ropecheck_seed


def pytest_report_header(config):
    options = options_of(config)
    if options.target is not None or options.seed is not None:
        return [
            f"ropecheck: target {short_name(str(options.target))}, profile {options.profile}, "
            f"seed {config._ropecheck_seed}"
        ]
    return []


RESULT_KEY = "ropecheck_result"


PATHS_KEY = "ropecheck_interface_paths"


def pytest_runtest_logreport(report):
    """Collect each check's result (from this process or an xdist worker) for the summary."""
    for key, value in getattr(report, "user_properties", ()):
        if key == RESULT_KEY and report.when == "call":
            _CAUSES.append(value)
        if key == PATHS_KEY and report.when == "call":
            _PATHS.append(value)


_CAUSES: list = []
_PATHS: list = []  # the pairs of interface argument classes each check's calls covered


def _paths_line() -> str:
    """The checks' pairs of interface argument classes, together: the column that covered
    fewest, and the classes the run could not reach ("" without an interface)."""
    if not _PATHS:
        return ""
    covered: dict = {}
    for item in _PATHS:
        covered.setdefault(item["column"], set()).update(map(str, item["covered"]))
    total, unreached = _PATHS[0]["pairs"], _PATHS[0]["unreached"]
    column, fewest = min(covered.items(), key=lambda entry: len(entry[1]))
    where = "in every column" if len(fewest) == total else f"({column}, the column that called fewest)"
    line = f"interface paths: {len(fewest)}/{total} pairs of argument classes {where}"
    return line + (f"; not reached: {unreached}" if unreached else "")


def pytest_terminal_summary(terminalreporter):
    """Root causes: failures that share one, printed once with the checks it took down; the
    baseline compared with, and what of it could not be."""
    config = terminalreporter.config
    loaded = getattr(config, "_ropecheck_baseline", None)
    if loaded is not None:
        options = options_of(config)
        for line in gate.pytest_lines(loaded, options, config._ropecheck_seed):
            terminalreporter.write_line(line)
    results = []
    for item in _CAUSES:
        r = Result(
            item["property"],
            item["dtype"],
            "failed",
            "",
            message=item["message"],
            counterexample=item["counterexample"],
            reproduce=item["reproduce"],
            mode=item["mode"],
            shrunk=item["shrunk"],
        )
        r.signature = item["signature"]
        results.append(r)
    paths = _paths_line()
    if paths:
        terminalreporter.write_line(paths)
    for cause in group_causes(results):
        terminalreporter.write_line(
            f"ROOT CAUSE {cause['id']} took down {len(cause['properties'])} checks "
            f"({', '.join(cause['properties'])}) in {', '.join(cause['dtypes'])}: "
            f"{cause['message']}"
        )
        terminalreporter.write_line(f"  {cause['counterexample_label']}{cause['counterexample']}")
        terminalreporter.write_line(f"  reproduce: {cause['reproduce']}")


def loaded_source(loaded) -> str:
    """The baseline's file, as a failure names it."""
    return getattr(loaded, "source", None) or next(iter(loaded.values())).source


@pytest.fixture
def rope_bench(request):
    """Times one bench row (``rope_bench_row``: shape, dtype) into pytest-benchmark's
    ``benchmark`` fixture (``bench_plugin.run``)."""
    return lambda row, benchmark: bench_plugin.run(request.config, row, benchmark)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """Without --rope-bench, the suite's bench test is not collected (it has no rows); nor,
    without --rope-opcheck, its opcheck test."""
    if name == "test_bench" and getattr(collector.config, "_ropecheck_bench", None) is None:
        if Path(str(collector.path)) == suite_path():
            return []
    if name == "test_opcheck" and not options_of(collector.config).opcheck:
        if Path(str(collector.path)) == suite_path():
            return []
    return None


@pytest.fixture
def rope_run(request):
    """Runs one check of the session (``rope_check``: dtype, property or probe, mode) and
    reports it as pytest reports a test."""
    return lambda check: run_check(request, check)


def run_check(request, check: tuple) -> None:
    """One check, reported as pytest reports a test: passed, failed (with the failure
    text), skipped, or xfail for a known failure."""
    session = session_of(request.config)
    dtype, name, mode = check
    loaded = getattr(request.config, "_ropecheck_baseline", None)
    if dtype in session.unsupported:
        refused = gate.judge_one(session, loaded, name, dtype, mode) if loaded is not None else []
        if refused:
            pytest.fail(f"{dtype} not supported: {session.unsupported[dtype]}\n" + gate.regression_text(refused))
        pytest.skip(f"{dtype} not supported: {session.unsupported[dtype]}")
    result = session.run_one(name, dtype, mode)
    regressions = gate.judge_one(session, loaded, name, dtype, mode, result) if loaded is not None else []
    for note in result.notes:
        print(f"support note ({dtype}): {note}")
    if result.status == "failed" and result.signature:
        request.node.user_properties.append(
            (
                RESULT_KEY,
                {
                    "property": result.property,
                    "dtype": result.dtype,
                    "mode": result.mode,
                    "signature": result.signature,
                    "message": result.message,
                    "counterexample": result.counterexample,
                    "reproduce": result.reproduce,
                    "shrunk": result.shrunk,
                },
            )
        )
    interface = session.target.interface
    if result.paths and interface is not None and interface.space.factors:
        coverage = interface.space.coverage(dict(path) for path in result.paths)
        unreached = "; ".join(f"{f}={c} ({why})" for f, c, why in interface.space.unreached)
        column = column_label(result.dtype, result.mode)
        covered = [list(map(list, pair)) for pair in sorted(coverage.covered)]
        request.node.user_properties.append(
            (
                PATHS_KEY,
                {"column": column, "covered": covered, "pairs": len(interface.space.pairs), "unreached": unreached},
            )
        )
    if result.status == "skipped":
        pytest.skip(result.message)
    where = column_label(result.dtype, result.mode)
    if regressions and result.status in ("passed", "known"):  # a regression fails the test of that property
        pytest.fail(
            f"{result.property} ({where}) {result.status}, and regressed against the baseline {loaded_source(loaded)} "
            f"(--rope-regression-factor {options_of(request.config).regression_factor:g}):\n"
            + gate.regression_text(regressions),
            pytrace=False,
        )
    if result.status == "known":
        pytest.xfail(f"known failure: {result.message}")
    if result.status != "passed":
        lines = [
            f"{result.property} ({where}): {result.formula}",
            result.message,
            f"likely cause: {result.diagnosis}" if result.diagnosis else "",
            f"{result.counterexample_label()}{result.counterexample}",
            f"reproduce: {result.reproduce}",
        ]
        pytest.fail("\n".join(line for line in lines if line), pytrace=False)
