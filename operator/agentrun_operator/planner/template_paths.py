"""Template paths of the runner contract that name nothing (docs/api.md#runner-templates).

A provider's `argsTemplate`, `envTemplate` values and `inputFiles` (path and content) may hold
`{{ a.b.c }}`: a dotted lookup in the template context. A path that names nothing renders as the
empty string (as in the original controller), which is easy to miss, so `agentrun validate` warns
about each one. What the context holds is fixed here (`CONTEXT`); a key whose value is free-form
(`agent.config`, `parameters`, `inputs`, `memory`, `vcs`, the task's `source` and `contract`) accepts
any path below it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Final

from agentrun_operator.api.resources import AgentProviderSpec

FREE: Final = None
"""Marks a context key whose value is free-form: any path below it may name something."""

CONTEXT: Final[dict[str, dict[str, object] | None]] = {
    "agentRun": {"name": FREE, "uid": FREE, "namespace": FREE},
    "agent": {"name": FREE, "config": FREE, "env": FREE},
    "implementation": {
        "text": FREE,
        "summary": FREE,
        "description": FREE,
        "acceptanceCriteria": FREE,
        "labels": FREE,
        "source": FREE,
        "vcsRef": FREE,
        "contract": FREE,
    },
    "parameters": FREE,
    "inputs": FREE,
    "memory": FREE,
    "vcs": FREE,
}
"""The template context's top-level keys and what lies below them."""

_TEMPLATE: Final = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_DOTTED: Final = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*$")


def template_paths(text: str) -> list[str]:
    """Every `{{ … }}` expression of a template, stripped."""
    return [m.group(1) for m in _TEMPLATE.finditer(text)]


def unknown_reason(path: str) -> str | None:
    """Why `path` names nothing in the context, or None when it may name something."""
    if not _DOTTED.fullmatch(path):
        return "is not a dotted path (a.b.c)"
    parts = path.split(".")
    node: Mapping[str, object] | None = CONTEXT
    for depth, part in enumerate(parts):
        if node is None:
            return None
        if part not in node:
            where = ".".join(parts[:depth]) or "the context"
            known = ", ".join(sorted(node))
            return f"names nothing: {where} has no {part!r} (it has {known})"
        below = node[part]
        node = below if isinstance(below, Mapping) else None
    return None


def provider_template_warnings(spec: AgentProviderSpec, prefix: str = "spec") -> Iterator[tuple[str, str]]:
    """(field path, warning) for each template path of a provider that names nothing."""
    fields: list[tuple[str, str]] = [
        (f"{prefix}.argsTemplate[{i}]", a) for i, a in enumerate(spec.args_template or [])
    ]
    fields += [(f"{prefix}.envTemplate.{k}", v) for k, v in (spec.env_template or {}).items()]
    for i, item in enumerate(spec.input_files or []):
        fields += [
            (f"{prefix}.inputFiles[{i}].path", item.path),
            (f"{prefix}.inputFiles[{i}].content", item.content),
        ]
    for field, text in fields:
        for path in template_paths(text):
            reason = unknown_reason(path)
            if reason is not None:
                yield field, f"template {{{{ {path} }}}} {reason}; it renders as the empty string"
