"""The kind path (docs/design.md#real-parts): the Dockerfile image on a kind cluster, installed from
the Helm chart with loops on, running AgentRuns in real containers (busybox) and checking how they end.

Docker hosts only. Where no Docker engine answers, every test here is skipped and the reason is
printed (`pytest -rs`, as `make kind` runs it). On a Docker host the path is opt-in, because it
builds an image and a cluster: `make kind` (or `AGENTRUN_KIND=1 pytest tests/kind`). Set
`AGENTRUN_KIND_KEEP=1` to keep the cluster afterwards (`tests/kind/kind.sh down` removes it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.manifests import WORKSPACE_PVC, agentrun

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "kind.sh"
EXAMPLES_DIR = HERE.parents[1] / "examples"
NAMESPACE = "agentrun-kind-examples"
RUNNER_IMAGE = os.environ.get("AGENTRUN_KIND_RUNNER_IMAGE", "busybox:1.36")


def _kind_sh_problem(command: str) -> str | None:
    """Why the kind path cannot run here (`kind.sh check`: no engine; `images`: no node image)."""
    proc = subprocess.run([str(SCRIPT), command], capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode == 0:
        return None
    return proc.stderr.strip() or f"kind.sh {command} exited {proc.returncode}"


@dataclass
class Kind:
    kubeconfig: str
    kubectl: str

    def run(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [self.kubectl, f"--kubeconfig={self.kubeconfig}", *args],
            input=input_text,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}")
        return proc.stdout

    def apply(self, manifest: dict[str, Any]) -> None:
        self.run("apply", "-n", NAMESPACE, "-f", "-", input_text=json.dumps(manifest))

    def wait_finished(self, name: str, timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        run: dict[str, Any] = {}
        while time.monotonic() < deadline:
            run = json.loads(self.run("get", "agentrun", name, "-n", NAMESPACE, "-o", "json"))
            if (run.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Cancelled"):
                return run
            time.sleep(2)
        print(self.run("describe", "agentrun", name, "-n", NAMESPACE, check=False))
        print(self.run("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False))
        print(
            self.run("logs", "-n", "agentrun-system", "deploy/agentrun-operator", "--tail=200", check=False)
        )
        raise AssertionError(f"agentrun {name} did not finish in {timeout}s: {run.get('status')}")


@pytest.fixture(scope="module")
def kind() -> Iterator[Kind]:
    problem = _kind_sh_problem("check")
    if problem is not None:
        pytest.skip(f"kind path skipped: {problem}")
    if os.environ.get("AGENTRUN_KIND") != "1":
        pytest.skip("kind path is opt-in on Docker hosts (it builds an image and a cluster): run `make kind`")
    problem = _kind_sh_problem("images")
    if problem is not None:
        pytest.skip(f"kind path skipped: {problem}")
    proc = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, check=False, timeout=3600)
    print(proc.stderr[-5000:])
    assert proc.returncode == 0, f"kind.sh up failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    kubeconfig = proc.stdout.strip().splitlines()[-1].removeprefix("KUBECONFIG=")
    kubectl = shutil.which("kubectl") or str(
        Path(
            subprocess.run(
                [str(HERE.parents[1] / ".venv" / "bin" / "agentrun"), "dev", "tools"],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        / "kubectl"
    )
    cluster = Kind(kubeconfig, kubectl)
    cluster.run("create", "namespace", NAMESPACE, check=False)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "workspace"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}},
        }
    )
    try:
        yield cluster
    finally:
        cluster.run("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        if os.environ.get("AGENTRUN_KIND_KEEP") != "1":
            subprocess.run([str(SCRIPT), "down"], check=False)


def _run(name: str, command: str, loop: dict[str, Any]) -> dict[str, Any]:
    volume = {**WORKSPACE_PVC, "claimName": "workspace"}
    workload = {"image": RUNNER_IMAGE, "command": ["sh", "-c", command], "volumes": [volume]}
    return agentrun(name, [{"name": "work", "loop": loop}], workload=workload)


def _loop(run: dict[str, Any]) -> dict[str, Any]:
    return dict(run["status"]["workflow"]["steps"][0]["loop"])


# The repository's examples (examples/*.yaml, their outcomes in each file's header) in real containers:
# file -> (run name, phase, stop reason, completed iterations).
EXAMPLES = {
    "fixed-loop.yaml": ("fixed-loop", "Succeeded", "LoopMaxIterationsReached", 3),
    "conditional-loop.yaml": ("conditional-loop", "Succeeded", "LoopConditionFalse", 3),
    "retries.yaml": ("retries", "Succeeded", "LoopMaxIterationsReached", 2),
    "timeout.yaml": ("timeout", "Succeeded", None, 1),
    "agent-trio.yaml": ("agent-trio", "Succeeded", "LoopMaxIterationsReached", 2),
}


def _apply_example(kind: Kind, filename: str) -> None:
    """Every example carries its PersistentVolumeClaim (kind's default StorageClass binds it)."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES_DIR / filename).read_text()) if d]
    assert any(d.get("kind") == "PersistentVolumeClaim" for d in docs), filename
    for doc in docs:
        kind.apply(doc)


@pytest.mark.parametrize("filename", sorted(EXAMPLES))
def test_example_reaches_its_outcome(kind: Kind, filename: str) -> None:
    name, phase, stop_reason, completed = EXAMPLES[filename]
    _apply_example(kind, filename)
    run = kind.wait_finished(name)
    assert run["status"]["phase"] == phase, run["status"]
    loop_status = _loop(run)
    if stop_reason is not None:
        assert loop_status["stopReason"] == stop_reason
    assert loop_status["completedIterations"] == completed


def test_example_cancel_immediate(kind: Kind) -> None:
    _apply_example(kind, "cancel-immediate.yaml")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        pods = json.loads(
            kind.run(
                "get",
                "pods",
                "-n",
                NAMESPACE,
                "-l",
                "agents.proompteng.ai/agent-run=cancel-immediate",
                "-o",
                "json",
            )
        )["items"]
        if any(p["status"].get("phase") == "Running" for p in pods):
            break
        time.sleep(2)
    kind.run(
        "patch",
        "agentrun",
        "cancel-immediate",
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        '{"spec":{"cancel":"Immediate"}}',
    )
    run = kind.wait_finished("cancel-immediate")
    assert run["status"]["phase"] == "Cancelled", run["status"]
    assert _loop(run)["stopReason"] == "LoopCancelled"


def test_failing_iteration_fails_the_loop(kind: Kind) -> None:
    kind.apply(_run("kind-failing", "exit 3", {"maxIterations": 2}))
    run = kind.wait_finished("kind-failing")
    assert run["status"]["phase"] == "Failed", run["status"]
    assert _loop(run)["stopReason"] == "LoopIterationFailed"


def test_operator_pod_runs_restricted_and_non_root(kind: Kind) -> None:
    pods = json.loads(
        kind.run(
            "get",
            "pods",
            "-n",
            "agentrun-system",
            "-l",
            "app.kubernetes.io/name=agentrun-operator",
            "-o",
            "json",
        )
    )["items"]
    assert pods
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert all(c["ready"] for c in pod["status"]["containerStatuses"])
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
