"""The generated CRDs: committed copies match the generator, schemas are structural, CEL rules work.

The CEL rules are evaluated here with cel-python over a small imitation of the apiserver's walk
(defaults first, then every `x-kubernetes-validations` rule with `self` bound to its node). That
checks rule semantics offline; the apiserver's own compiler, its Kubernetes CEL extensions and its
cost budget are exercised by the integration tests against a real kube-apiserver.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel

from agentrun_operator.api import parse_agentrun, rules
from agentrun_operator.api.crd import (
    KINDS,
    crd_documents,
    crd_filename,
    openapi_schema,
    render_crd_yaml,
    render_crds_yaml,
    write_crds,
)
from tests.fixtures import invalid_agentruns

REPO = Path(__file__).resolve().parents[2]
CRDS_DIR = REPO / "crds"
FIXTURES = REPO / "tests" / "fixtures"
REGENERATE = (
    "regenerate with `agentrun crds --write crds/` (or `python -m agentrun_operator.api.crd --write crds/`)"
)

EXPECTED_FILES = {
    "agents.proompteng.ai_agentruns.yaml",
    "agents.proompteng.ai_agents.yaml",
    "agents.proompteng.ai_agentproviders.yaml",
    "agents.proompteng.ai_implementationspecs.yaml",
    "agents.proompteng.ai_versioncontrolproviders.yaml",
}


INVALID = invalid_agentruns


def _crd(kind: str) -> dict[str, Any]:
    return next(c for c in crd_documents() if c["spec"]["names"]["kind"] == kind)


def _root(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = _crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


# --- drift ------------------------------------------------------------------------------------


def test_committed_crds_match_the_models_byte_for_byte() -> None:
    present = {p.name for p in CRDS_DIR.glob("*.yaml")}
    assert present == EXPECTED_FILES, f"crds/ holds {sorted(present)}; {REGENERATE}"
    for crd in crd_documents():
        path = CRDS_DIR / crd_filename(crd)
        assert path.read_text(encoding="utf-8") == render_crd_yaml(crd), (
            f"{path} is out of date; {REGENERATE}"
        )


def test_write_and_render(tmp_path: Path) -> None:
    paths = write_crds(tmp_path / "out")
    assert {p.name for p in paths} == EXPECTED_FILES
    docs = [d for d in yaml.safe_load_all(render_crds_yaml()) if d]
    assert docs == crd_documents()
    assert [yaml.safe_load(p.read_text()) for p in paths] == docs


def test_generation_is_deterministic() -> None:
    assert render_crds_yaml() == render_crds_yaml()


# --- names, columns, subresources ---------------------------------------------------------------


def test_names_and_printer_columns() -> None:
    crds = {c["spec"]["names"]["kind"]: c for c in crd_documents()}
    assert set(crds) == {"AgentRun", "Agent", "AgentProvider", "ImplementationSpec", "VersionControlProvider"}
    builtin_short_names = {
        "po",
        "svc",
        "ns",
        "no",
        "cm",
        "ds",
        "rs",
        "sa",
        "pv",
        "pvc",
        "ep",
        "ev",
        "ing",
        "hpa",
    }
    all_short: list[str] = []
    for kind, crd in crds.items():
        spec = crd["spec"]
        assert spec["group"] == "agents.proompteng.ai"
        assert spec["scope"] == "Namespaced"
        assert spec["names"]["categories"] == ["agents"]
        assert crd["metadata"]["name"] == f"{spec['names']['plural']}.agents.proompteng.ai"
        (version,) = spec["versions"]
        assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
        assert version["subresources"] == {"status": {}}
        all_short += spec["names"]["shortNames"]
        assert spec["names"]["singular"] == kind.lower()
    assert crds["AgentRun"]["spec"]["names"]["shortNames"] == ["ar"]
    assert len(set(all_short)) == len(all_short) and not set(all_short) & builtin_short_names
    columns = crds["AgentRun"]["spec"]["versions"][0]["additionalPrinterColumns"]
    # The original API's columns (same names, paths and types), then ours.
    assert [(c["name"], c["jsonPath"], c["type"]) for c in columns] == [
        ("Phase", ".status.phase", "string"),
        ("Agent", ".spec.agentRef.name", "string"),
        ("Succeeded", '.status.conditions[?(@.type=="Succeeded")].status', "string"),
        ("Reason", '.status.conditions[?(@.type=="Succeeded")].reason', "string"),
        ("StartTime", ".status.startedAt", "date"),
        ("CompletionTime", ".status.finishedAt", "date"),
        ("Runtime", ".spec.runtime.type", "string"),
        ("Step", ".status.currentStep", "string"),
        ("Iteration", ".status.iteration", "string"),
        ("Age", ".metadata.creationTimestamp", "date"),
    ]


# --- structural schema ---------------------------------------------------------------------------

FORBIDDEN_KEYS = {
    "$ref",
    "$defs",
    "anyOf",
    "allOf",
    "oneOf",
    "not",
    "title",
    "const",
    "uniqueItems",
    "nullable",
}


def _walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


@pytest.mark.parametrize("kind", [k.kind for k in KINDS])
def test_schema_is_structural(kind: str) -> None:
    root = _root(kind)
    assert root["type"] == "object" and root["description"]
    assert root["properties"]["metadata"] == {"type": "object"}, "root metadata may only be {type: object}"
    assert root["required"] == ["spec"]
    for path, node in _walk(root, kind):
        assert not FORBIDDEN_KEYS & set(node), f"{path}: {FORBIDDEN_KEYS & set(node)}"
        typed = (
            node.get("type")
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        )
        assert typed, f"{path}: node without a type"
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("additionalProperties") is not False, path
        for prop, sub in node.get("properties", {}).items():
            if path == kind and prop == "metadata":
                continue
            assert sub.get("description"), f"{path}.{prop}: property without a description"
        if node.get("type") == "array":
            assert "items" in node, path
        if node.get("x-kubernetes-list-type") == "map":
            keys = node["x-kubernetes-list-map-keys"]
            assert set(keys) <= set(node["items"].get("required", [])), path
        for rule in node.get("x-kubernetes-validations", []):
            assert rule["rule"] and rule["message"], path
            assert "\n" not in rule["message"], path
            if "fieldPath" in rule:
                target = node
                for part in rule["fieldPath"].lstrip(".").split("."):
                    target = target["properties"][part]


def test_every_list_in_a_spec_has_max_items() -> None:
    """The apiserver's CEL cost estimate needs bounded lists; status lists have no rules and are unbounded."""
    for info in KINDS:
        for path, node in _walk(_root(info.kind)["properties"]["spec"], f"{info.kind}.spec"):
            if node.get("type") == "array":
                assert "maxItems" in node, f"{path}: list without maxItems"


def test_explain_paths_have_descriptions() -> None:
    """`kubectl explain agentrun.spec.workflow.steps.loop` prints these."""
    spec = _root("AgentRun")["properties"]["spec"]
    loop = spec["properties"]["workflow"]["properties"]["steps"]["items"]["properties"]["loop"]
    assert "loop" in loop["description"].lower()
    for name in ("maxIterations", "condition", "items", "onMaxIterations", "state"):
        assert loop["properties"][name]["description"]
    status = _root("AgentRun")["properties"]["status"]["properties"]
    assert "3/8" in status["iteration"]["description"]
    assert status["currentStep"]["description"]


def test_limits_and_enums_in_schema() -> None:
    spec = _root("AgentRun")["properties"]["spec"]
    props = spec["properties"]
    steps = props["workflow"]["properties"]["steps"]
    assert (steps["minItems"], steps["maxItems"]) == (1, 50)
    step = steps["items"]["properties"]
    assert step["name"]["maxLength"] == 63 and step["name"]["pattern"] == "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    loop = step["loop"]["properties"]
    assert (loop["maxIterations"]["minimum"], loop["maxIterations"]["maximum"]) == (1, 1000)
    assert step["loop"]["required"] == ["maxIterations"]
    assert loop["onMaxIterations"]["enum"] == ["Succeed", "Fail"]
    source = loop["condition"]["properties"]["source"]
    assert source["default"] == {}
    assert source["properties"]["onMissing"] == {
        "default": "stop",
        "description": source["properties"]["onMissing"]["description"],
        "enum": ["stop", "fail"],
        "type": "string",
    }
    assert source["properties"]["path"]["default"] == "/workspace/.agentrun/loop-control.json"
    assert loop["state"]["properties"]["volumeNames"]["x-kubernetes-list-type"] == "set"
    assert loop["state"]["properties"]["volumeNames"]["maxItems"] == 32
    assert props["parameters"]["maxProperties"] == 100
    assert props["cancel"]["enum"] == ["Graceful", "Immediate"]
    assert props["runtime"]["properties"]["type"]["default"] == "workflow"
    assert props["runtime"]["properties"]["config"]["x-kubernetes-preserve-unknown-fields"] is True
    workload = props["workload"]["properties"]
    assert workload["env"]["maxItems"] == 128 and workload["volumes"]["maxItems"] == 32
    assert workload["resources"]["properties"]["limits"]["additionalProperties"]["x-kubernetes-int-or-string"]
    assert workload["volumes"]["items"]["properties"]["sizeLimit"]["x-kubernetes-int-or-string"] is True
    last_control = _root("AgentRun")["properties"]["status"]["properties"]["workflow"]["properties"]["steps"][
        "items"
    ]["properties"]["loop"]["properties"]["lastControl"]
    assert last_control["x-kubernetes-preserve-unknown-fields"] is True
    impl = _root("ImplementationSpec")["properties"]["spec"]["properties"]["text"]
    assert impl["maxLength"] == 128 * 1024


def test_spec_fields_are_immutable_except_cancel_and_approvals() -> None:
    spec = _root("AgentRun")["properties"]["spec"]
    for name, prop in spec["properties"].items():
        transition = [r for r in prop.get("x-kubernetes-validations", []) if "oldSelf" in r["rule"]]
        if name == "cancel":
            assert transition == []
        elif name == "approvals":
            assert [r["rule"] for r in transition] == [rules.APPROVALS_APPEND_ONLY.rule]
        else:
            assert transition and transition[0]["rule"] == "self == oldSelf", name
            assert f"spec.{name} is immutable" in transition[0]["message"]
    presence = [r for r in spec["x-kubernetes-validations"] if "has(oldSelf." in r["rule"]]
    assert any("has(self.workflow) == has(oldSelf.workflow)" in r["rule"] for r in presence)
    assert not any("has(self.cancel) == has(oldSelf.cancel)" in r["rule"] for r in presence)
    assert not any("has(self.approvals) == has(oldSelf.approvals)" in r["rule"] for r in presence)
    assert rules.APPROVALS_STICKY.rule in [r["rule"] for r in presence]


# --- CEL -----------------------------------------------------------------------------------------

_ENV = celpy.Environment()


def _all_rules() -> Iterator[tuple[str, dict[str, Any]]]:
    for info in KINDS:
        for path, node in _walk(_root(info.kind), info.kind):
            for rule in node.get("x-kubernetes-validations", []):
                yield path, rule


@pytest.mark.parametrize(("path", "rule"), list(_all_rules()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_cel_rule_compiles(path: str, rule: dict[str, Any]) -> None:
    # The rules use standard CEL (has, all, exists, exists_one, size, matches, startsWith), which
    # cel-python implements; a rule that needs a Kubernetes extension (`k8s_only`: the append-only
    # rule's two-variable comprehension) is compiled by the real API server in the integration tests.
    if rule["rule"] in _K8S_ONLY:
        return
    _program(rule["rule"])


_K8S_ONLY = {r.rule for r in (*rules.ALL_STATIC_RULES, *rules.TRANSITION_RULES) if r.k8s_only}
_K8S_TWINS: dict[str, Any] = {
    # `size(self) >= size(oldSelf) && oldSelf.all(i, old, self[i] == old)`: old is a prefix of new
    rules.APPROVALS_APPEND_ONLY.rule: lambda new, old: len(new) >= len(old) and new[: len(old)] == old,
}
assert set(_K8S_TWINS) == _K8S_ONLY, "every Kubernetes-only rule needs a Python twin here"


def _apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """The apiserver's structural defaulting: fill missing properties, then recurse (top-down)."""
    if isinstance(value, dict):
        for key, sub in node.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = _apply_defaults(sub, value[key])
        if isinstance(node.get("additionalProperties"), dict):
            for key in value:
                value[key] = _apply_defaults(node["additionalProperties"], value[key])
    elif isinstance(value, list) and "items" in node:
        return [_apply_defaults(node["items"], v) for v in value]
    return value


@functools.cache
def _program(rule: str) -> Any:
    """Compiling with cel-python's Lark parser is slow; every rule is compiled once per session."""
    return _ENV.program(_ENV.compile(rule))


def _evaluate(rule: str, activation: dict[str, Any]) -> bool:
    program = _program(rule)
    result = program.evaluate({k: json_to_cel(v) for k, v in activation.items()})
    if not isinstance(result, celpy.celtypes.BoolType):
        raise AssertionError(f"rule {rule!r} gave {result!r}")
    return bool(result)


def _cel_errors(node: dict[str, Any], value: Any, path: str, old: Any = None) -> list[str]:
    """Evaluate every rule at every node like the apiserver; transition rules only where old exists."""
    errors: list[str] = []
    for rule in node.get("x-kubernetes-validations", []):
        is_transition = "oldSelf" in rule["rule"]
        if is_transition and old is None:
            continue
        activation = {"self": value, "oldSelf": old} if is_transition else {"self": value}
        twin = _K8S_TWINS.get(rule["rule"])
        if not (twin(value, old) if twin is not None else _evaluate(rule["rule"], activation)):
            errors.append(f"{path}{rule.get('fieldPath', '')}: {rule['message']}")
    if isinstance(value, dict):
        for key, sub in node.get("properties", {}).items():
            if key in value:
                sub_old = old.get(key) if isinstance(old, dict) else None
                errors += _cel_errors(sub, value[key], f"{path}.{key}", sub_old)
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            errors += _cel_errors(node["items"], item, f"{path}[{i}]")
    return errors


def _admit(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    root = _root("AgentRun")
    obj = _apply_defaults(root, copy.deepcopy(obj))
    if old is not None:
        old = _apply_defaults(root, copy.deepcopy(old))
        return _cel_errors(root["properties"]["spec"], obj["spec"], "spec", old["spec"])
    return _cel_errors(root["properties"]["spec"], obj["spec"], "spec")


@pytest.mark.parametrize(
    "filename", ["agentrun-workflow-loop-fixed.yaml", "agentrun-workflow-loop-conditional.yaml"]
)
def test_reference_manifests_pass_every_rule_and_crd_defaults_equal_model_defaults(filename: str) -> None:
    manifest = yaml.safe_load((FIXTURES / "reference" / filename).read_text())
    assert _admit(manifest) == []
    # What the apiserver stores (its defaults applied) is exactly what the models produce.
    stored = _apply_defaults(_root("AgentRun"), copy.deepcopy(manifest))
    assert stored == parse_agentrun(manifest).to_dict()


@pytest.mark.parametrize("case", sorted(INVALID.RULE_MESSAGES))
def test_cel_rule_rejects_its_invalid_case(case: str) -> None:
    (manifest, expected) = next((m, e) for n, m, e in INVALID.INVALID_AGENTRUNS if n == case)
    errors = _admit(manifest)
    fragment = INVALID.RULE_MESSAGES[case]
    assert any(e.startswith(f"{expected}: ") and fragment in e for e in errors), errors


def test_cel_rules_accept_the_base_and_reject_only_their_own_cases() -> None:
    assert _admit(INVALID.base_manifest()) == []
    for case, manifest, expected in INVALID.INVALID_AGENTRUNS:
        for error in _admit(manifest):
            assert error.startswith(f"{expected}: "), (case, error)


@pytest.mark.parametrize(
    ("case", "old", "new", "fragment"), INVALID.INVALID_UPDATES, ids=lambda v: str(v)[:30]
)
def test_transition_rules_reject_spec_changes(
    case: str, old: dict[str, Any], new: dict[str, Any], fragment: str
) -> None:
    errors = _admit(new, old)
    assert any(fragment in e for e in errors), (case, errors)


@pytest.mark.parametrize(("case", "old", "new"), INVALID.VALID_UPDATES, ids=lambda v: str(v)[:30])
def test_transition_rules_allow_cancel(case: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    assert _admit(new, old) == []


def test_openapi_schema_of_a_model_is_reusable() -> None:
    from agentrun_operator.api import StepLoop

    schema = openapi_schema(StepLoop)
    assert schema["type"] == "object" and schema["required"] == ["maxIterations"]


# --- docs/api.md ----------------------------------------------------------------------------------

DOCS = REPO / "docs" / "api.md"


def test_docs_field_reference_is_current() -> None:
    from agentrun_operator.api.docs import render_reference

    assert render_reference().rstrip("\n") in DOCS.read_text(encoding="utf-8"), (
        "docs/api.md's field reference is out of date; regenerate with "
        "`python -m agentrun_operator.api.docs --write docs/api.md`"
    )


def test_docs_anchors_of_every_message_exist() -> None:
    text = DOCS.read_text(encoding="utf-8")
    anchors = set(re.findall(r'<a id="([a-z0-9-]+)"></a>', text))
    for _, rule in _all_rules():
        for anchor in re.findall(r"docs/api\.md#([a-z0-9-]+)", rule["message"]):
            assert anchor in anchors, f"message points to missing anchor #{anchor}"


def test_docs_list_every_invalid_case() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for case, _, expected in INVALID.INVALID_AGENTRUNS:
        assert f"| `{case}` |" in text and f"`{expected}`" in text, case
    for case, *_ in INVALID.INVALID_UPDATES:
        assert f"| `{case}` |" in text, case
