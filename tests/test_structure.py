"""The code's shape, read from its source with `ast` (nothing is imported): no import cycle
between the project's modules, and no function longer than a screen.

An import counts wherever it is written: at the top of a module, inside a function (a lazy
import still runs, later) or under `if TYPE_CHECKING:`. `from X import Y` is an import of
module `X.Y` when that is a module of the project, else of `X`. Importing a module runs its
packages' `__init__.py` too; those implicit edges are not counted (an `__init__` that imports
its own submodules would otherwise make every package a cycle).

`python tests/test_structure.py` prints the cycles and the long functions.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "kernels", "workers", "orchestrator", "bench")
SHORT_PACKAGES = ("core", "orchestrator", "workers")
MAX_FUNCTION_LINES = 80


def module_files(packages=PACKAGES) -> dict[str, Path]:
    """Each module's dotted name (a package by its own name) -> its file."""
    modules = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """`name`, or the closest enclosing module that is the project's (`a.b.func` -> `a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules that `module` imports, at any depth in its source."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path, node)
            names = [f"{base}.{alias.name}" for alias in node.names]  # X.Y, else X by _known
        else:
            continue
        found.update(target for target in map(lambda n: _known(n, modules), names) if target)
    found.discard(module)
    return found


def import_graph(packages=PACKAGES) -> dict[str, set[str]]:
    modules = module_files(packages)
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(start: str) -> None:  # iterative: no recursion limit on long import chains
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest cycle through the component's first module: a -> b -> ... -> a."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    return paths[node] + [start]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    following.append(child)
        frontier = following
    return component


def cycle_report(graph: dict[str, set[str]], components: list[list[str]]) -> list[str]:
    files = module_files()
    lines = []
    for component in components:
        lines.append(
            f"{len(component)} modules: "
            + ", ".join(str(files[m].relative_to(ROOT)) for m in component)
            + "\n    e.g. "
            + " -> ".join(a_cycle(graph, component))
        )
    return lines


def long_functions(packages=SHORT_PACKAGES, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'path:line name (N lines)' for each function or method longer than `limit` lines,
    counted from its `def` to its last line."""
    found = []
    for path in module_files(packages).values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return sorted(found)


@pytest.fixture(scope="module")
def graph():
    return import_graph()


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(graph, package):
    """Each package's modules can be read, and imported, from the bottom up: no module imports,
    at any depth, one that imports it back."""
    components = [c for c in strongly_connected(graph) if any(m.split(".")[0] == package for m in c)]
    assert not components, "import cycles:\n" + "\n".join(cycle_report(graph, components))


@pytest.mark.parametrize("package", SHORT_PACKAGES)
def test_no_function_longer_than_a_screen(package):
    found = long_functions((package,))
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found)


def test_the_graph_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    """The checker itself: a cycle closed by an import inside a function, through a relative
    `from . import`, is found; a package's `__init__` importing its submodule is not a cycle."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg import a\n")
    (package / "a.py").write_text("from pkg.sub.b import thing\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def thing():\n    from .. import a\n")
    (package / "c.py").write_text("import pkg.sub\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    graph = import_graph(("pkg",))
    assert graph["pkg.c"] == {"pkg.sub"}
    assert strongly_connected(graph) == [["pkg.a", "pkg.sub.b"]]
    assert a_cycle(graph, ["pkg.a", "pkg.sub.b"]) == ["pkg.a", "pkg.sub.b", "pkg.a"]


if __name__ == "__main__":
    full = import_graph()
    print("\n".join(cycle_report(full, strongly_connected(full))) or "no import cycle")
    print("\n".join(long_functions()) or f"no function over {MAX_FUNCTION_LINES} lines")
