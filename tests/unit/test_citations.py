"""Citations stay inside the repository: no pointer to an outside document, and every
`docs/<page>.md#<anchor>` cited by code, tests or docs names an anchor that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("operator/agentrun_operator", "tests", "docs", "charts", "examples", "README.md", "Makefile")
OUTSIDE = re.compile(r"SPEC §|§\s?\d|reference note|\.\./shared|SPEC\.md")
CITATION = re.compile(r"docs/([\w-]+\.md)#([\w-]+)|\(([\w-]+\.md)#([\w-]+)\)")
ANCHOR = re.compile(r'<a id="([\w-]+)"></a>|\{#([\w-]+)\}')


def _files() -> list[Path]:
    out: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        out += [p for p in files if p.suffix in {".py", ".md", ".yaml", ".yml", ".sh", ".tpl", ""}]
    return [p for p in out if "__pycache__" not in p.parts and p != Path(__file__).resolve()]


def _anchors(page: Path) -> set[str]:
    text = page.read_text()
    headings = {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.*)$", text, re.M)
    }
    return {a or b for a, b in ANCHOR.findall(text)} | headings


def test_nothing_cites_a_document_outside_the_repository() -> None:
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in _files()
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == [], "\n".join(found)


def test_every_cited_docs_anchor_exists() -> None:
    missing = []
    for path in _files():
        for match in CITATION.finditer(path.read_text(errors="replace")):
            page, anchor = (match.group(1), match.group(2)) if match.group(1) else match.group(3, 4)
            target = ROOT / "docs" / page
            if path.suffix == ".md" and match.group(3) and path.parent != ROOT / "docs":
                target = path.parent / page
            if not target.exists() or anchor not in _anchors(target):
                missing.append(f"{path.relative_to(ROOT)}: {page}#{anchor}")
    assert missing == [], "\n".join(sorted(set(missing)))
