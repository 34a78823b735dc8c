"""The e2e tier: the real control plane, the operator as a process and the local pod runner as a
process, so every pod of every iteration runs real commands on real (bind-mounted) volumes.

The runner and the operator watch only the `e2e` namespace, so they never meet the integration
tests' fake kubelet (namespace `loops`). Claims are real PersistentVolumeClaims, bound by the
controller-manager to volumes the runner's local provisioner creates (directories under its state,
`<state>/pv/pvc-<claim uid>/`), which the tests read to check what the iterations left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentrun_operator.devcluster.controlplane import ControlPlane
from agentrun_operator.devcluster.podrunner.main import READY_LINE
from tests.integration.operator_process import OperatorProcess

NAMESPACE = "e2e"
NODE = "agentrun-e2e"
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
TERMINAL = ("Succeeded", "Failed", "Cancelled")


def runs_path(namespace: str) -> str:
    return f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{namespace}/agentruns"


def eventually(check: Callable[[], Any], timeout: float = 120.0, what: str = "", every: float = 0.2) -> Any:
    """Poll until `check()` is truthy; return its value. Generous: the machine has 2 cores."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def processes_with(*argv: str) -> list[int]:
    """PIDs whose command line is exactly `argv` (e.g. ("sleep", "7777")), zombies excluded."""
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes() != wanted:
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


class RunnerProcess:
    """`agentrun dev pod-runner` as its own process (own session, so it can be stopped as a group)."""

    def __init__(
        self,
        plane: ControlPlane,
        state_dir: Path,
        node: str = NODE,
        namespaces: tuple[str, ...] = (NAMESPACE,),
        runtime: str = "process",
    ) -> None:
        self.plane = plane
        self.state_dir = state_dir
        self.node = node
        self.namespaces = namespaces
        self.runtime = runtime
        self.log_path = state_dir / "pod-runner.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RunnerProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agentrun_operator.cli",
                    "dev",
                    "pod-runner",
                    f"--kubeconfig={self.plane.kubeconfig}",
                    f"--state-dir={self.state_dir}",
                    f"--node={self.node}",
                    *(f"--namespace={ns}" for ns in self.namespaces),
                    f"--runtime={self.runtime}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = self.proc
        eventually(
            lambda: READY_LINE in self.log_path.read_text(errors="replace") or proc.poll() is not None,
            timeout=60,
            what="the pod runner to start",
        )
        if proc.poll() is not None:
            raise RuntimeError(f"pod runner exited {proc.returncode}:\n{self.logs()[-3000:]}")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """What a container of a pod this runner ran has printed so far (all restarts, in order)."""
        logs = sorted((self.state_dir / "pods" / namespace / pod).glob(f"*/logs/{container}/*.log"))
        return "".join(path.read_text(errors="replace") for path in logs)


def bound_claim_dir(plane: ControlPlane, state_dir: Path, namespace: str, claim: str) -> Path:
    """The directory of the volume bound to `namespace/claim` (waits for the binding); it must lie
    under the state directory of the runner whose provisioner made it."""

    def bound_volume() -> str | None:
        code, body = plane.api_get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        obj = json.loads(body) if code == 200 else {}
        return (
            (obj.get("spec") or {}).get("volumeName")
            if (obj.get("status") or {}).get("phase") == "Bound"
            else None
        )

    volume = eventually(bound_volume, timeout=60, what=f"claim {namespace}/{claim} to be bound")
    code, body = plane.api_get(f"/api/v1/persistentvolumes/{volume}")
    assert code == 200, (code, body[:300])
    path = Path(json.loads(body)["spec"]["hostPath"]["path"])
    assert state_dir in path.parents, f"{path} is not under the runner's state {state_dir}"
    return path


def create_claim(plane: ControlPlane, namespace: str, claim: str, storage_class: str | None = None) -> None:
    """A 1Gi ReadWriteOnce claim, as a user creates one (the default StorageClass unless given)."""
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    doc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim}, "spec": spec}
    plane.kubectl("apply", "-n", namespace, "-f", "-", input_text=json.dumps(doc))


@dataclass
class LocalDefault:
    """What an e2e test works with."""

    plane: ControlPlane
    runner: RunnerProcess
    operator: OperatorProcess
    namespace: str = NAMESPACE

    @property
    def state_dir(self) -> Path:
        return self.runner.state_dir

    def claim_dir(self, claim: str) -> Path:
        """The directory of the volume bound to `claim` (waits for the binding)."""
        return bound_claim_dir(self.plane, self.state_dir, self.namespace, claim)

    def create_claim(self, claim: str, storage_class: str | None = None) -> None:
        """A 1Gi ReadWriteOnce claim, as a user creates one (the default StorageClass unless given)."""
        create_claim(self.plane, self.namespace, claim, storage_class)

    def apply(self, manifest: str) -> None:
        self.plane.kubectl("apply", "-n", self.namespace, "-f", "-", input_text=manifest)

    def apply_example(self, name: str, edit: Callable[[str], str] | None = None) -> str:
        text = (EXAMPLES / name).read_text()
        if edit is not None:
            text = edit(text)
        self.apply(text)
        return text

    def run(self, name: str) -> dict[str, Any]:
        code, body = self.plane.api_get(f"{runs_path(self.namespace)}/{name}")
        assert code == 200, (code, body[:300])
        result: dict[str, Any] = json.loads(body)
        return result

    def wait_for_end(self, name: str, timeout: float = 240.0) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            obj = self.run(name)
            return obj if (obj.get("status") or {}).get("phase") in TERMINAL else None

        try:
            result: dict[str, Any] = eventually(ended, timeout=timeout, what=f"AgentRun {name} to end")
        except AssertionError:
            raise AssertionError(
                f"AgentRun {name} did not end: {json.dumps(self.run(name).get('status'), indent=1)}\n"
                f"--- runner log ---\n{self.runner.logs()[-3000:]}\n"
                f"--- operator log ---\n{self.operator.logs()[-3000:]}"
            ) from None
        return result

    def patch_run(self, name: str, patch: dict[str, Any]) -> None:
        self.plane.kubectl(
            "patch", "agentrun", name, "-n", self.namespace, "--type", "merge", "-p", json.dumps(patch)
        )


def step_status(run: dict[str, Any], index: int = 0) -> dict[str, Any]:
    steps = ((run.get("status") or {}).get("workflow") or {}).get("steps") or []
    result: dict[str, Any] = steps[index]
    return result


@pytest.fixture(autouse=True)
def needs_bubblewrap() -> None:
    """The pod runner cannot mount volumes without bwrap (`make setup` installs it as root)."""
    from agentrun_operator.devcluster.podrunner.sandbox import SandboxUnavailable, find_bwrap

    try:
        find_bwrap()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))


def start_local_default(
    plane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
    namespace: str = NAMESPACE,
    node: str = NODE,
    runtime: str = "process",
    operator_env: dict[str, str] | None = None,
) -> Iterator[LocalDefault]:
    """A namespace, a pod runner (`runtime`) and an operator watching only it; torn down at the end."""
    if not plane.kubectl("get", "ns", namespace, "--ignore-not-found", "-o", "name").strip():
        plane.kubectl("create", "namespace", namespace)
    eventually(
        lambda: plane.api_get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")[0] == 200,
        what=f"the {namespace} namespace's default ServiceAccount",
    )
    runner = RunnerProcess(
        plane, tmp_path_factory.mktemp("runner-state"), node, (namespace,), runtime
    ).start()
    operator = OperatorProcess(
        plane,
        tmp_path_factory.mktemp(f"{namespace}-operator"),
        env={
            "AGENTS_CONTROLLER_NAMESPACES": namespace,
            "AGENTS_CONTROLLER_JOB_TTL_SECONDS": "600",
            **(operator_env or {}),
        },
    )
    try:
        operator.start()
        yield LocalDefault(plane, runner, operator, namespace)
    finally:
        # Runs end here, so no later operator (the integration tier's is cluster-wide) picks them up.
        plane.kubectl("delete", "agentruns", "--all", "-n", namespace, "--wait=false", check=False)
        operator.stop()
        runner.stop()


@pytest.fixture(scope="session")
def local_default(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalDefault]:
    yield from start_local_default(control_plane, tmp_path_factory)
