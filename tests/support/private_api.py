"""Finds uses of the private API of the Kubernetes libraries (kopf, aiohttp, kubernetes_asyncio) in
our source, by reading it (ast), never by running it.

A use is: importing a private module or name of one of them (`kopf._core…`, `from aiohttp import
_x`), naming such a module in a string (a logger name: `logging.getLogger("kopf._core…")`), or
reading an attribute whose private name (`obj._x`) one of the libraries defines and our own code
never does (`registry._watching`). Attribute names are matched by name, not by the object's type,
which a reader cannot know: a private name that both a library and our code define is taken as
ours (so the check never fails on our own objects' privates), and a library private of that same
name would pass unseen. Private names of other libraries (argparse's, prometheus_client's) are
not looked for.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

LIBRARIES = ("kopf", "aiohttp", "kubernetes_asyncio")
# kubernetes_asyncio's generated code, 14 MB: its models (a private field behind each public
# property) and its API classes (a private keyword per request option); its hand-written modules
# (client configuration and connection, config loading, watch) are where its internals live.
LIBRARY_SKIPPED = frozenset({"models", "api", "test", "tests", "e2e_test"})


@dataclass(frozen=True)
class Use:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def python_files(root: Path, skipped: frozenset[str] = frozenset()) -> Iterator[Path]:
    """The .py files under `root`, but those under a directory named in `skipped`."""
    for path in sorted(root.rglob("*.py")):
        if not skipped.intersection(path.relative_to(root).parts[:-1]):
            yield path


@dataclass(frozen=True)
class _Scan:
    """One file, read once: the private names it defines, its uses of private modules, and its
    reads of private attributes (kept until we know whose names they are)."""

    defined: frozenset[str]
    modules: tuple[tuple[int, str], ...]  # (line, what)
    attributes: tuple[tuple[int, str, ast.Attribute], ...]  # (line, name, the expression)


@functools.cache
def _scan(path: Path) -> _Scan:
    try:
        tree = ast.parse(path.read_text(errors="replace"), filename=str(path))
    except SyntaxError:
        return _Scan(frozenset(), (), ())
    names: set[str] = set()
    modules: list[tuple[int, str]] = []
    attributes: list[tuple[int, str, ast.Attribute]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute):
            if isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif _private(node.attr):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                if owner not in ("self", "cls"):
                    attributes.append((node.lineno, node.attr, node))
        elif isinstance(node, ast.Import):
            modules += [(node.lineno, f"import {a.name}") for a in node.names if _private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _private_module(node.module):
                modules.append((node.lineno, f"from {node.module} import …"))
            elif node.module.split(".")[0] in LIBRARIES:
                modules += [
                    (node.lineno, f"from {node.module} import {a.name}")
                    for a in node.names
                    if _private(a.name)
                ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words = node.value.split()
            if words and _private_module(words[0]):
                modules.append((node.lineno, f"the module {node.value!r} named in a string"))
    defined = frozenset(n for n in names if _private(n))
    return _Scan(defined, tuple(modules), tuple(attributes))


def defined_private_names(files: Iterable[Path]) -> frozenset[str]:
    """The private names `files` define: functions and classes, assigned names and attributes
    (`self._x = …`), parameters."""
    return frozenset().union(*(_scan(path).defined for path in files))


def library_files(libraries: Iterable[str] = LIBRARIES) -> list[Path]:
    files: list[Path] = []
    for name in libraries:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
        for root in spec.submodule_search_locations:
            files.extend(python_files(Path(root), LIBRARY_SKIPPED))
    return files


@functools.cache
def library_private_names() -> frozenset[str]:
    return defined_private_names(library_files())


def _private_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] in LIBRARIES and any(_private(p) for p in parts[1:])


def private_uses(
    files: Iterable[Path], theirs: frozenset[str], ours: frozenset[str], base: Path
) -> list[Use]:
    """Every use of a library's private API in `files` (see the module's docstring): `theirs` are
    the libraries' private names, `ours` our code's."""
    foreign = theirs - ours
    uses: list[Use] = []
    for path in files:
        shown = str(path.relative_to(base)) if path.is_relative_to(base) else str(path)
        scan = _scan(path)
        uses += [Use(shown, line, what) for line, what in scan.modules]
        uses += [
            Use(shown, line, f"{ast.unparse(node)} ({name} is a library's)")
            for line, name, node in scan.attributes
            if name in foreign
        ]
    return sorted(uses, key=lambda u: (u.path, u.line))
