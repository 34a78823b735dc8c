"""PersistentVolumeClaims for tests: the operator starts a run only once its claims exist and are Bound."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_devcluster.provisioner import local_path
from tests.support.polling import eventually


def bound_claim(plane: ControlPlane, namespace: str, name: str = "ws") -> None:
    """A PersistentVolumeClaim bound by the controller-manager to a static volume made for it.

    The integration tier has no pod runner (so no local provisioner); the operator only needs the
    claim to exist and be Bound before it starts a run (the fake kubelet never mounts anything).
    """
    bound_claims(plane, namespace, [name])


def bound_claims(plane: ControlPlane, namespace: str, names: list[str]) -> None:
    """`bound_claim` for several claims at once: one `kubectl apply` of every volume and claim, then
    one wait until all are Bound (the binder binds them together)."""
    docs: list[dict[str, Any]] = []
    for name in names:
        volume = f"static-{namespace}-{name}"
        docs += [
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
    plane.kubectl(
        "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    )
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"

    def all_bound() -> bool:
        code, body = plane.api_get(path)
        if code != 200:
            return False
        phases = {c["metadata"]["name"]: c.get("status", {}).get("phase") for c in json.loads(body)["items"]}
        return all(phases.get(name) == "Bound" for name in names)

    eventually(all_bound, what=f"claims {namespace}/{','.join(names)} to be bound")


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

    volume = eventually(bound_volume, timeout=60, what=f"claim {namespace}/{claim} to be bound", every=0.2)
    code, body = plane.api_get(f"/api/v1/persistentvolumes/{volume}")
    assert code == 200, (code, body[:300])
    path = Path(str(local_path(json.loads(body))))
    assert state_dir in path.parents, f"{path} is not under the runner's state {state_dir}"
    return path


def create_claim(plane: ControlPlane, namespace: str, claim: str, storage_class: str | None = None) -> None:
    """A 1Gi ReadWriteOnce claim, as a user creates one (the default StorageClass unless given)."""
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    doc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim}, "spec": spec}
    plane.kubectl("apply", "-n", namespace, "-f", "-", input_text=json.dumps(doc))
