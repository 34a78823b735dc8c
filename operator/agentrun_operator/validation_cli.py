"""`agentrun validate FILE…`: the operator's own validation, offline, with one actionable line per problem.

Every YAML document of our API group is checked with its own model (AgentRun, Agent, AgentProvider,
ImplementationSpec, VersionControlProvider); AgentRuns also get every rule the operator applies
before the first Job except those that need the cluster (referenced objects). Documents of other
groups (a PVC next to the run, say) are skipped. Output, one line per problem:

    FILE: AgentRun/NAME: field.path: message (value: …; fix: …; see docs/…#anchor)

An AgentRun whose Agent (and its AgentProvider) and ImplementationSpecs are in the same file also
gets the rules that need them (the Agent's allow lists, the task contract, the runner contract's
task), as the operator applies them before the first Job.

An AgentProvider's template paths (`{{ a.b.c }}`) that name nothing in the template context are
warnings (they render as the empty string; docs/api.md#runner-templates), one line each, without
changing the exit status:

    FILE: AgentProvider/NAME: warning: field.path: template {{ … }} names nothing: …

Exit status: 0 when everything is valid, 1 when any problem (or unreadable file) was found.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from agentrun_operator.api import GROUP, AgentRun
from agentrun_operator.api.resources import AgentProvider
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner import compat
from agentrun_operator.planner.envelope import type_problems
from agentrun_operator.planner.observed import Observed
from agentrun_operator.planner.template_paths import provider_template_warnings
from agentrun_operator.planner.validate import Problem, resolve_references, validate_manifest
from agentrun_operator.planner.validate_compat import compat_problems
from agentrun_operator.webhook import problem_line

_MAX_LABEL = 253  # the longest valid name


@dataclass(frozen=True)
class _Document:
    source: str
    index: int  # 0-based position in the file, for documents without a name
    body: Any


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    return Path(path).read_text(encoding="utf-8")


def _documents(path: str, text: str) -> Iterator[_Document]:
    for index, body in enumerate(yaml.safe_load_all(text)):
        if body is not None:
            yield _Document(path, index, body)


def _label(doc: _Document) -> str:
    """`Kind/name` of a document, or `Kind (document N)` when it has no usable name: a name that is
    not a short single-line string (a list, 300 characters, a space) would break the one-line
    output, and its own problem line shows it."""
    body = doc.body if isinstance(doc.body, dict) else {}
    kind = body.get("kind")
    kind = kind if isinstance(kind, str) and kind and _printable(kind) else "?"
    metadata = body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if isinstance(name, str) and name and _printable(name):
        return f"{kind}/{name}"
    return f"{kind} (document {doc.index + 1})"


def _printable(text: str) -> bool:
    return len(text) <= _MAX_LABEL and not any(c.isspace() or not c.isprintable() for c in text)


def _is_ours(body: Any) -> bool:
    api_version = body.get("apiVersion") if isinstance(body, dict) else None
    return isinstance(api_version, str) and api_version.split("/", 1)[0] == GROUP


def _not_an_object(doc: _Document) -> Problem:
    return Problem(
        "(document)",
        type(doc.body).__name__,
        "is not a Kubernetes object (a mapping with apiVersion and kind)",
        "remove the document or write it as an object",
        "docs/api.md",
    )


def check_file(path: str, config: OperatorConfig, out: TextIO) -> tuple[int, int]:
    """Validate every document of `path`, printing each problem; returns (objects checked, problems)."""
    try:
        documents = list(_documents(path, _read(path)))
    except OSError as exc:
        print(f"{path}: cannot read the file: {exc.strerror or exc}", file=out)
        return 0, 1
    except yaml.YAMLError as exc:
        print(f"{path}: not valid YAML: {' '.join(str(exc).split())}", file=out)
        return 0, 1
    checked = problems = 0
    results: list[tuple[_Document, list[Problem]]] = []
    for doc in documents:
        if not isinstance(doc.body, dict):
            results.append((doc, [_not_an_object(doc)]))
        elif untyped := type_problems(doc.body):  # kubectl would refuse it before any group's rules
            checked += 1
            results.append((doc, untyped))
        elif _is_ours(doc.body):
            checked += 1
            results.append((doc, validate_manifest(doc.body, config)))
    # Only objects that are valid on their own can satisfy a run's references.
    neighbours = _objects_by_kind([doc for doc, found in results if not found])
    for doc, found in results:
        if not found and doc.body.get("kind") == "AgentRun":
            found = _reference_problems(doc.body, neighbours)
        for problem in found:
            print(f"{path}: {problem_line(_label(doc), problem)}", file=out)  # as the webhook says it
            problems += 1
        if isinstance(doc.body, dict):
            for field, warning in _warnings(doc.body):
                print(f"{path}: {_label(doc)}: warning: {field}: {warning}", file=out)
    return checked, problems


def _objects_by_kind(documents: list[_Document]) -> dict[str, dict[str, dict[str, Any] | None]]:
    """The specs of the file's Agents, AgentProviders, ImplementationSpecs and VersionControlProviders,
    by kind and name; `documents` passed `validate_manifest` (a mapping metadata with a string name,
    a mapping spec)."""
    found: dict[str, dict[str, dict[str, Any] | None]] = {
        "Agent": {},
        "AgentProvider": {},
        "ImplementationSpec": {},
        "VersionControlProvider": {},
    }
    for doc in documents:
        kind = doc.body.get("kind")
        name = (doc.body.get("metadata") or {}).get("name")
        if kind in found and isinstance(name, str):
            found[kind][name] = dict(doc.body.get("spec") or {})
    return found


def _reference_problems(
    body: dict[str, Any], neighbours: dict[str, dict[str, dict[str, Any] | None]]
) -> list[Problem]:
    """The operator's rules that need the referenced objects, when the file holds all of them."""
    run = AgentRun.model_validate(body)
    observed = Observed(
        agents=neighbours["Agent"],
        providers=neighbours["AgentProvider"],
        implementation_specs=neighbours["ImplementationSpec"],
        vcs_providers=neighbours["VersionControlProvider"],
    )
    resolution = resolve_references(run, observed)
    if resolution.problems:  # not all in this file: the operator checks them in the cluster
        return []
    # The runner contract's files and artifacts, and version control (Secrets are not checked
    # offline; a VersionControlProvider not in this file is the cluster's to check).
    runner = [p for p in compat_problems(run, resolution.refs) if p.missing is None]
    return [*compat.reference_problems(run, resolution.refs), *runner]


def _warnings(body: dict[str, Any]) -> list[tuple[str, str]]:
    """Template paths of a (valid) AgentProvider that name nothing."""
    if body.get("kind") != "AgentProvider":
        return []
    try:
        provider = AgentProvider.model_validate(body)
    except ValidationError:
        return []
    return list(provider_template_warnings(provider.spec))


def main(paths: list[str], loops_enabled: bool = True, max_iterations: int | None = None) -> int:
    """Validate the files as this installation would; `max_iterations` is its cap (default 20)."""
    defaults = OperatorConfig()
    config = OperatorConfig(
        loops_enabled=loops_enabled,
        loop_max_iterations=max_iterations if max_iterations is not None else defaults.loop_max_iterations,
    )
    checked = problems = 0
    for path in paths:
        file_checked, file_problems = check_file(path, config, sys.stdout)
        checked += file_checked
        problems += file_problems
    if problems:
        print(f"{problems} problem(s) found in {len(paths)} file(s)", file=sys.stderr)
        return 1
    print(f"{checked} object(s) valid", file=sys.stderr)
    return 0
