"""The generated CRDs against the real kube-apiserver: established, explained, validating."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_devcluster.controlplane import ControlPlane
from tests.fixtures.invalid_agentruns import (
    INVALID_AGENTRUNS,
    INVALID_UPDATES,
    RULE_MESSAGES,
    VALID_UPDATES,
)
from tests.support.api import kubectl_in

REFERENCE = Path(__file__).resolve().parent.parent / "fixtures" / "reference"
NAMESPACE = "crd-tests"
CRD_NAMES = [
    "agentruns.agents.proompteng.ai",
    "agents.agents.proompteng.ai",
    "agentproviders.agents.proompteng.ai",
    "implementationspecs.agents.proompteng.ai",
    "versioncontrolproviders.agents.proompteng.ai",
]


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    existing = control_plane.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found", "-o", "name")
    if not existing.strip():
        control_plane.kubectl("create", "namespace", NAMESPACE)
    return control_plane


def kubectl(plane: ControlPlane, *args: str, manifest: Any = None) -> subprocess.CompletedProcess[str]:
    return kubectl_in(plane, NAMESPACE, *args, manifest=manifest)


def test_all_five_crds_are_established(plane: ControlPlane) -> None:
    for name in CRD_NAMES:
        crd = json.loads(plane.kubectl("get", "crd", name, "-o", "json"))
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True", (name, conditions)
        assert conditions.get("NamesAccepted") == "True", (name, conditions)
        assert crd["spec"]["names"]["categories"] == ["agents"]


def test_kubectl_explain_shows_descriptions(plane: ControlPlane) -> None:
    out = plane.kubectl("explain", "agentrun.spec.workflow.steps.loop")
    assert "maxIterations" in out and "condition" in out
    # Descriptions come from the pydantic models, field by field.
    assert "DESCRIPTION" in out
    loop_help = plane.kubectl("explain", "agentrun.spec.workflow.steps.loop.maxIterations")
    assert "<integer>" in loop_help and len(loop_help.split("DESCRIPTION:")[1].strip()) > 20


@pytest.mark.parametrize("path", sorted(REFERENCE.glob("*.yaml")), ids=lambda p: p.stem)
def test_reference_manifests_pass_server_side_dry_run(plane: ControlPlane, path: Path) -> None:
    proc = kubectl(plane, "apply", "--dry-run=server", "-f", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "(server dry run)" in proc.stdout


def test_there_are_at_least_15_invalid_cases() -> None:
    assert len(INVALID_AGENTRUNS) >= 15


@pytest.mark.parametrize(
    ("case", "manifest", "field"), INVALID_AGENTRUNS, ids=[c for c, _, _ in INVALID_AGENTRUNS]
)
def test_invalid_manifest_is_rejected_naming_the_field(
    plane: ControlPlane, case: str, manifest: dict[str, Any], field: str
) -> None:
    proc = kubectl(plane, "apply", "--dry-run=server", "-f", "-", manifest=manifest)
    assert proc.returncode != 0, f"{case}: the apiserver accepted it:\n{proc.stdout}"
    assert field in proc.stderr, f"{case}: error does not name {field}:\n{proc.stderr}"
    fragment = RULE_MESSAGES.get(case)
    if fragment:
        assert fragment in proc.stderr, f"{case}: message lacks {fragment!r}:\n{proc.stderr}"


@pytest.mark.parametrize(
    ("case", "original", "updated", "fragment"), INVALID_UPDATES, ids=[c[0] for c in INVALID_UPDATES]
)
def test_spec_is_immutable_except_cancel(
    plane: ControlPlane, case: str, original: dict[str, Any], updated: dict[str, Any], fragment: str
) -> None:
    # --save-config so that `apply` removes the fields the update drops (three-way merge).
    created = kubectl(plane, "create", "--save-config", "-f", "-", manifest=original)
    assert created.returncode == 0, created.stderr
    try:
        proc = kubectl(plane, "apply", "--dry-run=server", "-f", "-", manifest=updated)
        assert proc.returncode != 0, f"{case}: update accepted:\n{proc.stdout}"
        assert fragment in proc.stderr, proc.stderr
    finally:
        kubectl(plane, "delete", "agentrun", original["metadata"]["name"], "--wait=false")


@pytest.mark.parametrize(("case", "original", "updated"), VALID_UPDATES, ids=[c[0] for c in VALID_UPDATES])
def test_cancel_may_change(
    plane: ControlPlane, case: str, original: dict[str, Any], updated: dict[str, Any]
) -> None:
    created = kubectl(plane, "create", "--save-config", "-f", "-", manifest=original)
    assert created.returncode == 0, created.stderr
    try:
        proc = kubectl(plane, "apply", "--dry-run=server", "-f", "-", manifest=updated)
        assert proc.returncode == 0, f"{case}: {proc.stderr}"
    finally:
        kubectl(plane, "delete", "agentrun", original["metadata"]["name"], "--wait=false")


def test_printer_columns(plane: ControlPlane) -> None:
    manifest = yaml.safe_load((REFERENCE / "agentrun-workflow-loop-conditional.yaml").read_text())
    manifest["metadata"] = {"name": "columns", "namespace": NAMESPACE}
    created = kubectl(plane, "create", "-f", "-", manifest=manifest)
    assert created.returncode == 0, created.stderr
    try:
        status = {
            "status": {
                "phase": "Running",
                "currentStep": "implement",
                "iteration": "3/8",
                "reason": "Looping",
                "startedAt": "2026-11-23T10:00:00Z",
                "conditions": [
                    {
                        "type": "Succeeded",
                        "status": "Unknown",
                        "reason": "Looping",
                        "message": "iteration 3/8",
                        "lastTransitionTime": "2026-11-23T10:00:00Z",
                    }
                ],
            }
        }
        patch = kubectl(
            plane,
            "patch",
            "agentrun",
            "columns",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(status),
        )
        assert patch.returncode == 0, patch.stderr
        table = kubectl(plane, "get", "ar", "columns")
        assert table.returncode == 0, table.stderr
        header, row = table.stdout.strip().splitlines()
        # The original API's columns (dashboards read them), then ours.
        assert header.split() == [
            "NAME",
            "PHASE",
            "AGENT",
            "SUCCEEDED",
            "REASON",
            "STARTTIME",
            "COMPLETIONTIME",
            "RUNTIME",
            "STEP",
            "ITERATION",
            "AGE",
        ]
        cells = row.split()
        assert cells[:5] == ["columns", "Running", "codex-agent", "Unknown", "Looping"]
        # StartTime is an age; an empty date column (CompletionTime) prints nothing at all.
        assert cells[-4:-1] == ["workflow", "implement", "3/8"]
        # The category works too: `kubectl get agents` lists AgentRuns among the agents kinds.
        listing = kubectl(plane, "get", "agents")
        assert "columns" in listing.stdout, listing.stdout + listing.stderr
    finally:
        kubectl(plane, "delete", "agentrun", "columns", "--wait=false")
