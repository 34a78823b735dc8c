"""The shape of an object's envelope — `kind` and `metadata` — checked before its kind's model sees it.

Every document `agentrun validate` reads and every object the webhook reviews passes here first, so
the per-kind rules only ever see a mapping with a known kind and a `metadata` the API server would
store. The name rules are the API server's own for custom resources (docs/api.md#metadata-name):
`metadata.name` (or, without one, `metadata.generateName`) is a lowercase RFC 1123 subdomain of at
most 253 characters; `metadata.namespace` a DNS label. Every kind of ours takes every such name: the
Jobs, pods, ConfigMaps and labels derived from an AgentRun's name are cut and hashed to fit
(naming.job_name, naming.label_value, runner_contract.config_map_name).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from agentrun_operator.api.base import API_VERSION, DNS_LABEL_MAX, DNS_LABEL_PATTERN, DOCS_API
from agentrun_operator.problem import Problem, api

DNS_SUBDOMAIN_MAX: Final = 253
_DNS_SUBDOMAIN: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL: Final = re.compile(DNS_LABEL_PATTERN)
DOCS_NAME: Final = api("metadata-name")
DOCS_METADATA: Final = api("metadata")

_SUBDOMAIN_RULE: Final = (
    "must be a lowercase RFC 1123 subdomain, as the API server requires: at most 253 characters of "
    "a-z, 0-9, '-' and '.', starting and ending with a letter or digit"
)


def suggested_name(value: str, limit: int = DNS_SUBDOMAIN_MAX) -> str:
    """A valid name close to `value`: lower case, every other character a '-', runs of '-' and
    '.' collapsed, trimmed to `limit` (`torghut-v3-<lane>-<yyyymmdd>` -> `torghut-v3-lane-yyyymmdd`)."""
    text = re.sub(r"[^a-z0-9.]+", "-", value.lower())
    text = re.sub(r"-*\.[-.]*", ".", text)  # no empty dot-separated parts, no '-' next to a '.'
    text = text.strip("-.")[:limit].rstrip("-.")
    return text or "my-object"


def subdomain_problem(path: str, value: str, *, prefix: bool = False) -> Problem | None:
    """The API server's NameIsDNSSubdomain: a prefix (`generateName`) may end in '-'."""
    checked = value[:-1] + "a" if prefix and value.endswith("-") else value
    if len(value) <= DNS_SUBDOMAIN_MAX and _DNS_SUBDOMAIN.match(checked):
        return None
    example = suggested_name(value) + ("-" if prefix else "")
    return Problem(path, value, _SUBDOMAIN_RULE, f"rename it, e.g. {example!r}", DOCS_NAME)


def _not_text(path: str, value: Any, what: str) -> Problem:
    return Problem(path, value, f"must be a string ({what})", f"write {path} as a string", DOCS_NAME)


def _string_map_problems(metadata: Mapping[Any, Any], key: str) -> list[Problem]:
    """`labels` and `annotations`: a mapping of strings to strings, as ObjectMeta declares them."""
    value = metadata.get(key)
    path = f"metadata.{key}"
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [
            Problem(
                path,
                value,
                "must be a mapping of strings to strings",
                f'write {path} as key: "value" pairs',
                DOCS_METADATA,
            )
        ]
    return [
        Problem(f"{path}.{k}", v, "must be a string", f"quote the value of {path}.{k}", DOCS_METADATA)
        for k, v in value.items()
        if not isinstance(v, str)
    ]


def type_problems(obj: Mapping[str, Any]) -> list[Problem]:
    """`apiVersion` and `kind`, without which no client sends the object (kubectl: "apiVersion not
    set"): both non-empty strings. Which group and kind they name is the caller's to judge."""
    return [
        Problem(
            field,
            obj.get(field),
            "must be a non-empty string: every Kubernetes object names its " + what,
            f"set {field}, e.g. {field}: {example}",
            DOCS_API,
        )
        for field, what, example in (
            ("apiVersion", "API group and version", API_VERSION),
            ("kind", "kind", "AgentRun"),
        )
        if not isinstance(obj.get(field), str) or not obj.get(field)
    ]


def metadata_problems(obj: Mapping[str, Any]) -> list[Problem]:
    """What the API server would refuse in `obj["metadata"]` (a mapping, its name, namespace, labels
    and annotations), before any rule of the object's kind."""
    metadata = obj.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        return [
            Problem(
                "metadata",
                metadata,
                "must be a mapping with at least a name",
                "write metadata as e.g. {name: my-object}",
                DOCS_METADATA,
            )
        ]
    problems: list[Problem] = []
    name = metadata.get("name")
    generate = metadata.get("generateName")
    if name is not None and not isinstance(name, str):
        problems.append(_not_text("metadata.name", name, "the object's name"))
    elif name:
        problems += [p for p in [subdomain_problem("metadata.name", name)] if p]
    if generate is not None and not isinstance(generate, str):
        problems.append(_not_text("metadata.generateName", generate, "a name prefix"))
    elif generate:
        problems += [p for p in [subdomain_problem("metadata.generateName", generate, prefix=True)] if p]
    if not name and not generate and not problems:
        problems.append(
            Problem(
                "metadata.name",
                name,
                "is required (or metadata.generateName)",
                "add metadata.name, e.g. name: my-object",
                DOCS_NAME,
            )
        )
    namespace = metadata.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        problems.append(_not_text("metadata.namespace", namespace, "a namespace's name"))
    elif namespace and (len(namespace) > DNS_LABEL_MAX or not _DNS_LABEL.match(namespace)):
        problems.append(
            Problem(
                "metadata.namespace",
                namespace,
                "must be a DNS label (a namespace's name): at most 63 characters of a-z, 0-9 and '-', "
                "starting and ending with a letter or digit",
                "correct the namespace, or leave it out and use kubectl's -n",
                DOCS_NAME,
            )
        )
    problems += _string_map_problems(metadata, "labels")
    problems += _string_map_problems(metadata, "annotations")
    return problems
