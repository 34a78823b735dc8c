"""The pydantic API models: reference manifests round-trip, defaults apply, every static rule rejects."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from agentrun_operator.api import (
    DEFAULT_CONTROL_PATH,
    Agent,
    AgentProvider,
    AgentRun,
    AgentRunSpec,
    AgentRunStatus,
    ImplementationSpec,
    StepLoop,
    Workflow,
    WorkflowStep,
    agentrun_errors,
    format_validation_error,
    immutability_violations,
    parse_agentrun,
)
from tests.fixtures import invalid_agentruns

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
REFERENCE = FIXTURES / "reference"


INVALID = invalid_agentruns


def _reference(name: str) -> dict[str, Any]:
    data = yaml.safe_load((REFERENCE / name).read_text())
    assert isinstance(data, dict)
    return data


FIXED_EXPECTED: dict[str, Any] = {
    "apiVersion": "agents.proompteng.ai/v1alpha1",
    "kind": "AgentRun",
    "metadata": {"name": "codex-workflow-loop-fixed"},
    "spec": {
        "agentRef": {"name": "codex-agent"},
        "implementationSpecRef": {"name": "codex-impl"},
        "runtime": {"type": "workflow"},
        "workload": {
            "volumes": [
                {
                    "name": "workspace",
                    "type": "pvc",
                    "claimName": "codex-workspace",
                    "mountPath": "/workspace",
                }
            ]
        },
        "workflow": {
            "steps": [
                {
                    "name": "implement",
                    "retryBackoffSeconds": 0,
                    "loop": {
                        "maxIterations": 3,
                        "onMaxIterations": "Succeed",
                        "state": {"required": True, "volumeNames": ["workspace"]},
                        "intervalSeconds": 0,
                    },
                }
            ],
            "timeoutSeconds": 0,
        },
    },
}

CONDITIONAL_EXPECTED: dict[str, Any] = {
    "apiVersion": "agents.proompteng.ai/v1alpha1",
    "kind": "AgentRun",
    "metadata": {"name": "codex-workflow-loop-conditional"},
    "spec": {
        "agentRef": {"name": "codex-agent"},
        "runtime": {"type": "workflow"},
        "workload": {
            "volumes": [
                {
                    "name": "workspace",
                    "type": "pvc",
                    "claimName": "codex-workspace",
                    "mountPath": "/workspace",
                }
            ]
        },
        "workflow": {
            "steps": [
                {
                    "name": "implement",
                    "implementationSpecRef": {"name": "torghut-impl"},
                    "retryBackoffSeconds": 0,
                    "loop": {
                        "maxIterations": 8,
                        "condition": {
                            "type": "cel",
                            "expression": "iteration.last.control.continue == true",
                            "source": {
                                "type": "file",
                                "path": "/workspace/.agentrun/loop-control.json",
                                "onMissing": "stop",
                                "onInvalid": "fail",
                            },
                        },
                        "onMaxIterations": "Succeed",
                        "state": {"required": True, "volumeNames": ["workspace"]},
                        "intervalSeconds": 0,
                    },
                }
            ],
            "timeoutSeconds": 0,
        },
    },
}


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("agentrun-workflow-loop-fixed.yaml", FIXED_EXPECTED),
        ("agentrun-workflow-loop-conditional.yaml", CONDITIONAL_EXPECTED),
    ],
)
def test_reference_manifest_round_trips_with_defaults(filename: str, expected: dict[str, Any]) -> None:
    run = parse_agentrun(_reference(filename))
    dumped = run.model_dump(by_alias=True, exclude_none=True)
    assert dumped == expected
    # A second pass changes nothing: the dump is a fixed point.
    assert parse_agentrun(dumped).model_dump(by_alias=True, exclude_none=True) == expected
    assert run.to_dict() == expected


def test_conditional_reference_values() -> None:
    run = parse_agentrun(_reference("agentrun-workflow-loop-conditional.yaml"))
    assert run.spec.workflow is not None
    step = run.spec.workflow.steps[0]
    assert step.loop is not None and step.loop.condition is not None
    assert step.loop.max_iterations == 8
    assert step.loop.condition.expression == "iteration.last.control.continue == true"
    assert step.loop.condition.until is None
    assert step.loop.state is not None and step.loop.state.volume_names == ["workspace"]
    assert run.spec.has_loops()


def test_defaults_of_a_minimal_loop() -> None:
    spec = AgentRunSpec.model_validate(
        {"workflow": {"steps": [{"name": "a", "loop": {"maxIterations": 2, "condition": {"until": "true"}}}]}}
    )
    assert spec.runtime.type == "workflow"
    assert spec.workflow is not None
    step = spec.workflow.steps[0]
    assert step.retry_backoff_seconds == 0
    assert step.retries is None and step.effective_retries() == 0 and step.effective_retries(3) == 3
    assert step.timeout_seconds is None and step.effective_timeout_seconds() == 0
    assert step.effective_timeout_seconds(600) == 600
    assert WorkflowStep(name="b", retries=1).effective_retries(5) == 1
    assert step.loop is not None and step.loop.condition is not None
    assert step.loop.on_max_iterations == "Succeed"
    assert step.loop.condition.type == "cel"
    source = step.loop.condition.source
    assert (source.type, source.path, source.on_missing, source.on_invalid) == (
        "file",
        DEFAULT_CONTROL_PATH,
        "stop",
        "fail",
    )
    state = StepLoop.model_validate({"maxIterations": 1, "state": {}}).state
    assert state is not None and state.required is False and state.volume_names is None


def test_populate_by_name_and_alias_dump() -> None:
    step = WorkflowStep(name="impl", retry_backoff_seconds=5, loop=StepLoop(max_iterations=2))
    assert step.model_dump(by_alias=True, exclude_none=True) == {
        "name": "impl",
        "retryBackoffSeconds": 5,
        "loop": {"maxIterations": 2, "onMaxIterations": "Succeed", "intervalSeconds": 0},
    }
    assert Workflow(steps=[step]).to_dict()["timeoutSeconds"] == 0


@pytest.mark.parametrize(
    ("case", "manifest", "expected"), INVALID.INVALID_AGENTRUNS, ids=lambda v: str(v)[:40]
)
def test_invalid_manifest_is_rejected_at_the_named_field(
    case: str, manifest: dict[str, Any], expected: str
) -> None:
    errors = agentrun_errors(manifest)
    assert errors, f"{case}: the models accepted a manifest the CRD rejects"
    matching = [e for e in errors if e.startswith(f"{expected}: ")]
    assert matching, f"{case}: no error at {expected}: {errors}"
    fragment = INVALID.RULE_MESSAGES.get(case)
    if fragment:
        assert any(fragment in e and "docs/api.md#" in e for e in matching), errors


def test_invalid_cases_cover_every_static_rule_and_are_distinct() -> None:
    from agentrun_operator.api.rules import ALL_STATIC_RULES

    assert len(INVALID.INVALID_AGENTRUNS) >= 16
    names = [c[0] for c in INVALID.INVALID_AGENTRUNS]
    assert len(set(names)) == len(names)
    assert agentrun_errors(INVALID.base_manifest()) == []
    printed = "\n".join(e for _, manifest, _ in INVALID.INVALID_AGENTRUNS for e in agentrun_errors(manifest))
    for rule in ALL_STATIC_RULES:
        assert rule.message in printed, f"no invalid case exercises rule {rule.anchor}: {rule.text}"


def test_each_invalid_case_breaks_exactly_one_rule() -> None:
    for case, manifest, _ in INVALID.INVALID_AGENTRUNS:
        assert len(agentrun_errors(manifest)) == 1, case


def test_unknown_field_is_reported_not_pruned() -> None:
    manifest = copy.deepcopy(INVALID.base_manifest())
    manifest["spec"]["workflow"]["steps"][0]["loop"]["maxIteration"] = 3
    errors = agentrun_errors(manifest)
    assert errors == [
        "spec.workflow.steps[0].loop.maxIteration: unknown field; check the spelling against docs/api.md"
    ]


def test_quantities_and_env() -> None:
    spec = AgentRunSpec.model_validate(
        {
            "workload": {
                "resources": {"limits": {"cpu": 2, "memory": "4Gi"}, "requests": {"cpu": "500m"}},
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                    {"name": "C", "valueFrom": {"fileKeyRef": {"path": "x", "volumeName": "v", "key": "k"}}},
                ],
                "volumes": [{"name": "tmp", "type": "emptyDir", "mountPath": "/tmp/x", "sizeLimit": "1Gi"}],
            }
        }
    )
    dumped = spec.to_dict()["workload"]
    assert dumped["resources"]["limits"] == {"cpu": 2, "memory": "4Gi"}
    # An EnvVarSource kind this operator does not model is passed through, not dropped.
    assert dumped["env"][2]["valueFrom"] == {"fileKeyRef": {"path": "x", "volumeName": "v", "key": "k"}}
    with pytest.raises(ValidationError, match="not a Kubernetes quantity"):
        AgentRunSpec.model_validate({"workload": {"resources": {"limits": {"cpu": "lots"}}}})


STATUS: dict[str, Any] = {
    "phase": "Running",
    "currentStep": "implement",
    "iteration": "2/8",
    "observedGeneration": 1,
    "startedAt": "2026-02-28T05:00:00Z",
    "conditions": [{"type": "InvalidSpec", "status": "False", "reason": "Valid", "message": "ok"}],
    "workflow": {
        "phase": "Running",
        "steps": [
            {
                "name": "implement",
                "phase": "Running",
                "attempt": 1,
                "startedAt": "2026-02-28T05:00:00Z",
                "jobRef": {"name": "run-step-1-iter-2-attempt-1", "uid": "u-2"},
                "loop": {
                    "currentIteration": 2,
                    "completedIterations": 1,
                    "maxIterations": 8,
                    "stopReason": "",
                    "retainedIterations": 2,
                    "prunedIterations": 0,
                    "lastControl": {"continue": True, "outputs": {"summary": "pass 1", "remaining_tasks": 3}},
                    "iterations": [
                        {
                            "index": 1,
                            "phase": "Succeeded",
                            "startedAt": "2026-02-28T05:00:00Z",
                            "finishedAt": "2026-02-28T05:04:00Z",
                            "attempts": 1,
                            "jobRef": {"name": "run-step-1-iter-1-attempt-1"},
                        },
                        {
                            "index": 2,
                            "phase": "Running",
                            "startedAt": "2026-02-28T05:04:10.250000Z",
                            "attempts": 1,
                            "jobRef": {"name": "run-step-1-iter-2-attempt-1"},
                        },
                    ],
                },
            }
        ],
    },
}


def test_status_round_trips_and_dumps_json_and_yaml_safe() -> None:
    status = AgentRunStatus.model_validate(STATUS)
    assert status.workflow is not None
    loop = status.workflow.steps[0].loop
    assert loop is not None
    assert loop.iterations[0].started_at == datetime(2026, 2, 28, 5, 0, tzinfo=UTC)
    dumped = status.model_dump(by_alias=True, exclude_none=True)
    assert dumped == STATUS
    json.dumps(dumped)
    yaml.safe_dump(dumped)
    assert AgentRunStatus().model_dump(by_alias=True, exclude_none=True) == {"conditions": []}


def test_status_ignores_unknown_fields_for_forward_compatibility() -> None:
    status = AgentRunStatus.model_validate({"phase": "Pending", "kopf": {"progress": {}}})
    assert status.phase == "Pending"


def test_full_object_with_status() -> None:
    obj = copy.deepcopy(FIXED_EXPECTED)
    obj["status"] = STATUS
    obj["metadata"] = {"name": "x", "uid": "123", "generation": 1, "resourceVersion": "7"}
    run = AgentRun.model_validate(obj)
    assert run.metadata["uid"] == "123"
    assert run.to_dict() == obj


def test_immutability_violations() -> None:
    for case, old, new, fragment in INVALID.INVALID_UPDATES:
        problems = immutability_violations(parse_agentrun(old).spec, parse_agentrun(new).spec)
        assert any(fragment in p for p in problems), (case, problems)
    for case, old, new in INVALID.VALID_UPDATES:
        assert immutability_violations(parse_agentrun(old).spec, parse_agentrun(new).spec) == [], case


def test_other_kinds_parse() -> None:
    provider = AgentProvider.model_validate(
        {
            "apiVersion": "agents.proompteng.ai/v1alpha1",
            "kind": "AgentProvider",
            "metadata": {"name": "codex"},
            "spec": {"image": "codex:latest", "command": ["codex", "exec"], "args": ["$(AGENTRUN_STEP)"]},
        }
    )
    assert provider.spec.command == ["codex", "exec"]
    agent = Agent.model_validate(
        {
            "kind": "Agent",
            "metadata": {"name": "codex-agent"},
            "spec": {"providerRef": {"name": "codex"}, "defaults": {"timeoutSeconds": 600, "retries": 2}},
        }
    )
    assert agent.spec.defaults is not None and agent.spec.defaults.retries == 2
    impl = ImplementationSpec.model_validate(
        {
            "metadata": {"name": "torghut-impl"},
            "spec": {"text": "do it", "acceptanceCriteria": ["tests pass"]},
        }
    )
    assert impl.spec.acceptance_criteria == ["tests pass"]
    with pytest.raises(ValidationError) as err:
        ImplementationSpec.model_validate({"spec": {"text": "x" * (128 * 1024 + 1)}})
    assert format_validation_error(err.value)[0].startswith("spec.text: ")


def test_models_import_without_kopf_or_kubernetes() -> None:
    code = (
        "import sys, agentrun_operator.api, agentrun_operator.api.crd;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('kopf', 'kubernetes_asyncio', 'kubernetes')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
