"""Render the field reference of docs/api.md from the generated CRD schemas.

The prose of docs/api.md is written by hand; the tables of fields, defaults, limits and validation
messages are generated between two marker comments so they can never drift from the models (a unit
test compares them). Regenerate with `python -m agentrun_operator.api.docs --write docs/api.md`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from .crd import KINDS, crd_documents

BEGIN: Final = (
    "<!-- BEGIN GENERATED FIELD REFERENCE (python -m agentrun_operator.api.docs --write docs/api.md) -->"
)
END: Final = "<!-- END GENERATED FIELD REFERENCE -->"


def _type_of(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "int or string"
    kind = node.get("type")
    if kind == "array":
        return f"[]{_type_of(node['items'])}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type_of(node['additionalProperties'])}"
    if kind == "object" and node.get("x-kubernetes-preserve-unknown-fields") and "properties" not in node:
        return "object (free-form JSON)"
    if kind is None and node.get("x-kubernetes-preserve-unknown-fields"):
        return "any JSON"
    return str(kind)


def _limits(node: dict[str, Any], required: bool) -> str:
    parts: list[str] = []
    if required:
        parts.append("**required**")
    if "enum" in node:
        parts.append("one of " + ", ".join(f"`{v}`" if v else "`''`" for v in node["enum"]))
    for key, label in (
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("maxProperties", "max entries"),
    ):
        if key in node:
            parts.append(f"{label} {node[key]}")
    if "pattern" in node and not node.get("x-kubernetes-int-or-string"):
        parts.append(f"pattern `{node['pattern']}`")
    if node.get("x-kubernetes-list-type") in ("set", "map"):
        keys = node.get("x-kubernetes-list-map-keys")
        parts.append("unique" + (f" by `{', '.join(keys)}`" if keys else ""))
    return "; ".join(parts)


def _escape(text: str) -> str:
    """Make text safe in a table cell (outside code spans)."""
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str) -> str:
    """Make text safe in a code span inside a table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any], bool]]:
    required = set(node.get("required", []))
    for key in sorted(node.get("properties", {})):
        sub = node["properties"][key]
        sub_path = f"{path}.{key}"
        yield sub_path, sub, key in required
        yield from _children(sub, sub_path)


def _children(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any], bool]]:
    if "properties" in node:
        yield from _rows(node, path)
    elif node.get("type") == "array" and "properties" in node.get("items", {}):
        yield from _rows(node["items"], f"{path}[]")


def _table(root: dict[str, Any], top: str) -> list[str]:
    lines = ["| Field | Type | Default | Limits | Description |", "|---|---|---|---|---|"]
    node = root["properties"][top]
    for path, sub, required in _rows(node, top):
        default = f"`{_code(json.dumps(sub['default']))}`" if "default" in sub else ""
        lines.append(
            f"| `{path}` | {_escape(_type_of(sub))} | {default} | "
            f"{_escape(_limits(sub, required))} | {_escape(sub.get('description', ''))} |"
        )
    return lines


def _rules(root: dict[str, Any]) -> list[str]:
    lines = ["| Where | Rule (CEL) | Message |", "|---|---|---|"]

    def walk(node: dict[str, Any], path: str) -> None:
        for rule in node.get("x-kubernetes-validations", []):
            where = path + rule.get("fieldPath", "")
            lines.append(f"| `{where}` | `{_code(rule['rule'])}` | {_escape(rule['message'])} |")
        for key in sorted(node.get("properties", {})):
            walk(node["properties"][key], f"{path}.{key}")
        if node.get("type") == "array":
            walk(node["items"], f"{path}[]")

    walk(root["properties"]["spec"], "spec")
    return lines


def render_reference() -> str:
    """The generated part of docs/api.md, markers included."""
    out = [BEGIN, ""]
    crds = {c["spec"]["names"]["kind"]: c for c in crd_documents()}
    for info in KINDS:
        root = crds[info.kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        out += [f'### {info.kind} fields <a id="fields-{info.kind.lower()}"></a>', ""]
        out += [_escape(root["description"]), ""]
        out += [*_table(root, "spec"), ""]
        out += [f"#### {info.kind} status", "", *_table(root, "status"), ""]
        if any(True for _ in _iter_rules(root["properties"]["spec"])):
            out += [f"#### {info.kind} validation rules (enforced by the apiserver and by the models)", ""]
            out += [*_rules(root), ""]
    out.append(END)
    return "\n".join(out) + "\n"


def _iter_rules(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from node.get("x-kubernetes-validations", [])
    for sub in node.get("properties", {}).values():
        yield from _iter_rules(sub)
    if "items" in node:
        yield from _iter_rules(node["items"])


def update_document(text: str) -> str:
    """Replace the generated block of a document (which must contain both markers)."""
    start = text.index(BEGIN)
    end = text.index(END) + len(END)
    return text[:start] + render_reference().rstrip("\n") + text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m agentrun_operator.api.docs [--write docs/api.md]`: print or update the reference."""
    parser = argparse.ArgumentParser(prog="python -m agentrun_operator.api.docs", description=main.__doc__)
    parser.add_argument(
        "--write", type=Path, metavar="FILE", help="update the generated block of FILE in place"
    )
    args = parser.parse_args(argv)
    if args.write is None:
        print(render_reference(), end="")
        return 0
    path: Path = args.write
    path.write_text(update_document(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
