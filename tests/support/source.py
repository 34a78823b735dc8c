"""Parse Python source for tests that read the code (import contracts, the docs check)."""

from __future__ import annotations

import ast
from pathlib import Path


def parse_file(path: Path) -> ast.Module:
    """`ast.parse` of a file, tried once more on CPython 3.11's spurious recursion-depth SystemError.

    CPython 3.11 keeps the AST constructor's recursion depth in interpreter-wide state, so a parse
    can fail with "AST constructor recursion depth mismatch" when another thread of the process
    compiles at the same moment (python/cpython#106905). It says nothing about the file: parsing is
    deterministic, and a second parse either succeeds or raises the file's real error.
    """
    source = path.read_text(encoding="utf-8")
    try:
        return ast.parse(source, str(path))
    except SystemError as exc:
        if "recursion depth mismatch" not in str(exc):
            raise
        return ast.parse(source, str(path))
