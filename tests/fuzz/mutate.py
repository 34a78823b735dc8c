"""Seeded mutations of the example manifests: the fuzz suite's input, reproducible from a seed.

`mutant(seed)` picks an example document of examples/*.yaml and applies 1-3 random edits (most often
one) anywhere in its `spec`: delete a field, replace a value by one of a list of troublemakers (empty
strings, upper case, huge numbers, wrong types, …), edit a string or a number near its valid range,
add an unknown field, duplicate or empty a list, rename a name-like field. The same seed always gives the
same manifest (`random.Random(seed)`, examples read in sorted order), so a failing case is replayed
with `AGENTRUN_FUZZ_SEED=…` (see docs/development.md#fuzz).

`mutant_file(rng)` makes a whole file: one to four valid documents of every kind of ours (examples/
and tests/fixtures/compat/valid/, sometimes a whole example file so the run's references resolve in
it), then 1-3 edits at any depth of any document — the envelope too (`apiVersion`, `kind`,
`metadata`, `metadata.name`, `spec` set to `0`, `""`, `[]`, `{}`, a 300-character string, a list as a
name, or removed) — and now and then a document that is not an object at all. `rng` is a
`random.Random(seed)` for a replayable run, or hypothesis' `st.randoms()` for a shrinking one.
"""

from __future__ import annotations

import copy
import functools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from agentrun_operator.api import GROUP

EXAMPLES: Final = Path(__file__).resolve().parents[2] / "examples"
VALID_FIXTURES: Final = Path(__file__).resolve().parents[1] / "fixtures" / "compat" / "valid"
KINDS: Final = ("AgentRun", "Agent", "AgentProvider", "ImplementationSpec", "VersionControlProvider")

Path_ = tuple[str | int, ...]

TROUBLEMAKERS: Final[tuple[Any, ...]] = (
    None,
    "",
    " ",
    "UPPER_Case",
    "has space",
    "-leading-dash",
    "a" * 64,
    "x" * 5000,
    "ünïcödé",
    "$(NOT_SET)",
    "/",
    "relative/path",
    0,
    -1,
    1,
    2**31,
    10**12,
    1.5,
    True,
    False,
    [],
    {},
    ["a", "a"],
    {"unexpected": "object"},
)

NAME_LIKE: Final[tuple[str, ...]] = ("", "Bad_Name", "a" * 64, "-x", "x-", "ok-name", "dots.in.name")


@dataclass(frozen=True)
class Mutant:
    """A mutated manifest and how it came to be (the seed, the example, the edits)."""

    seed: int
    example: str
    edits: tuple[str, ...]
    manifest: dict[str, Any]

    def describe(self) -> str:
        return f"seed {self.seed}: {self.example}: {'; '.join(self.edits)}"


@functools.cache
def example_documents() -> tuple[tuple[str, dict[str, Any]], ...]:
    """Every document of examples/*.yaml, as (file name, document), in a fixed order (read once;
    callers copy before they edit)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict):
                out.append((f"{path.name}/{doc.get('kind')}/{doc['metadata']['name']}", doc))
    return tuple(out)


def _paths(node: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every path below `node` (not `node` itself), depth first."""
    out: list[Path_] = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append((*prefix, key))
            out.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.append((*prefix, i))
            out.extend(_paths(value, (*prefix, i)))
    return out


def _parent(root: Any, path: Path_) -> Any:
    node = root
    for part in path[:-1]:
        node = node[part]
    return node


def _render(path: Path_) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _operations(parent: Any, key: str | int, value: Any) -> list[tuple[str, float]]:
    """The edits that fit this spot, with weights: most keep the field's type (so a fair share of
    mutants pass the schema and reach the operator); wrong types and unknown fields are rarer."""
    ops: list[tuple[str, float]] = [("troublemaker", 1.5)]
    if isinstance(parent, dict):
        ops.append(("delete", 3.0))
    if isinstance(parent, list):
        ops.append(("remove", 2.0))
    if key == "name":
        ops.append(("name", 5.0))
    if isinstance(value, str):
        ops.append(("string", 4.0))
    if isinstance(value, int) and not isinstance(value, bool):
        ops.append(("number", 5.0))
    if isinstance(value, dict):
        ops.append(("unknown", 0.5))
    if isinstance(value, list):
        ops.append(("list", 2.0))
    return ops


def _edit(rng: random.Random, root: dict[str, Any]) -> str:
    """Apply one edit under `root` (the spec); returns what it did."""
    paths = _paths(root)
    if not paths:
        root["bogusField"] = 1
        return "spec.bogusField = 1"
    path = rng.choice(paths)
    parent = _parent(root, path)
    key = path[-1]
    value = parent[key]
    where = f"spec.{_render(path)}"
    ops = _operations(parent, key, value)
    op = rng.choices([name for name, _ in ops], weights=[w for _, w in ops])[0]
    if op == "delete":
        del parent[key]
        return f"delete {where}"
    if op == "remove":
        parent.pop(key)
        return f"remove {where}"
    if op == "name":
        parent[key] = rng.choice(NAME_LIKE)
    elif op == "string":
        edits = [value.upper(), value[: len(value) // 2], f"{value}_x", value.lstrip("/"), ""]
        parent[key] = rng.choice(edits)
    elif op == "number":
        parent[key] = rng.choice([0, -1, value - 1, value + 1, value * 1000, 1000, 1001, 21])
    elif op == "unknown":
        value[rng.choice(["bogusField", "Name", "extra"])] = rng.choice(TROUBLEMAKERS)
        return f"add an unknown field to {where}"
    elif op == "list":
        if value and rng.random() < 0.6:
            value.append(copy.deepcopy(rng.choice(value)))
            return f"duplicate an item of {where}"
        value.clear()
        return f"empty {where}"
    else:
        parent[key] = copy.deepcopy(rng.choice(TROUBLEMAKERS))
    return f"{where} = {parent[key]!r:.60}"


def mutant(seed: int, kinds: tuple[str, ...] = ("AgentRun",), name: str | None = None) -> Mutant:
    """The manifest of `seed`: an example document of one of `kinds` with 1-3 edits of its spec.

    `name` replaces metadata.name (the live suite gives each mutant its own name).
    """
    rng = random.Random(seed)
    documents = [(label, doc) for label, doc in example_documents() if doc.get("kind") in kinds]
    label, original = rng.choice(documents)
    manifest = copy.deepcopy(original)
    if name is not None:
        manifest["metadata"] = {"name": name}
    spec = manifest.setdefault("spec", {})
    edits = tuple(_edit(rng, spec) for _ in range(rng.choice((1, 1, 2, 3))))
    return Mutant(seed, label, edits, manifest)


def support_objects() -> list[dict[str, Any]]:
    """The unmutated Agents, AgentProviders and ImplementationSpecs the examples refer to."""
    return [
        copy.deepcopy(doc)
        for _, doc in example_documents()
        if str(doc.get("apiVersion", "")).startswith(f"{GROUP}/") and doc.get("kind") != "AgentRun"
    ]


def example_claims() -> list[str]:
    """The PersistentVolumeClaims the example AgentRuns mount (a mutant may name another one)."""
    names: set[str] = set()
    for _, doc in example_documents():
        if doc.get("kind") == "AgentRun":
            for volume in ((doc.get("spec") or {}).get("workload") or {}).get("volumes") or []:
                if volume.get("claimName"):
                    names.add(str(volume["claimName"]))
    return sorted(names)


# ------------------------------------------------------------------------- whole files, every depth

ENVELOPE: Final[tuple[Path_, ...]] = (
    ("metadata",),
    ("metadata", "name"),
    ("kind",),
    ("apiVersion",),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "labels"),
    ("metadata", "annotations"),
    ("spec",),
)
"""Spots outside `spec` that every object has (or may have): hit on purpose, as often as the spec."""

SHAPES: Final[tuple[Any, ...]] = (
    0,
    "",
    [],
    {},
    None,
    "x" * 300,
    ["a"],
    ["a", "b"],
    {"name": "x"},
    True,
    1.5,
    -1,
    "UPPER_Case",
    "torghut-v3-<lane>-<yyyymmdd>",
    "line\nbreak",
)
"""Values of the wrong shape for any spot: the issue's list (0, "", [], {}, 300 characters) and
lists or mappings where a name goes."""

NOT_OBJECTS: Final[tuple[Any, ...]] = (0, "just a string", [], ["a", {"kind": "AgentRun"}], True, 1.5)


@dataclass(frozen=True)
class MutantFile:
    """A mutated multi-document file and how it came to be."""

    sources: tuple[str, ...]
    edits: tuple[str, ...]
    documents: tuple[Any, ...]

    def describe(self) -> str:
        return f"{', '.join(self.sources)}: {'; '.join(self.edits) or 'unchanged'}"

    def text(self) -> str:
        """The file as YAML (documents separated by `---`)."""
        return yaml.safe_dump_all(list(self.documents), allow_unicode=True, sort_keys=False)


@functools.cache
def valid_files() -> tuple[tuple[str, tuple[dict[str, Any], ...]], ...]:
    """(file name, its documents) of examples/*.yaml and tests/fixtures/compat/valid/*.yaml: every
    kind of ours, valid, and the references of each run resolvable within its own file."""
    out: list[tuple[str, tuple[dict[str, Any], ...]]] = []
    for path in sorted([*EXAMPLES.glob("*.yaml"), *VALID_FIXTURES.glob("*.yaml")]):
        docs = tuple(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if isinstance(d, dict))
        if docs:
            out.append((path.name, docs))
    return tuple(out)


def _label(doc: dict[str, Any]) -> str:
    name = (doc.get("metadata") or {}).get("name")
    return f"{doc.get('kind')}/{name}"


def _file_edit(rng: random.Random, documents: list[Any]) -> str:
    """One edit anywhere in one document of the file (the envelope as often as the spec)."""
    index = rng.randrange(len(documents))
    doc = documents[index]
    where = f"document {index + 1}"
    # Hypothesis' randoms lean to 0.0 and index 0: the likeliest branches come first.
    roll = rng.random()
    if not isinstance(doc, dict) or roll > 0.96:
        documents[index] = copy.deepcopy(rng.choice(NOT_OBJECTS))
        return f"{where} = {documents[index]!r:.40}"
    if roll > 0.92:
        documents.append(copy.deepcopy(doc))
        return f"{where} twice"
    spec = doc.get("spec")
    paths = [("spec", *p) for p in _paths(spec)] if isinstance(spec, (dict, list)) else []
    if roll < 0.4 or not paths:
        path = rng.choice(ENVELOPE)
    else:
        path = rng.choice(paths)
        if rng.random() < 0.5:  # the kind-aware edits of `_edit`, at this depth
            parent = _parent(doc, path)
            ops = _operations(parent, path[-1], parent[path[-1]])
            op = rng.choices([n for n, _ in ops], weights=[w for _, w in ops])[0]
            if op not in ("unknown", "list"):
                return f"{where}: {_edit_at(rng, parent, path, op)}"
    parent: Any = doc
    for part in path[:-1]:
        if isinstance(parent, dict) and isinstance(part, str):
            parent = parent.setdefault(part, {})  # e.g. labels, which the document may not have
        elif isinstance(parent, list) and isinstance(part, int) and part < len(parent):
            parent = parent[part]
        else:
            return f"{where}: no {_render(path)} (an earlier edit replaced its parent)"
    if isinstance(parent, list) and isinstance(path[-1], int):
        if rng.random() > 0.7:
            parent.pop(path[-1])
            return f"{where}: remove {_render(path)}"
        parent[path[-1]] = copy.deepcopy(rng.choice(SHAPES))
        return f"{where}: {_render(path)} = {parent[path[-1]]!r:.40}"
    if not isinstance(parent, dict):
        return f"{where}: no {_render(path)} (its parent is a {type(parent).__name__})"
    if rng.random() > 0.75:
        parent.pop(path[-1], None)
        return f"{where}: delete {_render(path)}"
    parent[path[-1]] = copy.deepcopy(rng.choice(SHAPES))
    return f"{where}: {_render(path)} = {parent[path[-1]]!r:.40}"


def _edit_at(rng: random.Random, parent: Any, path: Path_, op: str) -> str:
    """`_edit`'s type-keeping edits of one spot (a name-like value, a string cut, a number out of range)."""
    key = path[-1]
    value = parent[key]
    if op in ("delete", "remove"):
        parent.pop(key) if isinstance(parent, list) else parent.pop(key, None)
        return f"delete {_render(path)}"
    if op == "name":
        parent[key] = rng.choice([*NAME_LIKE, ["a"], {"name": "a"}])
    elif op == "string":
        parent[key] = rng.choice([value.upper(), value[: len(value) // 2], f"{value}_x", "x" * 300, ""])
    elif op == "number":
        parent[key] = rng.choice([0, -1, value - 1, value + 1, value * 1000, 10**12])
    else:
        parent[key] = copy.deepcopy(rng.choice(TROUBLEMAKERS))
    return f"{_render(path)} = {parent[key]!r:.40}"


def mutant_file(rng: random.Random) -> MutantFile:
    """A file of valid documents of every kind with 1-3 edits at any depth (see the module docstring)."""
    files = valid_files()
    documents: list[Any] = []
    sources: list[str] = []
    if rng.random() < 0.4:  # a whole file: an example's run with the objects it refers to
        name, docs = rng.choice(files)
        documents += [copy.deepcopy(d) for d in docs]
        sources.append(name)
    else:
        pool = [(name, d) for name, docs in files for d in docs if d.get("kind") in KINDS]
        for _ in range(rng.choice((1, 1, 2, 3, 4))):
            name, doc = rng.choice(pool)
            documents.append(copy.deepcopy(doc))
            sources.append(f"{name}/{_label(doc)}")
    edits = tuple(_file_edit(rng, documents) for _ in range(rng.choice((1, 1, 2, 3))))
    return MutantFile(tuple(sources), edits, tuple(documents))
