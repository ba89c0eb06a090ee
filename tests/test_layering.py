"""Layering: the engine (``properties``, ``reference`` and ropecheck's core modules) never
imports a front door (the CLI, the pytest plugin, the conformance report, identify).

The front doors sit on the engine; an import the other way would make the engine depend
on how it is driven, and the two front doors could drift apart. Checked on the source with
``ast``, so that an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FRONT_DOORS = ("ropecheck.cli", "ropecheck.pytest_plugin", "ropecheck.report", "ropecheck.identification")

# ropecheck's modules that are front doors or serve only them (matched against the file's
# path below ropecheck/, with fnmatch-style patterns); everything else in ropecheck/ is core
FRONT_DOOR_FILES = ("cli.py", "pytest_plugin.py", "api.py", "report*.py", "identify*.py", "identification.py",
                    "families.py", "output.py", "session.py", "catalog.py", "__main__.py", "figures.py")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in ("properties", "reference"):  # installed as ropecheck.properties, ropecheck.reference
        parts.insert(0, "ropecheck")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module name) of every import in ``source`` (the module ``module``), at any
    depth: relative imports resolved, ``from package import name`` counted as importing
    ``package.name`` too (it may be a submodule), and literal-string ``import_module`` /
    ``__import__`` calls."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            where = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, where))
            found += [(node.lineno, f"{where}.{alias.name}") for alias in node.names if alias.name != "*"]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


def front_doors_imported(source: str, module: str, is_package: bool = False) -> list[str]:
    return [f"line {line}: {name}" for line, name in imported_modules(source, module, is_package)
            if any(name == door or name.startswith(door + ".") for door in FRONT_DOORS)]


def core_files() -> list[Path]:
    files = sorted((ROOT / "properties").rglob("*.py")) + sorted((ROOT / "reference").rglob("*.py"))
    files += [p for p in sorted((ROOT / "ropecheck").rglob("*.py"))
              if not any(p.relative_to(ROOT / "ropecheck").match(pattern) and p.parent == ROOT / "ropecheck"
                         for pattern in FRONT_DOOR_FILES)]
    return files


def test_core_modules_are_found():
    names = {module_name(p) for p in core_files()}
    assert {"ropecheck.properties.runner", "ropecheck.properties.test_properties", "ropecheck.reference.rope",
            "ropecheck.target", "ropecheck.calling", "ropecheck.devices", "ropecheck.modes", "ropecheck.adapters.hf",
            "ropecheck.kernels.rope"} <= names
    assert not names & {"ropecheck.cli", "ropecheck.pytest_plugin", "ropecheck.api", "ropecheck.report",
                        "ropecheck.report_plots",
                        "ropecheck.identification", "ropecheck.identify_output", "ropecheck.families", "ropecheck.session"}


def test_no_core_module_imports_a_front_door():
    offences = {}
    for path in core_files():
        found = front_doors_imported(path.read_text(), module_name(path), path.name == "__init__.py")
        if found:
            offences[str(path.relative_to(ROOT))] = found
    assert not offences, f"core modules importing a front door: {offences}"


@pytest.mark.parametrize("source", [
    "import ropecheck.cli",
    "import ropecheck.pytest_plugin as plugin",
    "from ropecheck.report import run_target",
    "from ropecheck import identification",
    "from ropecheck.identification import identify_spec as spec",
    "def later():\n    if True:\n        from ropecheck.cli import main\n",
    "class C:\n    def m(self):\n        import ropecheck.report\n",
    "import importlib\nimportlib.import_module('ropecheck.pytest_plugin')",
])
def test_the_checker_finds_a_front_door_import(source):
    assert front_doors_imported(source, "ropecheck.properties.synthetic")


def test_the_checker_resolves_relative_imports():
    assert front_doors_imported("from . import cli", "ropecheck.synthetic")
    assert front_doors_imported("from ..cli import main", "ropecheck.adapters.synthetic")
    assert front_doors_imported("from . import report", "ropecheck", is_package=True)
    assert not front_doors_imported("from . import cli", "ropecheck.properties.synthetic")


@pytest.mark.parametrize("source", [
    "import ropecheck.calling",
    "from ropecheck import report_plots, identify_output, target",
    "from ropecheck.reporting import x",  # a name that only starts like a front door
    "import ropecheck.properties.runner\ncli = 'ropecheck.cli'",
])
def test_the_checker_passes_engine_imports(source):
    assert not front_doors_imported(source, "ropecheck.properties.synthetic")
