"""Generate the five CustomResourceDefinitions from the pydantic models (the single source of truth).

pydantic's JSON Schema is turned into a Kubernetes *structural* schema: `$ref`s are inlined,
`Optional[X]` (anyOf with null) collapses to X, `const` becomes `enum`, titles are dropped, and
free-form values get `x-kubernetes-preserve-unknown-fields`. Anything the apiserver would not accept
raises here, at generation time, instead of at `kubectl apply` time.
"""

from __future__ import annotations

import argparse
import copy
import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel

from . import rules
from .agentrun import AgentRunSpec
from .base import GROUP, VERSION
from .resources import AgentProviderSpec, AgentSpec, ImplementationSpecSpec, SimpleStatus
from .status import AgentRunStatus
from .vcs import VersionControlProviderSpec, VersionControlProviderStatus

HEADER: Final = (
    "# Generated from the pydantic models in agentrun_operator.api; do not edit by hand.\n"
    "# Regenerate with: agentrun crds --write crds/\n"
)

_ALLOWED_KEYS: Final = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "items",
        "additionalProperties",
        "enum",
        "default",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "format",
        "x-kubernetes-validations",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-int-or-string",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
    }
)


class SchemaError(ValueError):
    """The models produced a schema the apiserver would reject (a bug in the models)."""


@dataclass(frozen=True)
class KindInfo:
    """Everything about one kind that is not in its models."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    description: str
    spec_model: type[BaseModel]
    status_model: type[BaseModel]
    printer_columns: tuple[dict[str, str], ...] = ()
    immutable_spec_except: tuple[str, ...] | None = None
    """When set, the spec is immutable after creation except these fields."""
    extra_spec_rules: tuple[rules.Rule, ...] = field(default=())

    @property
    def singular(self) -> str:
        """Lower-case kind, as Kubernetes expects."""
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        """`<plural>.<group>`."""
        return f"{self.plural}.{GROUP}"

    @property
    def filename(self) -> str:
        """`<group>_<plural>.yaml`, the controller-gen convention."""
        return f"{GROUP}_{self.plural}.yaml"


def _column(name: str, kind: str, json_path: str, description: str) -> dict[str, str]:
    """One `additionalPrinterColumns` entry (what `kubectl get` shows)."""
    return {"name": name, "type": kind, "jsonPath": json_path, "description": description}


_AGE: Final = _column("Age", "date", ".metadata.creationTimestamp", "Time since the object was created.")


def _referenced_kind(
    kind: str,
    plural: str,
    short_name: str,
    description: str,
    spec_model: type[BaseModel],
    column: dict[str, str],
    status_model: type[BaseModel] = SimpleStatus,
) -> KindInfo:
    """A kind that runs only name (Agent, AgentProvider, ImplementationSpec, VersionControlProvider):
    a spec, a reserved status, one column of its own before the age."""
    return KindInfo(
        kind=kind,
        plural=plural,
        short_names=(short_name,),
        description=description,
        spec_model=spec_model,
        status_model=status_model,
        printer_columns=(column, _AGE),
    )


KINDS: Final[tuple[KindInfo, ...]] = (
    KindInfo(
        kind="AgentRun",
        plural="agentruns",
        short_names=("ar",),
        description=(
            "AgentRun runs a workflow of steps as Kubernetes Jobs; a step may loop, each iteration "
            "continuing from the filesystem state the previous one left on a shared PVC."
        ),
        spec_model=AgentRunSpec,
        status_model=AgentRunStatus,
        # The original API's columns first (dashboards and scripts read them), then ours.
        printer_columns=(
            _column("Phase", "string", ".status.phase", "Phase of the run."),
            _column("Agent", "string", ".spec.agentRef.name", "The Agent the run uses."),
            _column(
                "Succeeded",
                "string",
                '.status.conditions[?(@.type=="Succeeded")].status',
                "The Succeeded condition: True, False or Unknown (still running).",
            ),
            _column(
                "Reason",
                "string",
                '.status.conditions[?(@.type=="Succeeded")].reason',
                "Reason of the phase, e.g. InvalidSpec.",
            ),
            _column("StartTime", "date", ".status.startedAt", "When the first Job was created."),
            _column("CompletionTime", "date", ".status.finishedAt", "When the run finished."),
            _column("Runtime", "string", ".spec.runtime.type", "workflow or job."),
            _column("Step", "string", ".status.currentStep", "Active step, or the last one run."),
            _column(
                "Iteration",
                "string",
                ".status.iteration",
                "Iteration of the current looped step, current/max.",
            ),
            _AGE,
        ),
        immutable_spec_except=("cancel", "approvals"),
        extra_spec_rules=(rules.CANCEL_STICKY, rules.APPROVALS_STICKY),
    ),
    _referenced_kind(
        "Agent",
        "agents",
        "ag",
        "Agent names an AgentProvider plus environment and step defaults for runs that use it.",
        AgentSpec,
        _column("Provider", "string", ".spec.providerRef.name", "The AgentProvider."),
    ),
    _referenced_kind(
        "AgentProvider",
        "agentproviders",
        "agp",
        "AgentProvider says how to launch an agent: image, command, args and environment, or the "
        "runner contract (binary, argsTemplate, envTemplate, inputFiles, outputArtifacts, secretEnv).",
        AgentProviderSpec,
        _column("Image", "string", ".spec.image", "Container image."),
    ),
    _referenced_kind(
        "ImplementationSpec",
        "implementationspecs",
        "impl",
        "ImplementationSpec holds a reusable task text (at most 128 KiB) and its checks.",
        ImplementationSpecSpec,
        _column("Summary", "string", ".spec.summary", "Task summary."),
    ),
    _referenced_kind(
        "VersionControlProvider",
        "versioncontrolproviders",
        "vcp",
        "VersionControlProvider says where a run's repository lives and how its pods reach it.",
        VersionControlProviderSpec,
        _column("Provider", "string", ".spec.provider", "github, gitlab, bitbucket, gitea or generic."),
        VersionControlProviderStatus,
    ),
)

CATEGORIES: Final = ("agents",)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` wins, except that CEL rule lists of a model and of the field using it are concatenated."""
    out = dict(base)
    for key, value in over.items():
        if key == "x-kubernetes-validations" and key in out:
            out[key] = [*out[key], *value]
        else:
            out[key] = value
    return out


_NESTED_STEP: Final = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "description": (
        "A child step with the fields of a step; the apiserver stores it as given and the operator "
        "validates it (at any depth) before the first Job."
    ),
}


def _convert(
    node: dict[str, Any], defs: dict[str, Any], path: str, expanding: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Turn one pydantic JSON Schema node into a structural OpenAPI v3 node.

    A schema cannot be recursive, so a model met again inside itself (a step's child steps) is
    stored free-form one level down and checked by the models instead.
    """
    node = copy.deepcopy(node)
    if "$ref" in node:
        name = node.pop("$ref").rsplit("/", 1)[-1]
        if name in expanding:
            return dict(_NESTED_STEP)
        target = copy.deepcopy(defs[name])
        # The model's docstring is for developers; the field's description is for users.
        target.pop("description", None)
        return _convert(_merge(target, node), defs, path, (*expanding, name))
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o != {"type": "null"}]
        if len(options) != 1:
            raise SchemaError(f"{path}: unions other than Optional[X] are not structural: {options}")
        if node.get("default", ...) is None:
            node.pop("default")
        return _convert(_merge(options[0], node), defs, path, expanding)
    for key in ("allOf", "oneOf", "not"):
        if key in node:
            raise SchemaError(f"{path}: {key} is not supported in the generated schemas")

    node.pop("title", None)
    if node.get("default", ...) is None:
        node.pop("default")
    if "const" in node:
        node["enum"] = [node.pop("const")]

    extra = node.pop("additionalProperties", None)
    if extra is True:
        node["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(extra, dict):
        node["additionalProperties"] = _convert(extra, defs, f"{path}.*", expanding)

    if "properties" in node:
        props: dict[str, Any] = {}
        for key, sub in node["properties"].items():
            converted = _convert(sub, defs, f"{path}.{key}", expanding)
            if not converted.get("description"):
                raise SchemaError(f"{path}.{key}: every field needs a description (kubectl explain shows it)")
            props[key] = converted
        node["properties"] = props
        if node.get("x-kubernetes-preserve-unknown-fields"):
            pass
        elif not node.get("required"):
            node.pop("required", None)
    if "items" in node:
        node["items"] = _convert(node["items"], defs, f"{path}[]", expanding)

    if not node.get("type") and not node.get("x-kubernetes-int-or-string"):
        if set(node) - {"description", "default"}:
            raise SchemaError(f"{path}: schema without a type: {node}")
        node["x-kubernetes-preserve-unknown-fields"] = True

    unknown = set(node) - _ALLOWED_KEYS
    if unknown:
        raise SchemaError(f"{path}: keys not allowed in a CRD schema: {sorted(unknown)}")
    return node


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural schema of a model, as it appears under `spec` or `status`."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    raw.pop("description", None)
    return _convert(raw, defs, model.__name__)


def _spec_schema(info: KindInfo) -> dict[str, Any]:
    spec = openapi_schema(info.spec_model)
    spec["description"] = f"Desired state of the {info.kind}."
    if info.immutable_spec_except is not None:
        fields = [f for f in spec["properties"] if f not in info.immutable_spec_except]
        for name in fields:
            prop = spec["properties"][name]
            prop["x-kubernetes-validations"] = [
                *prop.get("x-kubernetes-validations", []),
                rules.immutable_field(name).crd(),
            ]
        spec["x-kubernetes-validations"] = [
            *spec.get("x-kubernetes-validations", []),
            rules.immutable_presence(fields).crd(),
        ]
        spec["description"] = (
            f"Desired state of the {info.kind}; immutable after creation except "
            + ", ".join(f"spec.{f}" for f in info.immutable_spec_except)
            + "."
        )
    if info.extra_spec_rules:
        spec["x-kubernetes-validations"] = [
            *spec.get("x-kubernetes-validations", []),
            *(r.crd() for r in info.extra_spec_rules),
        ]
    return spec


def crd_for(info: KindInfo) -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of one kind."""
    status = openapi_schema(info.status_model)
    status["description"] = f"Observed state of the {info.kind}, written by the operator."
    root: dict[str, Any] = {
        "type": "object",
        "description": info.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "APIVersion of this representation: agents.proompteng.ai/v1alpha1.",
            },
            "kind": {"type": "string", "description": f"Kind of this object: {info.kind}."},
            "metadata": {"type": "object"},
            "spec": _spec_schema(info),
            "status": status,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": info.crd_name,
            "labels": {
                "app.kubernetes.io/name": "agentrun-operator",
                "app.kubernetes.io/part-of": "agentrun",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": info.kind,
                "listKind": f"{info.kind}List",
                "plural": info.plural,
                "singular": info.singular,
                "shortNames": list(info.short_names),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in info.printer_columns],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


@functools.cache
def _crd_documents() -> tuple[dict[str, Any], ...]:
    """Generated once per process: pydantic's schema generation is the slow part."""
    return tuple(crd_for(info) for info in KINDS)


def crd_documents() -> list[dict[str, Any]]:
    """The five CRDs, AgentRun first. Fresh copies: callers may mutate them."""
    return copy.deepcopy(list(_crd_documents()))


def crd_filename(crd: dict[str, Any]) -> str:
    """`<group>_<plural>.yaml` for a CRD document."""
    return f"{crd['spec']['group']}_{crd['spec']['names']['plural']}.yaml"


class _NoAliasDumper(yaml.SafeDumper):
    """Never emit `&id001` anchors: repeated fragments are written out in full for readers and diffs."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_crd_yaml(crd: dict[str, Any]) -> str:
    """One CRD as YAML with the generated-file header; deterministic (sorted keys) so drift is diffable."""
    body = yaml.dump(
        crd,
        Dumper=_NoAliasDumper,
        sort_keys=True,
        default_flow_style=False,
        width=100,
        allow_unicode=True,
    )
    return HEADER + body


def render_crds_yaml() -> str:
    """All five CRDs as one multi-document YAML stream (what `agentrun crds` prints)."""
    return "".join(f"---\n{render_crd_yaml(crd)}" for crd in crd_documents())


def write_crds(directory: Path) -> list[Path]:
    """Write one file per CRD into `directory` (created if missing); returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for crd in crd_documents():
        path = directory / crd_filename(crd)
        path.write_text(render_crd_yaml(crd), encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m agentrun_operator.api.crd [--write DIR]`: same output as `agentrun crds`."""
    parser = argparse.ArgumentParser(prog="python -m agentrun_operator.api.crd", description=main.__doc__)
    parser.add_argument("--write", type=Path, metavar="DIR", help="write one file per CRD into DIR")
    args = parser.parse_args(argv)
    if args.write is not None:
        for path in write_crds(args.write):
            print(path)
    else:
        sys.stdout.write(render_crds_yaml())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
