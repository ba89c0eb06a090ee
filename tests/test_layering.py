"""Layering: every module of ropecheck has a layer, imports only its own layer and those
below, and no two modules (or packages) import each other round a cycle.

The layers, lowest first (docs/architecture.md): the float64 references, the laws, the
project's kernels, the calling layer, the targets, the check session, reports, identify,
and the front doors. Checked on the source with ``ast``, so that an import inside a
function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# (layer, the module-name prefixes it holds), lowest first
LAYERS = (
    ("reference", ("ropecheck.reference",)),
    # the laws, in layers of their own: the core (dtypes, sizes, the contract with the harness)
    # below the inputs (cases, strategies), below the library interfaces, below the engine and
    # the families' checks, below the catalogue of every family (properties/families/)
    ("properties.core", ("ropecheck.properties.core",)),
    ("properties.inputs", ("ropecheck.properties.inputs",)),
    ("properties.interfaces", ("ropecheck.properties.interfaces",)),
    ("properties", ("ropecheck.properties",)),
    ("properties.nd", ("ropecheck.properties.nd",)),  # a family in a folder of its own
    ("properties.families", ("ropecheck.properties.families",)),
    ("kernels", ("ropecheck.kernels",)),
    ("timing", ("ropecheck.timing",)),
    ("calling", ("ropecheck.calling",)),
    ("targets", ("ropecheck.targets", "ropecheck.target")),
    ("adapters", ("ropecheck.adapters",)),
    ("session", ("ropecheck.session",)),
    ("report", ("ropecheck.report",)),
    ("identification", ("ropecheck.identification",)),
    ("bench", ("ropecheck.bench",)),
    ("front doors", ("ropecheck.api", "ropecheck.cli", "ropecheck.commands", "ropecheck.pytest_plugin", "ropecheck.__main__",
                     "ropecheck.figures", "ropecheck")),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in ("properties", "reference"):  # installed as ropecheck.properties, ropecheck.reference
        parts.insert(0, "ropecheck")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str):
    """(index, name) of the layer holding ``module`` (the longest matching prefix), or None."""
    best = None
    for index, (name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or (module.startswith(prefix + ".") and prefix != "ropecheck")  # the package itself
            if inside and (best is None or len(prefix) > best[2]):
                best = (index, name, len(prefix))
    return None if best is None else best[:2]


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module name) of every import in ``source`` (the module ``module``), at any
    depth: relative imports resolved, ``from package import name`` counted as importing
    ``package.name`` (it may be a submodule) and, unless that is one of the project's
    modules, ``package`` itself; and literal-string ``import_module`` / ``__import__`` calls."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    known = MODULES()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            where = ".".join(base + ([node.module] if node.module else []))
            names = [f"{where}.{alias.name}" for alias in node.names if alias.name != "*"]
            if not any(n in known for n in names):  # names from the package itself, not its submodules
                found.append((node.lineno, where))
            found += [(node.lineno, n) for n in names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


def project_files() -> list[Path]:
    return sorted(p for folder in ("ropecheck", "properties", "reference") for p in (ROOT / folder).rglob("*.py"))


_modules: set = set()


def MODULES() -> set:
    """The names of the project's modules and packages."""
    if not _modules:
        _modules.update(module_name(p) for p in project_files())
    return _modules


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (any depth)."""
    files = {module_name(p): p for p in project_files()}
    graph = {}
    for name, path in files.items():
        found = imported_modules(path.read_text(), name, path.name == "__init__.py")
        graph[name] = {m for _, m in found if m in files and m != name}
    return graph


def upward_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that reach a layer above its own."""
    own = layer_of(module)
    out = []
    for line, name in imported_modules(source, module, is_package):
        if not name.startswith("ropecheck"):
            continue
        theirs = layer_of(name)
        if own is not None and theirs is not None and theirs[0] > own[0]:
            out.append(f"line {line}: {name} ({theirs[1]}, above {own[1]})")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """package -> the packages its modules import (a module's package: itself if it is
    one, else its folder's)."""
    packages = {module_name(p) for p in project_files() if p.name == "__init__.py"}

    def package(m):
        return m if m in packages else m.rsplit(".", 1)[0]
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(package(m), set()).update(package(t) for t in targets if package(t) != package(m))
    return out


def test_every_module_has_a_layer():
    unplaced = [module_name(p) for p in project_files() if layer_of(module_name(p)) is None]
    assert not unplaced, f"modules in no layer: {unplaced}"
    names = {module_name(p) for p in project_files()}
    assert {"ropecheck.properties.runner", "ropecheck.reference.rope", "ropecheck.calling.worker",
            "ropecheck.targets.target", "ropecheck.adapters.hf", "ropecheck.session.prepare", "ropecheck.report.output",
            "ropecheck.identification.engine", "ropecheck.cli", "ropecheck.kernels.rope"} <= names


def test_no_module_imports_a_layer_above_its_own():
    offences = {}
    for path in project_files():
        found = upward_imports(path.read_text(), module_name(path), path.name == "__init__.py")
        if found:
            offences[str(path.relative_to(ROOT))] = found
    assert not offences, f"modules importing a layer above their own: {offences}"


def test_no_import_cycles():
    graph = import_graph()
    assert not cycles(graph), f"module import cycles: {cycles(graph)}"
    packages = package_graph(graph)
    assert not cycles(packages), f"package import cycles: {cycles(packages)}"


@pytest.mark.parametrize("source, module", [
    ("import ropecheck.cli", "ropecheck.properties.synthetic"),
    ("from ropecheck.session.prepare import prepare", "ropecheck.targets.synthetic"),
    ("from ropecheck.calling.caller import Caller", "ropecheck.properties.synthetic"),
    ("def later():\n    if True:\n        from ropecheck.report import output\n", "ropecheck.session.synthetic"),
    ("class C:\n    def m(self):\n        import ropecheck.api\n", "ropecheck.identification.synthetic"),
    ("import importlib\nimportlib.import_module('ropecheck.pytest_plugin')", "ropecheck.calling.synthetic"),
    ("from .. import session", "ropecheck.targets.synthetic"),
    ("from ..properties import checks", "ropecheck.reference.synthetic"),
])
def test_the_checker_finds_an_upward_import(source, module):
    assert upward_imports(source, module)


@pytest.mark.parametrize("source, module", [
    ("import ropecheck.calling.caller", "ropecheck.targets.synthetic"),
    ("from ropecheck.properties import runner\nfrom ropecheck.reference import rope", "ropecheck.session.synthetic"),
    ("from ropecheck.sessions_of_mine import x", "ropecheck.calling.synthetic"),  # no such layer: not counted
    ("import ropecheck.properties.runner\ncli = 'ropecheck.cli'", "ropecheck.properties.synthetic"),
    ("from . import options", "ropecheck.session.synthetic"),
])
def test_the_checker_passes_downward_and_sideways_imports(source, module):
    assert not upward_imports(source, module)


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
