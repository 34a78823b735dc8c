"""A pod's volumes as the kubelet makes them: directories under the pod's own, and the binds of
each container's mounts onto them.

`VolumeLookups` reads what volumes refer to from the API server (secrets, configMaps, a
ServiceAccount token, the PersistentVolume bound to a claim); `volume_dir` writes one volume's files;
`binds` maps a container's `volumeMounts` to bind mounts. A missing object or an unbound claim is a
`ContainerConfigError`: the pod waits in `ContainerCreating` and its worker tries again, as a kubelet
does; a volume the kubelet could not mount (a `local` path that does not exist, a `hostPath` of type
`Directory` that is none, a secret or configMap volume whose object is missing) is a
`VolumeMountError`, and the worker posts the kubelet's `FailedMount` Event for it
(podrunner/events.py). The pod's `fsGroup` is applied to its `emptyDir` volumes and
to `local` PersistentVolumes (not to `hostPath` ones), as the kubelet applies it (ownership.py).
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrun_devcluster import provisioner
from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.api import Api, ApiError
from agentrun_devcluster.podrunner.ownership import apply_fs_group
from agentrun_devcluster.podrunner.sandbox import Bind

Files = dict[str, tuple[bytes, int | None]]
"""A volume's files: relative path -> (content, mode or None for the volume's default)."""

READ_ONLY_KINDS = ("secret", "configMap", "projected", "downwardAPI")


class VolumeLookups:
    """What volumes and env refer to, read from the API server when a pod starts."""

    def __init__(self, api: Api, volumes_root: Path) -> None:
        self.api = api
        self.volumes_root = volumes_root  # only the local provisioner's directories are mounted

    def secret(self, namespace: str, name: str) -> Mapping[str, bytes] | None:
        obj = self.api.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        return None if obj is None else S.secret_data(obj)

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        obj = self.api.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        if obj is None and name == "kube-root-ca.crt" and self.api.ca_file:
            return {"ca.crt": Path(self.api.ca_file).read_text()}  # no root-CA publisher runs locally
        if obj is None:
            return None
        data = {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
        data.update({str(k): base64.b64decode(v).decode() for k, v in (obj.get("binaryData") or {}).items()})
        return data

    def service_account_token(self, pod: Mapping[str, Any], src: Mapping[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        body: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": int(src.get("expirationSeconds") or 3607),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta.get("name"),
                    "uid": meta.get("uid"),
                },
            },
        }
        if src.get("audience"):
            body["spec"]["audiences"] = [src["audience"]]
        try:
            answer = self.api.request(
                "POST", f"/api/v1/namespaces/{meta.get('namespace')}/serviceaccounts/{account}/token", body
            )
        except ApiError as exc:
            raise S.ContainerConfigError(f"cannot get a token for serviceaccount {account}: {exc}") from None
        return str((answer.get("status") or {}).get("token", ""))

    def claim_volume_dir(self, namespace: str, claim: str) -> tuple[Path, bool]:
        """The directory of the volume bound to a claim, as the kubelet would mount it (or wait), and
        whether it is a `local` PersistentVolume (the kubelet applies `fsGroup` to those, not to
        `hostPath` ones)."""
        obj = self.api.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        if obj is None:
            raise S.ContainerConfigError(f'persistentvolumeclaim "{claim}" not found')
        volume_name = (obj.get("spec") or {}).get("volumeName")
        phase = (obj.get("status") or {}).get("phase") or "Pending"
        if phase != "Bound" or not volume_name:
            raise S.ContainerConfigError(f'persistentvolumeclaim "{claim}" is not bound yet (phase {phase})')
        volume = self.api.get(f"/api/v1/persistentvolumes/{volume_name}")
        if volume is None:
            raise S.ContainerConfigError(f'persistentvolume "{volume_name}" of claim "{claim}" not found')
        path = provisioner.local_path(volume)
        if not provisioner.is_under(path, self.volumes_root):
            check_mountable(volume_name, volume)  # the kubelet's own checks first, in its words
            raise S.ContainerConfigError(
                f'persistentvolume "{volume_name}" of claim "{claim}" is not a directory of the local '
                f"provisioner (under {self.volumes_root}); the local pod runner mounts only those"
            )
        directory = Path(str(path))
        directory.mkdir(parents=True, exist_ok=True)
        return directory, bool((volume.get("spec") or {}).get("local"))


def check_mountable(name: str, volume: Mapping[str, Any]) -> None:
    """The kubelet's checks of a `local` or `hostPath` PersistentVolume's path, in its words: a
    `local` path must exist (the local plugin's NewMounter), a `hostPath` of `type: Directory` must
    be a directory (its SetUp). Either failing is a `FailedMount`: the pod stays `ContainerCreating`
    and the mount is retried. Applied to paths outside the local provisioner's directory (which it
    makes; the pod runner makes a missing one again)."""
    spec = volume.get("spec") or {}
    local, host = spec.get("local") or {}, spec.get("hostPath") or {}
    if local.get("path") and not os.path.exists(str(local["path"])):
        raise S.VolumeMountError(
            f'MountVolume.NewMounter initialization failed for volume "{name}" : '
            f'path "{local["path"]}" does not exist'
        )
    if host.get("path") and host.get("type") == "Directory" and not os.path.isdir(str(host["path"])):
        raise S.VolumeMountError(
            f'MountVolume.SetUp failed for volume "{name}" : '
            f"hostPath type check failed: {host['path']} is not a directory"
        )


def volume_dir(volume: S.Volume, pod: Mapping[str, Any], pod_dir: Path, lookups: VolumeLookups) -> Path:
    """The directory that backs `volume`: a claim's bound volume, or one written under `pod_dir`."""
    namespace = str((pod.get("metadata") or {}).get("namespace"))
    if volume.kind == "persistentVolumeClaim":
        directory, local = lookups.claim_volume_dir(namespace, volume.claim)
        if local:
            apply_fs_group(directory, pod, read_only=bool(volume.source.get("readOnly")))
        return directory
    path = pod_dir / "volumes" / volume.name
    if volume.kind == "emptyDir":
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)  # as the kubelet makes it: any container user may write
        apply_fs_group(path, pod)
        return path
    files = volume_files(volume, pod, lookups)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    mode = int(volume.source.get("defaultMode", 0o644))
    for rel, (data, item_mode) in files.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(item_mode if item_mode is not None else mode)
    return path


def volume_files(volume: S.Volume, pod: Mapping[str, Any], lookups: VolumeLookups) -> Files:
    """Files of a secret, configMap, downwardAPI or projected volume; missing objects retry."""
    sources: list[tuple[str, Mapping[str, Any]]]
    if volume.kind == "projected":
        sources = [(k, v) for src in volume.source.get("sources") or [] for k, v in src.items()]
    else:
        sources = [(volume.kind, volume.source)]
    files: Files = {}
    for kind, src in sources:
        files.update(source_files(volume.name, kind, src, pod, lookups))
    for rel in files:
        if S.normalise_mount_path("/" + rel) is None or rel.startswith("/"):
            raise S.ContainerConfigError(f'volume "{volume.name}": bad item path {rel!r}')
    return files


def source_files(
    volume: str, kind: str, src: Mapping[str, Any], pod: Mapping[str, Any], lookups: VolumeLookups
) -> Files:
    """The files of one source (a whole volume, or one projection of a projected volume)."""
    namespace = str((pod.get("metadata") or {}).get("namespace"))
    if kind == "serviceAccountToken":
        token = lookups.service_account_token(pod, src)
        return {str(src.get("path", "token")): (token.encode(), None)}
    if kind == "downwardAPI":
        return {
            str(item["path"]): (
                S.field_value(pod, str(item["fieldRef"]["fieldPath"])).encode(),
                item.get("mode"),
            )
            for item in src.get("items") or []
            if item.get("fieldRef")
        }
    if kind not in ("secret", "configMap"):
        raise S.ContainerConfigError(f'volume "{volume}": unsupported projection {kind}')
    name = str(src.get("secretName") or src.get("name") or "")
    data: Mapping[str, bytes] | None
    if kind == "secret":
        data = lookups.secret(namespace, name)
    else:
        raw = lookups.config_map(namespace, name)
        data = None if raw is None else {k: v.encode() for k, v in raw.items()}
    if data is None:
        if src.get("optional"):
            return {}
        raise S.VolumeMountError(  # the kubelet's FailedMount, in its words; retried until it exists
            f'MountVolume.SetUp failed for volume "{volume}" : {kind.lower()} "{name}" not found'
        )
    items = src.get("items")
    if not items:
        return {k: (v, None) for k, v in data.items()}
    out: Files = {}
    for item in items:
        key = str(item.get("key"))
        if key not in data:
            if src.get("optional"):
                continue
            raise S.ContainerConfigError(f'volume "{volume}": key {key!r} not found in {kind} "{name}"')
        out[str(item.get("path") or key)] = (data[key], item.get("mode"))
    return out


def _check_within(path: Path, volume: Path, volume_name: str, container: str) -> None:
    """The kubelet's subPath safety (PrepareSafeSubpath): a subPath whose path, symlinks evaluated,
    leaves its volume is not mounted; the container waits (`CreateContainerConfigError`, retried
    on every sync) until it is fixed."""
    real, root = os.path.realpath(path), os.path.realpath(volume)
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        raise S.ContainerConfigError(
            f'failed to prepare subPath for volumeMount "{volume_name}" of container "{container}"'
        )


def binds(
    container: Mapping[str, Any],
    volumes: Mapping[str, S.Volume],
    dirs: Mapping[str, Path],
    env: Mapping[str, str] | None = None,
) -> list[Bind]:
    """A container's `volumeMounts` as bind mounts (a subPath made, as a directory, if missing, as the
    kubelet does; one that is a file, e.g. a key of a configMap volume, is bound as that file; one
    that leaves its volume through a symlink is refused, `_check_within`). A `subPathExpr` is
    `$(VAR)`-expanded with the container's environment `env` first, then is a subPath (one that
    expands to nothing mounts the whole volume, as the kubelet does)."""
    out = []
    for mount in container.get("volumeMounts") or []:
        volume_name = str(mount["name"])
        root = source = dirs[volume_name]
        sub = str(mount.get("subPath") or "")
        expr = str(mount.get("subPathExpr") or "")
        if expr:
            if sub:
                raise S.StartError(
                    f"volumeMount {volume_name!r}: subPath and subPathExpr are mutually exclusive"
                )
            sub = S.expand(expr, env or {})
            what = f"subPathExpr {expr!r} (expanded: {sub!r})"
        else:
            what = f"subPath {sub!r}"
        if sub:
            if S.normalise_mount_path("/" + sub) is None or sub.startswith("/"):
                raise S.StartError(f"{what} must be a relative path without '..'")
            source = source / sub
            _check_within(source, root, volume_name, str(container.get("name")))
            if not source.exists():  # a file of a configMap or secret volume is bound as it is
                source.mkdir(parents=True, exist_ok=True)
                _check_within(source, root, volume_name, str(container.get("name")))
        volume = volumes[volume_name]
        read_only = (
            bool(mount.get("readOnly"))
            or bool(volume.source.get("readOnly"))
            or volume.kind in READ_ONLY_KINDS
        )
        out.append(Bind(str(source), str(mount["mountPath"]), read_only))
    return out
