"""Version control and the runner contract through the operator, against the real API server
(docs/api.md#version-control, docs/api.md#runner-contract): the bad inputs are InvalidSpec before any
Job, naming the field and the fix; a good run's Job carries the repository, branches and the
credential its mode allows, and the runner contract's ConfigMap is created before the Job."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from tests.support import api
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess

NAMESPACE = "vcs"
GROUP = "agents.proompteng.ai/v1alpha1"


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    if not control_plane.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found", "-o", "name").strip():
        control_plane.kubectl("create", "namespace", NAMESPACE)
    return control_plane


def _apply(plane: ControlPlane, doc: dict[str, Any]) -> None:
    proc = subprocess.run(
        [
            str(plane.bin_dir / "kubectl"),
            f"--kubeconfig={plane.kubeconfig}",
            "-n",
            NAMESPACE,
            "apply",
            "--validate=strict",
            "-f",
            "-",
        ],
        input=json.dumps(doc),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def _obj(kind: str, name: str, spec: dict[str, Any], api_version: str = GROUP) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec}


@pytest.fixture(scope="module")
def operator(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    env = {"AGENTS_CONTROLLER_REFERENCE_GRACE_SECONDS": "2"}
    process = OperatorProcess(plane, tmp_path_factory.mktemp("operator"), env=env).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def objects(plane: ControlPlane) -> None:
    token = {"method": "token", "token": {"secretRef": {"name": "vcs-token", "key": "token"}}}
    for doc in (
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "vcs-token"},
            "stringData": {"token": "t"},
        },
        _obj("AgentProvider", "vcs-shell", {"image": "busybox:1.36", "command": ["sh", "-c", "true"]}),
        _obj(
            "AgentProvider",
            "vcs-runner",
            {
                "binary": "/bin/sh",
                "argsTemplate": ["-c", "true", "{{ agentRun.name }}"],
                "envTemplate": {"REPO": "{{ vcs.repository }}"},
                "inputFiles": [{"path": "/work/task.md", "content": "{{ implementation.text }}"}],
            },
        ),
        _obj("Agent", "vcs-agent", {"providerRef": {"name": "vcs-shell"}}),
        _obj("Agent", "vcs-runner-agent", {"providerRef": {"name": "vcs-runner"}}),
        _obj(
            "VersionControlProvider",
            "gh",
            {"provider": "github", "auth": token, "repositoryPolicy": {"deny": ["acme/secret-*"]}},
        ),
        _obj(
            "VersionControlProvider",
            "gh-no-secret",
            {
                "provider": "github",
                "auth": {"method": "token", "token": {"secretRef": {"name": "vcs-missing", "key": "token"}}},
            },
        ),
        _obj(
            "VersionControlProvider",
            "gh-app",
            {
                "provider": "github",
                "auth": {
                    "method": "app",
                    "app": {
                        "appId": 1,
                        "installationId": 2,
                        "privateKeySecretRef": {"name": "vcs-token", "key": "token"},
                    },
                },
            },
        ),
    ):
        _apply(plane, doc)


def _run(name: str, agent: str = "vcs-agent", **spec: Any) -> dict[str, Any]:
    body = {
        "agentRef": {"name": agent},
        "implementation": {"inline": {"text": "say hello"}},
        "runtime": {"type": "job"},
        "parameters": {"repository": "acme/app", "head": "agent/x"},
        **spec,
    }
    return {"apiVersion": GROUP, "kind": "AgentRun", "metadata": {"name": name}, "spec": body}


def _status(plane: ControlPlane, name: str) -> dict[str, Any]:
    status: dict[str, Any] = api.agentrun(plane, NAMESPACE, name).get("status") or {}
    return status


def _failed(plane: ControlPlane, name: str) -> dict[str, Any]:
    status: dict[str, Any] = eventually(
        lambda: (s := _status(plane, name)).get("phase") == "Failed" and s, timeout=90, what=f"{name} to fail"
    )
    assert api.jobs_of_run(plane, NAMESPACE, name) == []
    assert any(c["type"] == "InvalidSpec" and c["status"] == "True" for c in status["conditions"])
    return status


@pytest.mark.parametrize(
    ("name", "spec", "expected"),
    [
        (
            "vcs-denied",
            {"vcsRef": {"name": "gh"}, "parameters": {"repository": "acme/secret-x"}},
            ["spec.parameters.repository", "'acme/secret-x' is denied", "fix:"],
        ),
        (
            "vcs-no-secret",
            {"vcsRef": {"name": "gh-no-secret"}},
            ["Secret 'vcs-missing'", "does not exist", "fix: create Secret 'vcs-missing'"],
        ),
        ("vcs-app", {"vcsRef": {"name": "gh-app"}}, ["auth.method is app", "does not implement"]),
        ("vcs-required", {"vcsPolicy": {"required": True}}, ["spec.vcsPolicy.required", "no VersionControl"]),
    ],
)
def test_bad_version_control_is_invalid_before_any_job(
    plane: ControlPlane,
    operator: OperatorProcess,
    objects: None,
    name: str,
    spec: dict[str, Any],
    expected: list[str],
) -> None:
    _apply(plane, _run(name, **spec))
    message = _failed(plane, name)["message"]
    assert all(part in message for part in expected), message
    assert "docs/api.md#version-control" in message


def test_a_good_run_gets_its_repository_and_the_credential_its_mode_allows(
    plane: ControlPlane, operator: OperatorProcess, objects: None
) -> None:
    _apply(plane, _run("vcs-rw", agent="vcs-runner-agent", vcsRef={"name": "gh"}))
    _apply(plane, _run("vcs-ro", vcsRef={"name": "gh"}, vcsPolicy={"mode": "read-only"}))
    for name, mode in (("vcs-rw", "read-write"), ("vcs-ro", "read-only")):
        (job,) = eventually(
            lambda n=name: api.jobs_of_run(plane, NAMESPACE, n), timeout=90, what=f"{name}'s Job"
        )
        main = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "agent-runner")
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in main["env"]}
        assert (env["VCS_REPOSITORY"], env["VCS_HEAD_BRANCH"], env["VCS_MODE"]) == (
            "acme/app",
            "agent/x",
            mode,
        )
        has_token = "VCS_TOKEN" in env
        assert has_token == (mode == "read-write"), env
        assert _status(plane, name)["vcs"]["mode"] == mode
    (job,) = api.jobs_of_run(plane, NAMESPACE, "vcs-rw")
    pod = job["spec"]["template"]["spec"]
    main = next(c for c in pod["containers"] if c["name"] == "agent-runner")
    assert main["command"] == ["/bin/sh"] and main["args"] == ["-c", "true", "vcs-rw"]
    assert {"name": "REPO", "value": "acme/app"} in main["env"]
    volume = next(v for v in pod["volumes"] if v["name"] == "agentrun-runner")
    config_map = json.loads(
        subprocess.run(
            [
                str(plane.bin_dir / "kubectl"),
                f"--kubeconfig={plane.kubeconfig}",
                "-n",
                NAMESPACE,
                "get",
                "configmap",
                volume["configMap"]["name"],
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert config_map["data"]["input-0"] == "say hello"
    assert json.loads(config_map["data"]["run.json"])["vcs"]["repository"] == "acme/app"
    assert config_map["metadata"]["ownerReferences"][0]["name"] == "vcs-rw"
