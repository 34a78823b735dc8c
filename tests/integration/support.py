"""Helpers the integration tests share: polling for a condition, and a minimal workflow run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrun_operator.devcluster.controlplane import ControlPlane


def eventually(check: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    """Poll `check` until it holds; fail the test naming `what` when `timeout` runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def workflow_run(name: str, step: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """An AgentRun with one step `implement` (fields from `step`) on a `workspace` PVC."""
    return {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "runtime": {"type": "workflow"},
            "workload": {
                "image": "busybox:1.36",
                "command": ["sh", "-c", "true"],
                "volumes": [
                    {"name": "workspace", "type": "pvc", "claimName": "ws", "mountPath": "/workspace"}
                ],
            },
            "workflow": {"steps": [{"name": "implement", **step}]},
            **spec,
        },
    }


def bound_claim(plane: ControlPlane, namespace: str, name: str = "ws") -> None:
    """A PersistentVolumeClaim bound by the controller-manager to a static volume made for it.

    The integration tier has no pod runner (so no local provisioner); the operator only needs the
    claim to exist and be Bound before it starts a run (the fake kubelet never mounts anything).
    """
    volume = f"static-{namespace}-{name}"
    docs = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "claimRef": {"namespace": namespace, "name": name},
                "hostPath": {"path": f"/nonexistent/agentrun-tests/{volume}"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]
    for doc in docs:
        plane.kubectl("apply", "-f", "-", input_text=json.dumps(doc))
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}"

    def bound() -> bool:
        code, body = plane.api_get(path)
        return code == 200 and json.loads(body).get("status", {}).get("phase") == "Bound"

    eventually(bound, what=f"claim {namespace}/{name} to be bound")
