"""AgentRun manifests for tests: one builder instead of a literal in every file."""

from __future__ import annotations

import copy
from typing import Any

from agentrun_operator.api import API_VERSION

WORKSPACE_PVC: dict[str, Any] = {
    "name": "workspace",
    "type": "pvc",
    "claimName": "ws",
    "mountPath": "/workspace",
}
"""The PVC volume most tests mount: claim `ws` at /workspace."""


def agentrun(
    name: str,
    steps: list[dict[str, Any]] | None = None,
    *,
    metadata: dict[str, Any] | None = None,
    workload: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """An AgentRun manifest: `runtime.type: workflow` unless `spec` says otherwise, the given
    workload and steps (each left out when None), and any other spec fields as keyword arguments."""
    body: dict[str, Any] = {"runtime": {"type": "workflow"}}
    if workload is not None:
        body["workload"] = copy.deepcopy(workload)
    if steps is not None:
        body["workflow"] = {"steps": copy.deepcopy(steps)}
    body.update(spec)
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentRun",
        "metadata": {"name": name, **(metadata or {})},
        "spec": body,
    }


def workflow_run(name: str, step: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """An AgentRun with one step `implement` (fields from `step`) running busybox on the workspace PVC."""
    return agentrun(
        name,
        [{"name": "implement", **step}],
        workload={"image": "busybox:1.36", "command": ["sh", "-c", "true"], "volumes": [WORKSPACE_PVC]},
        **spec,
    )


CLAIM = """\
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
"""


def claim_yaml(name: str) -> str:
    """A 1Gi ReadWriteOnce claim `name` for the default StorageClass, as YAML ending with `---`."""
    return CLAIM.format(name=name)
