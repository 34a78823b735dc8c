"""Seeded mutations of the example manifests: the fuzz suite's input, reproducible from a seed.

`mutant(seed)` picks an example document of examples/*.yaml and applies 1-3 random edits (most often
one) anywhere in its `spec`: delete a field, replace a value by one of a list of troublemakers (empty
strings, upper case, huge numbers, wrong types, …), edit a string or a number near its valid range,
add an unknown field, duplicate or empty a list, rename a name-like field. The same seed always gives the
same manifest (`random.Random(seed)`, examples read in sorted order), so a failing case is replayed
with `AGENTRUN_FUZZ_SEED=…` (see docs/development.md#fuzz).
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
