"""The compatibility fixtures (tests/fixtures/compat) offline: `agentrun validate` and the generated
CRDs' rules agree with what the real API server does with each (tests/integration/test_compat_api.py).

- `valid/`: every document passes the models, the operator's offline rules and every CEL rule of
  its kind's CRD;
- `invalid/`: the API server refuses them; `agentrun validate` names the same field path;
- `refused/`: the API server accepts them; the operator (and `agentrun validate`) refuse them before
  any Job, naming the field.
"""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from celpy.adapter import json_to_cel

from agentrun_operator.api.crd import crd_documents
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.validate import validate_manifest
from agentrun_operator.validation_cli import check_file
from tests.unit.test_crds import _apply_defaults, _evaluate

COMPAT = Path(__file__).resolve().parents[2] / "fixtures" / "compat"
VALID = sorted((COMPAT / "valid").glob("*.yaml"))
INVALID = sorted((COMPAT / "invalid").glob("*.yaml"))
REFUSED = sorted((COMPAT / "refused").glob("*.yaml"))
CONFIG = OperatorConfig(loops_enabled=True)  # as `agentrun validate` checks by default


def expectation(path: Path) -> tuple[str, str]:
    """The `# expect: <field path> | <message fragment>` first line of an invalid or refused fixture."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: first line must be '# expect: path | fragment'"
    field, _, fragment = first.removeprefix("# expect: ").partition(" | ")
    return field.strip(), fragment.strip()


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _schema(kind: str) -> dict[str, Any]:
    crd = next(c for c in crd_documents() if c["spec"]["names"]["kind"] == kind)
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _cel_errors(node: dict[str, Any], value: Any, path: str) -> list[str]:
    """Every CEL rule of the schema at every node (create: no transition rules), like the API server."""
    errors = [
        f"{path}: {rule['message']}"
        for rule in node.get("x-kubernetes-validations", [])
        if "oldSelf" not in rule["rule"] and not _evaluate(rule["rule"], {"self": value})
    ]
    if isinstance(value, dict):
        for key, sub in node.get("properties", {}).items():
            if key in value:
                errors += _cel_errors(sub, value[key], f"{path}.{key}")
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            errors += _cel_errors(node["items"], item, f"{path}[{i}]")
    return errors


def test_there_is_a_fixture_of_every_kind() -> None:
    kinds = {d["kind"] for p in VALID for d in documents(p)}
    assert kinds == {"AgentRun", "Agent", "AgentProvider", "ImplementationSpec", "VersionControlProvider"}
    assert INVALID and REFUSED


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_fixture_passes_agentrun_validate_and_every_cel_rule(path: Path) -> None:
    out = io.StringIO()
    checked, problems = check_file(str(path), CONFIG, out)
    assert (checked, problems) == (len(documents(path)), 0), out.getvalue()
    assert "warning" not in out.getvalue(), out.getvalue()
    for doc in documents(path):
        schema = _schema(doc["kind"])
        stored = _apply_defaults(schema, copy.deepcopy(doc))
        assert _cel_errors(schema["properties"]["spec"], stored["spec"], "spec") == []
        json_to_cel(stored)  # the whole object is JSON the rules can read


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_fixture_is_refused_by_agentrun_validate_naming_the_field(path: Path) -> None:
    field, fragment = expectation(path)
    (doc,) = documents(path)
    problems = validate_manifest(doc, CONFIG)
    assert [p.path for p in problems] == [field], [p.render() for p in problems]
    schema = _schema(doc["kind"])
    cel = _cel_errors(schema["properties"]["spec"], doc["spec"], "spec")
    if cel:  # a CEL rule: the same words as the models
        assert any(fragment in e for e in cel) and fragment in problems[0].render(), (cel, problems)


@pytest.mark.parametrize("path", REFUSED, ids=lambda p: p.stem)
def test_refused_fixture_passes_the_schema_and_is_refused_before_any_job(path: Path) -> None:
    field, fragment = expectation(path)
    (doc,) = documents(path)
    schema = _schema(doc["kind"])
    assert _cel_errors(schema["properties"]["spec"], doc["spec"], "spec") == []
    problems = validate_manifest(doc, CONFIG)
    assert [p.path for p in problems] == [field]
    assert fragment in problems[0].render()


def test_agentrun_validate_checks_references_held_in_the_same_file(tmp_path: Path) -> None:
    agent, provider, run = (
        documents(COMPAT / "valid" / name)[0]
        for name in ("agent.yaml", "agentprovider-runner.yaml", "agentrun-job.yaml")
    )
    run["spec"]["secrets"] = ["compat-github-token", "not-allowed"]
    together = tmp_path / "together.yaml"
    together.write_text(yaml.safe_dump_all([provider, agent, run]), encoding="utf-8")
    out = io.StringIO()
    assert check_file(str(together), CONFIG, out) == (3, 1)
    assert (
        "AgentRun/compat-run-job: spec.secrets[1]: Secret 'not-allowed' is not allowed by Agent"
        in out.getvalue()
    )
    alone = tmp_path / "alone.yaml"  # without its Agent the rule needs the cluster: not checked offline
    alone.write_text(yaml.safe_dump(run), encoding="utf-8")
    assert check_file(str(alone), CONFIG, io.StringIO()) == (1, 0)
