"""Which modules a package's modules import, read from the source (nothing is imported or run).

The import contracts of the operator (the planner imports no shell, kopf, Kubernetes client or dev
cluster; product modules never import the dev cluster; no import cycles) are checked with this on
every test run. Imports inside functions count too: a lazy import still runs when the function is
called. So do imports under `if TYPE_CHECKING:`: two modules that need each other's names are one
job in two files, whichever of them defers the import.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.support.source import parse_file


@dataclass(frozen=True)
class Import:
    """`importer` imports `target` (absolute module name) at `line`, inside `scope` ("" = module level)."""

    importer: str
    target: str
    line: int
    scope: str = ""

    def __str__(self) -> str:
        where = f" in {self.scope}()" if self.scope else ""
        return f"{self.importer}:{self.line}{where} imports {self.target}"


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` (a directory under `root`), by its dotted name."""
    out: dict[str, Path] = {}
    for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.known = known
        self.scopes: list[str] = []
        self.found: list[Import] = []

    def _add(self, target: str, node: ast.stmt) -> None:
        self.found.append(Import(self.module, target, node.lineno, ".".join(self.scopes)))

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scopes.append(node.name)
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            module = ".".join([*base, node.module] if node.module else base)
        else:
            module = node.module or ""
        if module == "__future__":
            return
        # `from pkg import submodule` imports the submodule; the package itself is a target only for
        # a name it defines (its `__init__` runs either way, as for every import of a submodule).
        submodules = [
            f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in self.known
        ]
        if len(submodules) < len(node.names):
            self._add(module, node)
        for submodule in submodules:
            self._add(submodule, node)


def import_graph(root: Path, package: str) -> dict[str, list[Import]]:
    """The imports of every module of `package`, by importer."""
    return import_graph_of([(root, package)])


def import_graph_of(packages: Iterable[tuple[Path, str]]) -> dict[str, list[Import]]:
    """The imports of every module of several packages (each a directory under its root), by importer:
    one graph, so an import from one package into another resolves to the module it names."""
    modules = {name: path for root, package in packages for name, path in modules_of(root, package).items()}
    known = set(modules)
    graph: dict[str, list[Import]] = {}
    for name, path in modules.items():
        collector = _Collector(name, path.name == "__init__.py", known)
        collector.visit(parse_file(path))
        graph[name] = collector.found
    return graph


def _parents(name: str) -> list[str]:
    """Importing `a.b.c` runs `a/__init__`, `a.b/__init__` and `a.b.c`."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def violations(
    graph: dict[str, list[Import]],
    sources: Iterable[str],
    forbidden: Callable[[str], bool],
    allowed: Callable[[Import], bool] = lambda _imp: False,
) -> list[list[Import]]:
    """Import chains from a source module to a forbidden module, following the package's own modules.

    Each chain is the list of imports from the source to the forbidden target, so a failure message
    shows how a forbidden module is reached. `allowed` exempts single imports (e.g. one CLI command).
    """
    found: list[list[Import]] = []
    for source in sources:
        seen = {source}
        queue: list[tuple[str, list[Import]]] = [(source, [])]
        while queue:
            module, chain = queue.pop(0)
            for imp in graph.get(module, []):
                if allowed(imp):
                    continue
                if forbidden(imp.target):
                    found.append([*chain, imp])
                    continue
                for target in _parents(imp.target):
                    if target in graph and target not in seen:
                        seen.add(target)
                        queue.append((target, [*chain, imp]))
    return found


def render(chains: list[list[Import]]) -> str:
    return "\n".join(" -> ".join(str(imp) for imp in chain) for chain in chains)


@dataclass(frozen=True)
class Cycle:
    """Modules that import each other, directly or through one another (a strongly connected
    component of the import graph), and the imports that tie them."""

    modules: frozenset[str]
    imports: tuple[Import, ...]

    def __str__(self) -> str:
        lines = [f"{len(self.modules)} modules: {', '.join(sorted(self.modules))}"]
        lines += [f"  {imp}" for imp in self.imports]
        return "\n".join(lines)


def cycles(graph: dict[str, list[Import]]) -> list[Cycle]:
    """Every import cycle between modules of the graph (Tarjan's algorithm, iterative).

    An edge is an import of a module of the graph by name, at module level or inside a function; the
    implicit import of a module's parent packages is none (every submodule has it, and a package's
    `__init__` importing its submodules is no cycle).
    """
    edges: dict[str, list[str]] = {
        module: sorted({imp.target for imp in imports if imp.target in graph and imp.target != module})
        for module, imports in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                target = edges[node][i]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(frozenset(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return [
        Cycle(
            component,
            tuple(
                imp
                for m in sorted(component)
                for imp in graph[m]
                if imp.target in component and imp.target != m
            ),
        )
        for component in components
    ]
