"""The local default's storage: a default StorageClass and a small provisioner of directory volumes.

It works like an external provisioner on a real cluster. The kube-controller-manager's PV binder
sees a claim of the class `agentrun-local` and annotates it with our provisioner's name; we create a
PersistentVolume for it (a `local` volume: the directory `<state>/pv/<pv-name>/` on one node,
`claimRef` set to the claim); the binder binds the two. When the claim is deleted the binder marks
the volume `Released` and, since the volume says it was provisioned by us, leaves its deletion to
us: we remove the directory and the PersistentVolume (reclaim policy `Delete`).

Volumes are made as a typical provisioner makes them: the directory owned by root, mode `0755` (not
a permissive mode that would hide a container user's missing write access), and of kind `local`
with a required node affinity on the node's `kubernetes.io/hostname` label, so a real kubelet mounts
it and applies the pod's `fsGroup` to it (it does not to `hostPath` volumes); the local pod runner
does the same (podrunner/ownership.py).

The decisions are pure functions of listed objects (unit-tested); `LocalProvisioner` only lists,
watches and applies them. It runs inside the local pod runner (the node owns its local disks), or on
its own beside a real kubelet: `agentrun dev provisioner --kubeconfig K --state-dir D
--node N` (`run_provisioner`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from agentrun_devcluster.podrunner.api import Api, ApiError

log = logging.getLogger("agentrun.provisioner")

PROVISIONER: Final = "agents.proompteng.ai/local-dir"
STORAGE_CLASS: Final = "agentrun-local"
ANN_PROVISIONER: Final = "volume.kubernetes.io/storage-provisioner"
ANN_PROVISIONER_BETA: Final = "volume.beta.kubernetes.io/storage-provisioner"
ANN_PROVISIONED_BY: Final = "pv.kubernetes.io/provisioned-by"
ANN_DEFAULT_CLASS: Final = "storageclass.kubernetes.io/is-default-class"
LABEL_CLAIM_NAMESPACE: Final = "agents.proompteng.ai/claim-namespace"
LABEL_CLAIM_NAME: Final = "agents.proompteng.ai/claim-name"
LABEL_HOSTNAME: Final = "kubernetes.io/hostname"
RESYNC_SECONDS: Final = 10.0
VOLUME_MODE: Final = 0o755
"""What a typical provisioner gives: root's, writable by no one else (fsGroup opens it to a pod)."""


def storage_class() -> dict[str, Any]:
    """The default StorageClass of the local default (binding at once: one node, one disk)."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": {ANN_DEFAULT_CLASS: "true"}},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def volume_name(claim: Mapping[str, Any]) -> str:
    """Deterministic, like every dynamic provisioner's: `pvc-<claim uid>` (a retry never makes two)."""
    return f"pvc-{claim['metadata']['uid']}"


def volume_dir(root: Path, name: str) -> Path:
    return root / "pv" / name


def _ours(claim: Mapping[str, Any]) -> bool:
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    return PROVISIONER in (annotations.get(ANN_PROVISIONER), annotations.get(ANN_PROVISIONER_BETA))


def claims_to_provision(
    claims: Iterable[Mapping[str, Any]], volume_names: Iterable[str]
) -> list[Mapping[str, Any]]:
    """Claims the binder handed to us that have no volume yet (unbound, not being deleted)."""
    existing = set(volume_names)
    wanted = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        spec = claim.get("spec") or {}
        if not _ours(claim) or meta.get("deletionTimestamp") or spec.get("volumeName"):
            continue
        if (claim.get("status") or {}).get("phase", "Pending") != "Pending":
            continue
        if (spec.get("volumeMode") or "Filesystem") != "Filesystem":
            continue  # a directory cannot be a raw block device; the claim stays Pending
        if volume_name(claim) in existing:
            continue
        wanted.append(claim)
    return wanted


def node_hostname(node: Mapping[str, Any]) -> str:
    """The value a `local` volume's node affinity must name: the Node's `kubernetes.io/hostname`
    label (the kubelet sets it from the host name, which need not be the Node's name)."""
    meta = node.get("metadata") or {}
    return str((meta.get("labels") or {}).get(LABEL_HOSTNAME) or meta.get("name") or "")


def volume_for(claim: Mapping[str, Any], root: Path, hostname: str) -> dict[str, Any]:
    """The PersistentVolume that satisfies `claim`: its size, its access modes, pre-bound to it, a
    `local` directory on the node whose `kubernetes.io/hostname` is `hostname`."""
    meta = claim["metadata"]
    spec = claim.get("spec") or {}
    name = volume_name(claim)
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    on_host = {"key": LABEL_HOSTNAME, "operator": "In", "values": [hostname]}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": {ANN_PROVISIONED_BY: PROVISIONER},
            "labels": {LABEL_CLAIM_NAMESPACE: meta["namespace"], LABEL_CLAIM_NAME: meta["name"]},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": spec.get("storageClassName") or STORAGE_CLASS,
            "volumeMode": "Filesystem",
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "local": {"path": str(volume_dir(root, name))},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [on_host]}]}},
        },
    }


def make_volume_dir(directory: Path) -> None:
    """The volume's directory as a typical provisioner leaves it: root's (when we are root), `0755`."""
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(directory, 0, 0)
    directory.chmod(VOLUME_MODE)


def local_path(volume: Mapping[str, Any]) -> str | None:
    """The directory of a `hostPath` or `local` PersistentVolume (None for any other kind)."""
    spec = volume.get("spec") or {}
    source = spec.get("hostPath") or spec.get("local") or {}
    path = source.get("path")
    return str(path) if path else None


def volumes_to_reclaim(volumes: Iterable[Mapping[str, Any]], root: Path) -> list[Mapping[str, Any]]:
    """Our volumes whose claim is gone (`Released`, or `Failed`), reclaim policy `Delete`, under `root`."""
    result = []
    for volume in volumes:
        meta = volume.get("metadata") or {}
        if (meta.get("annotations") or {}).get(ANN_PROVISIONED_BY) != PROVISIONER:
            continue
        if (volume.get("spec") or {}).get("persistentVolumeReclaimPolicy") != "Delete":
            continue
        if (volume.get("status") or {}).get("phase") not in ("Released", "Failed"):
            continue
        if meta.get("deletionTimestamp"):
            continue
        if not is_under(local_path(volume), root / "pv"):
            continue  # another provisioner's (another state directory): not ours to delete
        result.append(volume)
    return result


def is_under(path: str | None, root: Path) -> bool:
    if not path:
        return False
    resolved, base = Path(path).resolve(), root.resolve()
    return resolved != base and base in resolved.parents


class LocalProvisioner:
    """Creates and reclaims the directory volumes of claims in `namespaces` (all when empty), on the
    node `node` (the Node's name; its volumes are `local` to it)."""

    def __init__(self, api: Api, root: Path, node: str, namespaces: tuple[str, ...] = ()) -> None:
        self.api = api
        self.root = root
        self.node = node
        self.namespaces = namespaces
        self.wake = threading.Event()
        self.healthy = False
        self._class_ready = False

    def ensure_storage_class(self) -> None:
        if self._class_ready:
            return
        path = f"/apis/storage.k8s.io/v1/storageclasses/{STORAGE_CLASS}"
        if self.api.get(path) is None:
            with contextlib.suppress(ApiError):  # 409: created meanwhile by another runner
                self.api.request("POST", "/apis/storage.k8s.io/v1/storageclasses", storage_class())
                log.info("created the default StorageClass %s (provisioner %s)", STORAGE_CLASS, PROVISIONER)
        self._class_ready = True

    def _claims(self) -> list[dict[str, Any]]:
        if not self.namespaces:
            return list(self.api.request("GET", "/api/v1/persistentvolumeclaims").get("items") or [])
        claims: list[dict[str, Any]] = []
        for ns in self.namespaces:
            path = f"/api/v1/namespaces/{ns}/persistentvolumeclaims"
            claims.extend(self.api.request("GET", path).get("items") or [])
        return claims

    def sync(self) -> None:
        """One level-triggered pass: provision what is wanted, reclaim what is released."""
        volumes = list(self.api.request("GET", "/api/v1/persistentvolumes").get("items") or [])
        names = [str(v["metadata"]["name"]) for v in volumes]
        wanted = claims_to_provision(self._claims(), names)
        node = self.api.get(f"/api/v1/nodes/{self.node}") if wanted else None
        if wanted and node is None:
            log.info("waiting for Node %s to register to provision %d claim(s)", self.node, len(wanted))
            wanted = []
        for claim in wanted:
            manifest = volume_for(claim, self.root, node_hostname(node or {}))
            directory = Path(manifest["spec"]["local"]["path"])
            make_volume_dir(directory)
            try:
                self.api.request("POST", "/api/v1/persistentvolumes", manifest)
            except ApiError as exc:
                if exc.status != 409:
                    raise
            meta = claim["metadata"]
            log.info(
                "provisioned %s for claim %s/%s at %s",
                volume_name(claim),
                meta["namespace"],
                meta["name"],
                directory,
            )
        for volume in volumes_to_reclaim(volumes, self.root):
            name = str(volume["metadata"]["name"])
            path = local_path(volume)
            if path:
                shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(ApiError):
                self.api.request("DELETE", f"/api/v1/persistentvolumes/{name}")
            log.info("reclaimed %s (its claim is gone): removed %s", name, path)

    def _watch(self, path: str, stopping: threading.Event) -> None:
        """Wake the sync loop on every change of `path` (claims, or volumes)."""
        while not stopping.is_set():
            try:
                version = str(self.api.request("GET", path)["metadata"]["resourceVersion"])
                self.wake.set()
                for _event in self.api.watch(path, version):
                    self.wake.set()
                    if stopping.is_set():
                        return
            except Exception as exc:
                if not stopping.is_set():
                    log.warning("provisioner watch of %s ended (%s); again", path, exc)
                    stopping.wait(1.0)

    def run(self, stopping: threading.Event) -> None:
        """Until `stopping`: sync on every change of a claim or volume, and every few seconds anyway."""
        paths = ["/api/v1/persistentvolumes"]
        paths += [f"/api/v1/namespaces/{ns}/persistentvolumeclaims" for ns in self.namespaces] or [
            "/api/v1/persistentvolumeclaims"
        ]
        for path in paths:
            threading.Thread(
                target=self._watch, args=(path, stopping), daemon=True, name=f"pv-{path}"
            ).start()
        while not stopping.is_set():
            try:
                self.ensure_storage_class()
                self.wake.clear()
                self.sync()
                self.healthy = True
            except Exception as exc:  # the next pass retries; the runner must not die of it
                self.healthy = False
                log.warning("provisioner pass failed: %s", exc)
            self.wake.wait(RESYNC_SECONDS)

    def stop(self) -> None:
        self.wake.set()  # the caller has set `stopping`; end the wait at once


def run_provisioner(
    kubeconfig: Path,
    state_dir: Path,
    node: str,
    namespaces: tuple[str, ...] = (),
    stopping: threading.Event | None = None,
) -> None:
    """The provisioner on its own (beside a real kubelet), until `stopping` (or SIGTERM/SIGINT when
    none is given). Volumes go to `<state_dir>/pv/`, local to the Node `node`; the API client keeps
    its decoded credentials in `<state_dir>/run/provisioner-client/`."""
    from agentrun_devcluster.podrunner.api import Api

    api = Api(kubeconfig, state_dir / "run" / "provisioner-client")
    provisioner = LocalProvisioner(api, state_dir, node, namespaces)
    if stopping is None:
        stopping = threading.Event()

        def on_signal(_signum: int, _frame: object) -> None:
            stopping.set()
            provisioner.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    log.info("provisioning claims of class %s on node %s under %s", STORAGE_CLASS, node, state_dir / "pv")
    provisioner.run(stopping)
