"""The import contracts: the planner is pure, the product does not depend on the dev cluster, and no
module of operator/ is part of an import cycle.

The planner (functional core) imports no shell, no kopf, no Kubernetes client and no dev cluster,
directly or through another module of the package. No product module imports the dev cluster, but
the `agentrun dev` command of the CLI. No two modules of the two packages under operator/ (the
product, agentrun_operator, and the dev cluster, agentrun_devcluster) import each other, directly
or through others, at module level or inside a function. Neither the product nor the tests use the
private API of kopf, aiohttp or kubernetes_asyncio (tests/support/private_api.py: their private
modules, and private attributes such as kopf's registry internals, `registry._watching`). The
checkers themselves are tested on synthetic packages and on a copy of the real one with a forbidden
import added, so a passing contract cannot be vacuous.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support import private_api
from tests.support.import_contracts import (
    Cycle,
    Import,
    cycles,
    import_graph,
    import_graph_of,
    modules_of,
    render,
    violations,
)

ROOT = Path(__file__).resolve().parents[2] / "operator"
TESTS = ROOT.parent / "tests"
PACKAGE = "agentrun_operator"
DEVCLUSTER = "agentrun_devcluster"  # its own distribution, operator/devcluster/
CLIENTS = ("kopf", "kubernetes_asyncio", "kubernetes")

KNOWN_CYCLES: tuple[frozenset[str], ...] = ()
"""Import cycles tolerated while they are being removed: none. A cycle found must lie within one of
these; one of these that no longer exists fails the test, so the list cannot outlive its cycles."""


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def planner_violations(root: Path) -> list[list[Import]]:
    graph = import_graph(root, PACKAGE)
    planner = [m for m in graph if _under(m, f"{PACKAGE}.planner")]
    assert planner, "no planner modules found: the contract would pass vacuously"
    return violations(
        graph,
        planner,
        lambda target: _under(target, f"{PACKAGE}.shell", DEVCLUSTER, *CLIENTS),
    )


def builder_violations(root: Path) -> list[list[Import]]:
    """The Job builder sits under the planner: the planner builds Jobs with it, so it never imports
    the planner back (the two packages would be a cycle)."""
    graph = import_graph(root, PACKAGE)
    builder = [m for m in graph if _under(m, f"{PACKAGE}.jobs")]
    assert builder, "no builder modules found: the contract would pass vacuously"
    return violations(graph, builder, lambda target: _under(target, f"{PACKAGE}.planner", f"{PACKAGE}.shell"))


def devcluster_violations(root: Path) -> list[list[Import]]:
    graph = import_graph(root, PACKAGE)
    product = list(graph)
    return violations(
        graph,
        product,
        lambda target: _under(target, DEVCLUSTER),
        allowed=lambda imp: imp.importer == f"{PACKAGE}.cli" and imp.scope == "_cmd_dev",
    )


def test_the_planner_imports_no_shell_kopf_client_or_dev_cluster() -> None:
    assert planner_violations(ROOT) == [], render(planner_violations(ROOT))


def test_the_job_builder_imports_no_planner_so_the_two_are_no_cycle() -> None:
    assert builder_violations(ROOT) == [], render(builder_violations(ROOT))


def test_a_planner_import_added_to_the_builder_breaks_the_contract(tmp_path: Path) -> None:
    root = copy_of_package(tmp_path)
    builder = root / PACKAGE / "jobs" / "builder.py"
    builder.write_text(builder.read_text() + "\nfrom agentrun_operator.planner.context import Context\n")
    chains = builder_violations(root)
    assert chains and {c[-1].importer for c in chains} == {f"{PACKAGE}.jobs.builder"}


def test_product_modules_never_import_the_dev_cluster() -> None:
    assert devcluster_violations(ROOT) == [], render(devcluster_violations(ROOT))


def operator_cycles(root: Path) -> list[Cycle]:
    """The import cycles of both packages under operator/, as one graph (an import from the dev
    cluster into the product and back would be a cycle too)."""
    graph = import_graph_of([(root, PACKAGE), (root / "devcluster", DEVCLUSTER)])
    assert any(_under(m, PACKAGE) for m in graph) and any(_under(m, DEVCLUSTER) for m in graph)
    return cycles(graph)


def test_no_module_of_operator_is_part_of_an_import_cycle() -> None:
    found = operator_cycles(ROOT)
    new = [c for c in found if not any(c.modules <= known for known in KNOWN_CYCLES)]
    assert new == [], "import cycles (docs/development.md#import-contracts):\n" + "\n".join(map(str, new))
    gone = [known for known in KNOWN_CYCLES if not any(c.modules <= known for c in found)]
    assert gone == [], f"no longer cycles, remove them from KNOWN_CYCLES: {[sorted(k) for k in gone]}"


# ----------------------------------------------------------------------------------- the checker


def copy_of_package(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_a_shell_import_added_to_a_planner_module_breaks_the_contract(tmp_path: Path) -> None:
    root = copy_of_package(tmp_path)
    gating = root / PACKAGE / "planner" / "gating.py"
    gating.write_text(gating.read_text() + "\nfrom agentrun_operator.shell import metrics\n")
    chains = planner_violations(root)
    assert chains
    assert {c[-1].importer for c in chains} == {f"{PACKAGE}.planner.gating"}
    assert {c[-1].target for c in chains} == {f"{PACKAGE}.shell.metrics"}


def test_a_client_imported_lazily_through_another_module_breaks_the_contract(tmp_path: Path) -> None:
    root = copy_of_package(tmp_path)
    naming = root / PACKAGE / "naming.py"
    naming.write_text(naming.read_text() + "\n\ndef _late() -> None:\n    import kubernetes_asyncio.client\n")
    chains = planner_violations(root)
    assert chains
    assert all(chain[-1].importer == f"{PACKAGE}.naming" and chain[-1].scope == "_late" for chain in chains)
    assert "kubernetes_asyncio.client" in render(chains)


def test_a_dev_cluster_import_outside_agentrun_dev_breaks_the_contract(tmp_path: Path) -> None:
    root = copy_of_package(tmp_path)
    handlers = root / PACKAGE / "shell" / "handlers.py"
    handlers.write_text(handlers.read_text() + "\nfrom agentrun_devcluster import toolchain\n")
    chains = devcluster_violations(root)
    assert chains and {chain[-1].importer for chain in chains} >= {f"{PACKAGE}.shell.handlers"}


def test_relative_and_submodule_imports_are_resolved(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("from .. import tools\nfrom . import b\n")
    (pkg / "core" / "b.py").write_text("import json\n")
    (pkg / "tools.py").write_text("class X:\n    def f(self) -> None:\n        import kopf\n")
    assert set(modules_of(tmp_path, "pkg")) == {"pkg", "pkg.core", "pkg.core.a", "pkg.core.b", "pkg.tools"}
    graph = import_graph(tmp_path, "pkg")
    assert {i.target for i in graph["pkg.core.a"]} == {"pkg.tools", "pkg.core.b"}
    [chain] = violations(graph, ["pkg.core.a"], lambda t: t == "kopf")
    assert [str(i) for i in chain] == ["pkg.core.a:1 imports pkg.tools", "pkg.tools:3 in X.f() imports kopf"]


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_cycles_at_module_level_and_inside_functions_are_found(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "def f() -> None:\n    from pkg.c import X\n",  # a lazy import is an edge
            "pkg/c.py": "import pkg.a\nX = 1\n",
            "pkg/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.e import Y\n",
            "pkg/e.py": "from . import d\nY = 1\n",
            "pkg/leaf.py": "from pkg import a\n",  # imports into a cycle, is not in it
        },
    )
    found = cycles(import_graph(root, "pkg"))
    assert {c.modules for c in found} == {
        frozenset({"pkg.a", "pkg.b", "pkg.c"}),
        frozenset({"pkg.d", "pkg.e"}),
    }
    [abc] = [c for c in found if "pkg.a" in c.modules]
    assert [str(i) for i in abc.imports] == [
        "pkg.a:1 imports pkg.b",
        "pkg.b:2 in f() imports pkg.c",
        "pkg.c:1 imports pkg.a",
    ]


def test_a_package_importing_its_submodules_is_no_cycle_but_a_name_from_it_is(tmp_path: Path) -> None:
    """`from pkg import sibling` in a submodule of pkg, whose `__init__` imports that submodule,
    depends on the sibling only; `from pkg import name` (a name `__init__` defines) depends on pkg."""
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from .a import A\nfrom .b import B\n",
            "pkg/a.py": "from pkg import b\nA = 1\n",
            "pkg/b.py": "B = 2\n",
        },
    )
    assert cycles(import_graph(root, "pkg")) == []
    (root / "pkg" / "b.py").write_text("from pkg import A\nB = 2\n")
    [cycle] = cycles(import_graph(root, "pkg"))
    assert cycle.modules == {"pkg", "pkg.a", "pkg.b"}


def test_an_import_circle_added_to_the_shell_breaks_the_contract(tmp_path: Path) -> None:
    root = copy_of_package(tmp_path)
    shutil.copytree(ROOT / "devcluster" / DEVCLUSTER, root / "devcluster" / DEVCLUSTER)
    writes = root / PACKAGE / "shell" / "writes.py"
    writes.write_text(
        writes.read_text() + "\n\ndef _late() -> None:\n    from agentrun_operator.shell import reconciler\n"
    )
    new = [c for c in operator_cycles(root) if not any(c.modules <= known for known in KNOWN_CYCLES)]
    assert [c.modules for c in new] == [{f"{PACKAGE}.shell.reconciler", f"{PACKAGE}.shell.writes"}]


# ------------------------------------------------------------------------- libraries' private API


def _ours() -> list[Path]:
    return [*private_api.python_files(ROOT), *private_api.python_files(TESTS)]


def test_neither_product_nor_tests_use_a_librarys_private_api() -> None:
    """Behaviour is tested through what a library documents (kopf's handlers driven, its operator
    run against the real API server), never through its internals (docs/development.md#tiers)."""
    files = _ours()
    ours = private_api.defined_private_names(files)
    uses = private_api.private_uses(files, private_api.library_private_names(), ours, ROOT.parent)
    assert uses == [], "private API of a library:\n" + "\n".join(map(str, uses))


def test_the_private_api_check_finds_kopfs_registry_internals_and_private_modules(tmp_path: Path) -> None:
    """What the tests once did (`registry._watching`, `registry._webhooks`), and private modules,
    named in a string too (a logger); our own privates (`self._tasks`, `informer._resume`) pass."""
    bad = tmp_path / "test_bad.py"
    bad.write_text(
        "import logging\n"
        "import kopf\n"
        "import kopf._core.engines.peering\n"
        "from aiohttp import _websocket\n"
        "from kopf._cogs.structs import bodies\n"
        "registry = kopf.OperatorRegistry()\n"
        "watching = registry._watching.get_all_handlers()\n"
        "hooks = registry._webhooks.get_all_handlers()\n"
        "logging.getLogger('kopf._core.engines.peering')\n"
        "informer._resume.clear()\n"
        "class X:\n"
        "    def f(self) -> None:\n"
        "        self._tasks = []\n"
    )
    files = [*_ours(), bad]
    ours = private_api.defined_private_names(files)
    uses = private_api.private_uses([bad], private_api.library_private_names(), ours, tmp_path)
    assert [u.line for u in uses] == [3, 4, 5, 7, 8, 9], "\n".join(map(str, uses))
    assert "registry._watching" in str(uses[3]) and "registry._webhooks" in str(uses[4])
