"""The compatibility fixtures (tests/fixtures/compat) against the real API server, then through the
operator (docs/migration.md).

- every `valid/` and `refused/` document is accepted under strict field validation
  (`--validate=strict`: an unknown field is an error) and stored with every field it gave (nothing
  pruned);
- every `invalid/` document is refused, the error naming the field path of its `# expect:` line;
- with the operator running: a template never runs and says so, an unsupported runtime and a Secret
  the Agent does not allow are InvalidSpec before any Job, and an allowed Secret reaches the pod as
  envFrom, the goal's objective as env.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_devcluster.controlplane import ControlPlane
from tests.support import api
from tests.support.api import kubectl_in
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess
from tests.unit.compat.test_compat_fixtures import INVALID, REFUSED, VALID, documents, expectation

NAMESPACE = "compat"


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    if not control_plane.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found", "-o", "name").strip():
        control_plane.kubectl("create", "namespace", NAMESPACE)
    return control_plane


def kubectl(plane: ControlPlane, *args: str, manifest: Any = None) -> subprocess.CompletedProcess[str]:
    return kubectl_in(plane, NAMESPACE, *args, manifest=manifest)


def _missing(given: Any, stored: Any, path: str = "spec") -> list[str]:
    """Paths of `given` that `stored` lacks or changed (what pruning would have dropped)."""
    if isinstance(given, dict):
        if not isinstance(stored, dict):
            return [path]
        return [m for k, v in given.items() for m in _missing(v, stored.get(k, _ABSENT), f"{path}.{k}")]
    if isinstance(given, list):
        if not isinstance(stored, list) or len(stored) != len(given):
            return [path]
        return [m for i, v in enumerate(given) for m in _missing(v, stored[i], f"{path}[{i}]")]
    return [] if stored == given else [path]


_ABSENT = object()


@pytest.mark.parametrize("path", [*VALID, *REFUSED], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fixture_is_accepted_strictly_and_stored_whole(plane: ControlPlane, path: Path) -> None:
    for doc in documents(path):
        proc = kubectl(
            plane, "create", "--dry-run=server", "--validate=strict", "-o", "json", "-f", "-", manifest=doc
        )
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"
        assert "unknown field" not in proc.stderr, proc.stderr
        stored = json.loads(proc.stdout)
        assert _missing(doc["spec"], stored["spec"]) == [], f"{path.name}: pruned or changed"


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_fixture_is_refused_naming_the_field(plane: ControlPlane, path: Path) -> None:
    field, fragment = expectation(path)
    (doc,) = documents(path)
    proc = kubectl(plane, "create", "--dry-run=server", "--validate=strict", "-f", "-", manifest=doc)
    assert proc.returncode != 0, f"{path.name}: accepted:\n{proc.stdout}"
    assert field in proc.stderr and fragment in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------ through the operator


@pytest.fixture(scope="module")
def operator(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    process = OperatorProcess(plane, tmp_path_factory.mktemp("operator")).start()
    try:
        yield process
    finally:
        process.stop()


def _apply(plane: ControlPlane, doc: dict[str, Any]) -> None:
    proc = kubectl(plane, "apply", "--validate=strict", "-f", "-", manifest=doc)
    assert proc.returncode == 0, proc.stderr


def _fixture(name: str) -> dict[str, Any]:
    (doc,) = documents(next(p for p in [*VALID, *REFUSED] if p.stem == name))
    return doc


@pytest.fixture(scope="module")
def references(plane: ControlPlane) -> dict[str, Any]:
    """The fixtures' Agent (allowing two Secrets), an image/command provider named as the fixture's
    runner, the ImplementationSpec and the VersionControlProvider."""
    provider = {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentProvider",
        "metadata": {"name": "compat-runner"},
        "spec": {"image": "busybox:1.36", "command": ["sh", "-c", "true"]},
    }
    agent = _fixture("agent")
    agent["spec"].pop("vcsRef")  # these runs need no repository (the VCS semantics have tests of their own)
    secrets = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"token": "t"}}
        for name in agent["spec"]["security"]["allowedSecrets"]
    ]
    for doc in (
        *secrets,
        provider,
        agent,
        _fixture("implementationspec"),
        _fixture("versioncontrolprovider"),
    ):
        _apply(plane, doc)
    return agent


def _run(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agentRef": {"name": "compat-agent"},
        "implementation": {"inline": {"text": "say hello"}},
        "runtime": {"type": "job"},
        **spec,
    }
    return {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": body,
    }


def _status(plane: ControlPlane, name: str) -> dict[str, Any]:
    status: dict[str, Any] = api.agentrun(plane, NAMESPACE, name).get("status") or {}
    return status


def _finished(plane: ControlPlane, name: str) -> dict[str, Any]:
    return eventually(
        lambda: (s := _status(plane, name)).get("phase") in ("Failed", "Succeeded") and s,
        timeout=90,
        what=f"{name} to finish",
    )


def test_a_template_never_runs(plane: ControlPlane, operator: OperatorProcess, references: Any) -> None:
    doc = _fixture("agentrun-template")
    _apply(plane, doc)
    status = eventually(
        lambda: (
            _status(plane, doc["metadata"]["name"]).get("reason") == "Template"
            and _status(plane, doc["metadata"]["name"])
        ),
        timeout=90,
        what="the template's status",
    )
    assert status["phase"] == "Pending" and "never runs" in status["message"]
    assert api.jobs_of_run(plane, NAMESPACE, doc["metadata"]["name"]) == []


def test_an_unsupported_runtime_is_invalid_before_any_job(
    plane: ControlPlane, operator: OperatorProcess, references: Any
) -> None:
    doc = _fixture("agentrun-temporal")
    _apply(plane, doc)
    status = _finished(plane, doc["metadata"]["name"])
    assert (status["phase"], status["reason"]) == ("Failed", "RuntimeNotSupported")
    assert "spec.runtime.type" in status["message"] and "not supported by this operator" in status["message"]
    assert any(c["type"] == "InvalidSpec" and c["status"] == "True" for c in status["conditions"])
    assert api.jobs_of_run(plane, NAMESPACE, doc["metadata"]["name"]) == []


def test_a_secret_the_agent_does_not_allow_is_invalid_naming_both(
    plane: ControlPlane, operator: OperatorProcess, references: Any
) -> None:
    _apply(plane, _run("compat-forbidden-secret", secrets=["compat-github-token", "not-allowed"]))
    status = _finished(plane, "compat-forbidden-secret")
    assert status["reason"] == "NotAllowedByAgent"
    assert "spec.secrets[1]" in status["message"] and "'not-allowed'" in status["message"]
    assert "Agent 'compat-agent'" in status["message"]
    assert api.jobs_of_run(plane, NAMESPACE, "compat-forbidden-secret") == []


def test_allowed_secrets_and_the_goal_reach_the_pod(
    plane: ControlPlane, operator: OperatorProcess, references: Any
) -> None:
    run = _run(
        "compat-secrets",
        secrets=["compat-github-token", "compat-codex-auth"],
        goal={"objective": "say hello", "tokenBudget": 1000},
    )
    _apply(plane, run)
    (job,) = eventually(
        lambda: api.jobs_of_run(plane, NAMESPACE, "compat-secrets"), timeout=90, what="the Job"
    )
    main = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "agent-runner")
    assert main["envFrom"] == [
        {"secretRef": {"name": "compat-github-token"}},
        {"secretRef": {"name": "compat-codex-auth"}},
    ]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["AGENTRUN_GOAL_OBJECTIVE"] == "say hello" and env["AGENTRUN_GOAL_TOKEN_BUDGET"] == "1000"
    kubectl(plane, "delete", "agentrun", "compat-secrets", "--wait=false")


def test_the_printer_columns_of_the_original(plane: ControlPlane, operator: OperatorProcess) -> None:
    table = kubectl(plane, "get", "agentruns", "compat-forbidden-secret", "-o", "wide")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.strip().splitlines()
    assert header.split()[:8] == [
        "NAME", "PHASE", "AGENT", "SUCCEEDED", "REASON", "STARTTIME", "COMPLETIONTIME", "RUNTIME",
    ]  # fmt: skip
    assert row.split()[:5] == [
        "compat-forbidden-secret",
        "Failed",
        "compat-agent",
        "False",
        "NotAllowedByAgent",
    ]
    assert (
        yaml.safe_load(kubectl(plane, "get", "vcp", "compat-github", "-o", "yaml").stdout)["spec"]["provider"]
        == "github"
    )
