"""The Helm chart's files, without a cluster: CRD drift, versions, values against their schema, and
the environment names the Deployment sets against the ones the operator reads."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from agentrun_operator.config import DEFAULT_REPORTER_IMAGE, PREFIXES

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentrun-operator"
KOPF_PEERING_CRDS = "kopf.dev_peerings.yaml"
REGENERATE = "run `make crds` (writes crds/ and charts/agentrun-operator/crds/)"


def test_chart_crds_are_byte_identical_to_the_generated_ones() -> None:
    ours = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert ours, "crds/ is empty"
    assert set(chart) == set(ours) | {KOPF_PEERING_CRDS}, f"{sorted(chart)} vs {sorted(ours)}; {REGENERATE}"
    for name, content in ours.items():
        assert chart[name] == content, f"charts/agentrun-operator/crds/{name} drifted; {REGENERATE}"


def test_kopf_peering_crds_are_the_resources_the_operator_reads() -> None:
    """kopf's documented peering resources (kopf.dev/v1 `ClusterKopfPeering`, `KopfPeering`), which
    the operator also reads itself (shell/peering.py)."""
    from agentrun_operator.shell.peering import PEERING_API, Peering

    docs = list(yaml.safe_load_all((CHART / "crds" / KOPF_PEERING_CRDS).read_text()))
    served = {
        (d["spec"]["group"], v["name"], d["spec"]["names"]["plural"], d["spec"]["scope"])
        for d in docs
        for v in d["spec"]["versions"]
        if v["served"]
    }
    group, version = PEERING_API.removeprefix("/apis/").split("/")
    for namespaces, scope in (((), "Cluster"), (("ns",), "Namespaced")):
        plural = Peering("me", 1, "p", namespaces).plural
        assert (group, version, plural, scope) in served
    for d in docs:  # kopf merge-patches `.status` on the object itself: no status subresource
        assert all("subresources" not in v for v in d["spec"]["versions"])


def test_chart_versions_follow_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == version
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # The operator's built-in reporter default is the chart's default image.
    assert f"{values['image']['repository']}:{chart['appVersion']}" == DEFAULT_REPORTER_IMAGE


def _validate(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The subset of JSON Schema draft-07 that values.schema.json uses."""
    errors: list[str] = []
    kinds = {
        "object": dict,
        "array": list,
        "string": str,
        "boolean": bool,
        "integer": int,
        "number": (int, float),
        "null": type(None),
    }
    expected = schema.get("type")
    if expected is not None:
        wanted = expected if isinstance(expected, list) else [expected]  # e.g. ["integer", "null"]
        ok = any(
            isinstance(value, kinds[kind]) and not (kind in ("integer", "number") and isinstance(value, bool))
            for kind in wanted
        )
        if not ok:
            return [f"{path or '/'}: want {' or '.join(wanted)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: below {schema['minimum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            errors.append(f"{path}: not above {schema['exclusiveMinimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: above {schema['maximum']}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, item in value.items():
            if key in props:
                errors += _validate(item, props[key], f"{path}/{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}/{key}: not in the schema")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += _validate(item, schema["additionalProperties"], f"{path}/{key}")
        errors += [f"{path}/{r}: required" for r in schema.get("required", []) if r not in value]
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += _validate(item, schema["items"], f"{path}/{i}")
    return errors


def test_default_values_satisfy_the_schema_and_every_key_is_declared() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert _validate(values, schema) == []
    declared = set(schema["properties"]) - {"global"}
    assert declared == set(values), "values.yaml and values.schema.json list the same top-level keys"


def test_schema_validator_catches_what_helm_would() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert _validate({"replicas": "two"}, schema) == ["/replicas: want integer, got str"]
    assert _validate({"loop": {}}, schema) == ["/loop: not in the schema"]


def test_deployment_sets_only_variables_the_operator_reads() -> None:
    template = (CHART / "templates" / "deployment.yaml").read_text()
    names = set(re.findall(r"- name: (AGENTS_[A-Z_]+)", template))
    config = (REPO / "operator" / "agentrun_operator" / "config.py").read_text()
    read = {PREFIXES[0] + n for n in re.findall(r'"((?:CONTROLLER|AGENT|REPORTER)_[A-Z_]+)"', config)}
    webhook = (REPO / "operator" / "agentrun_operator" / "webhook.py").read_text()
    read |= {PREFIXES[0] + n for n in re.findall(r'"(WEBHOOK_[A-Z_]+)"', webhook)}
    assert names == read, f"set but not read: {names - read}; read but not set: {read - names}"
