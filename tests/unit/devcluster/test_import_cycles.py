"""The dev cluster has no import cycles: no module imports, at module level or inside a function,
one that imports it back (directly or through others). A cycle makes the modules one unit that
cannot be read, tested or changed apart (the pod runner had two: adopt → docker → pidns → process →
runtime → adopt, and runner ↔ worker). The check is tested on a copy with a back import added, so a
passing check cannot be vacuous.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.import_contracts import Import, import_graph

ROOT = Path(__file__).resolve().parents[3] / "operator" / "devcluster"
PACKAGE = "agentrun_devcluster"


def cycles(graph: dict[str, list[Import]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan), each sorted."""
    edges = {
        m: sorted({i.target for i in imps if i.target in graph and i.target != m})
        for m, imps in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in edges[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == module:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def describe(graph: dict[str, list[Import]], parts: list[list[str]]) -> str:
    """Each cycle with the imports that close it."""
    lines = []
    for part in parts:
        lines.append(" ↔ ".join(part))
        lines += [f"  {imp}" for m in part for imp in graph[m] if imp.target in part and imp.target != m]
    return "\n".join(lines)


def test_the_dev_cluster_has_no_import_cycles() -> None:
    graph = import_graph(ROOT, PACKAGE)
    assert f"{PACKAGE}.podrunner.worker" in graph, "the dev cluster's modules were not found"
    assert not cycles(graph), describe(graph, cycles(graph))


def test_a_back_import_inside_a_function_is_a_cycle(tmp_path: Path) -> None:
    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE)
    procfs = tmp_path / PACKAGE / "podrunner" / "procfs.py"
    procfs.write_text(
        procfs.read_text() + "\n\ndef _late() -> None:\n    from agentrun_devcluster.podrunner import adopt\n"
    )
    graph = import_graph(tmp_path, PACKAGE)
    [part] = cycles(graph)
    assert {f"{PACKAGE}.podrunner.procfs", f"{PACKAGE}.podrunner.adopt"} <= set(part), part
    assert "in _late() imports agentrun_devcluster.podrunner.adopt" in describe(graph, [part])
