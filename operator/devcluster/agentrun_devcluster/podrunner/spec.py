"""Pure rules of the pod runner: order, environment, `$(VAR)` expansion, volumes, messages.

Nothing here starts a process or talks to the API server; lookups of Secrets and ConfigMaps are
passed in as functions, so every rule is unit-tested with literals (tests/unit/devcluster/podrunner/).
The rules follow the kubelet's where the local runner can honour them, and say so where it cannot.
"""

from __future__ import annotations

import base64
import posixpath
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

DEFAULT_TERMINATION_PATH: Final = "/dev/termination-log"
MAX_TERMINATION_MESSAGE: Final = 4096
"""Bytes of a termination message file the kubelet reads (MaxContainerTerminationMessageLength)."""
FALLBACK_LOG_LINES: Final = 80
FALLBACK_LOG_BYTES: Final = 2048
"""`FallbackToLogsOnError`: the last 80 lines of the log, at most 2048 bytes (as the kubelet)."""
DEFAULT_GRACE_SECONDS: Final = 30
HOST_IP: Final = "127.0.0.1"
SYSTEM_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SUPPORTED_VOLUMES: Final = (
    "persistentVolumeClaim",
    "emptyDir",
    "secret",
    "configMap",
    "projected",
    "downwardAPI",
)

_CLAIM_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_ENV_NAME: Final = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_FIELD_INDEXED: Final = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


class ContainerConfigError(Exception):
    """The container cannot be created yet (a kubelet's `CreateContainerConfigError`, retried)."""

    reason = "CreateContainerConfigError"


class VolumeMountError(ContainerConfigError):
    """A volume the node cannot mount (the kubelet's `FailedMount` Event; the pod stays
    `ContainerCreating` and the mount is retried)."""

    event_reason = "FailedMount"


class StartError(Exception):
    """The container cannot start (a runtime's `StartError`: exit code 128 and this message)."""

    reason = "StartError"
    exit_code = 128


class PodProblem(Exception):
    """The pod cannot run on this runner at all: it fails with `reason` and the message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# ----------------------------------------------------------------------------------- order


@dataclass(frozen=True)
class Step:
    """One container of the pod in the kubelet's start order."""

    name: str
    kind: Literal["init", "sidecar", "main"]
    spec: Mapping[str, Any]


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """A native sidecar: an init container with `restartPolicy: Always`."""
    return container.get("restartPolicy") == "Always"


def start_order(pod_spec: Mapping[str, Any]) -> list[Step]:
    """Init containers in declared order (sidecars are started, regular ones run to completion),
    then every main container (started together)."""
    steps = [
        Step(str(c["name"]), "sidecar" if is_sidecar(c) else "init", c)
        for c in pod_spec.get("initContainers") or []
    ]
    steps += [Step(str(c["name"]), "main", c) for c in pod_spec.get("containers") or []]
    return steps


def sidecar_stop_order(pod_spec: Mapping[str, Any]) -> list[str]:
    """Sidecars get SIGTERM after the main containers, in reverse of their start order."""
    return [s.name for s in reversed(start_order(pod_spec)) if s.kind == "sidecar"]


def should_restart(restart_policy: str, kind: str, exit_code: int) -> bool:
    """Whether a container that exited is started again (sidecars always are, while the pod lives)."""
    if kind == "sidecar":
        return True
    if kind == "init":
        return restart_policy != "Never" and exit_code != 0
    if restart_policy == "Always":
        return True
    return restart_policy == "OnFailure" and exit_code != 0


def restart_backoff(restart_count: int, base: float = 10.0, cap: float = 300.0) -> float:
    """The kubelet's crash-loop back-off: 10 s doubling per restart, at most 5 minutes."""
    return float(min(cap, base * (2 ** max(0, restart_count - 1))))


# ----------------------------------------------------------------------------------- env


def expand(text: str, mapping: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined names are replaced, others left as written; `$$` is `$`."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    n = len(text)
    while cursor < n:
        if text[cursor] == "$" and cursor + 1 < n:
            out.append(text[checkpoint:cursor])
            nxt = text[cursor + 1]
            advance = 1
            if nxt == "$":
                out.append("$")
            elif nxt == "(":
                close = text.find(")", cursor + 2)
                if close == -1:
                    out.append("$(")
                else:
                    name = text[cursor + 2 : close]
                    out.append(mapping.get(name, f"$({name})"))
                    advance = close - cursor
            else:
                out.append("$" + nxt)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


SecretLookup = Callable[[str, str], Mapping[str, bytes] | None]
ConfigMapLookup = Callable[[str, str], Mapping[str, str] | None]


@dataclass(frozen=True)
class Lookups:
    """How the runner reads Secrets and ConfigMaps (None when the object does not exist)."""

    secret: SecretLookup = lambda _ns, _name: None
    config_map: ConfigMapLookup = lambda _ns, _name: None


def secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """A Secret's `data` (base64) and `stringData` as bytes."""
    out = {str(k): base64.b64decode(str(v)) for k, v in (secret.get("data") or {}).items()}
    out.update({str(k): str(v).encode() for k, v in (secret.get("stringData") or {}).items()})
    return out


def field_value(pod: Mapping[str, Any], path: str, pod_ip: str = HOST_IP) -> str:
    """`fieldRef.fieldPath` for the fields the downward API offers; unknown paths are a config error.
    `pod_ip`: the pod's own address (addresses.py; the host's for a pod on `hostNetwork`)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.hostIP": HOST_IP,
        "status.hostIPs": HOST_IP,
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
    }
    if path in simple:
        return str(simple[path] or "")
    indexed = _FIELD_INDEXED.match(path)
    if indexed:
        return str((meta.get(indexed.group(1)) or {}).get(indexed.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise ContainerConfigError(f"unsupported fieldPath {path!r} in the local pod runner")


def _resource_value(container: Mapping[str, Any], resource: str) -> str:
    resources = container.get("resources") or {}
    kind, _, name = resource.partition(".")
    value = (resources.get(kind) or {}).get(name)
    if value is None and kind == "requests":
        value = (resources.get("limits") or {}).get(name)
    return str(value) if value is not None else "0"


def _key_ref(
    ref: Mapping[str, Any], namespace: str, lookup: Callable[[str, str], Mapping[str, Any] | None], kind: str
) -> str | None:
    name = str(ref.get("name", ""))
    key = str(ref.get("key", ""))
    optional = bool(ref.get("optional"))
    data = lookup(namespace, name)
    if data is None:
        if optional:
            return None
        raise ContainerConfigError(f'{kind} "{name}" not found')
    if key not in data:
        if optional:
            return None
        raise ContainerConfigError(f"couldn't find key {key} in {kind} {namespace}/{name}")
    value = data[key]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def default_env(pod: Mapping[str, Any], path: str, api_server: str | None = None) -> dict[str, str]:
    """What a runtime and the kubelet add: PATH (here with the venv's bin first), HOME, HOSTNAME, and
    the `kubernetes` Service's variables in-cluster clients read (`KUBERNETES_SERVICE_HOST/PORT`).

    Pods share the host's network, where no kube-proxy routes the Service's cluster IP, so the
    variables point at the API server's own loopback address and port (its certificate names both).
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    hostname = spec.get("hostname") or meta.get("name") or "pod"
    env = {"PATH": path, "HOME": "/tmp", "HOSTNAME": str(hostname)[:63]}
    endpoint = urllib.parse.urlsplit(api_server) if api_server else None
    if endpoint is not None and endpoint.hostname and endpoint.port:
        host, port = endpoint.hostname, str(endpoint.port)
        env.update(
            {
                "KUBERNETES_SERVICE_HOST": host,
                "KUBERNETES_SERVICE_PORT": port,
                "KUBERNETES_SERVICE_PORT_HTTPS": port,
                "KUBERNETES_PORT": f"tcp://{host}:{port}",
                f"KUBERNETES_PORT_{port}_TCP": f"tcp://{host}:{port}",
                f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp",
                f"KUBERNETES_PORT_{port}_TCP_PORT": port,
                f"KUBERNETES_PORT_{port}_TCP_ADDR": host,
            }
        )
    return env


@dataclass(frozen=True)
class ImageConfig:
    """The part of an image's config a runtime uses when a container gives no `command`/`args`."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()


# Images are not pulled, so their configs are not read: the runner knows these by repository name
# (registry, tag and digest ignored). The operator's image: ENTRYPOINT ["agentrun"], CMD ["operator"]
# (see the Dockerfile), so the chart's operator container, which gives only `args`, runs.
KNOWN_IMAGES: dict[str, ImageConfig] = {
    "agentrun-operator": ImageConfig(entrypoint=("agentrun",), cmd=("operator",)),
}


def image_repository_name(image: str) -> str:
    """`ghcr.io/proompteng/agentrun-operator:0.1.0@sha256:…` → `agentrun-operator`."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def known_image(image: str) -> ImageConfig | None:
    return KNOWN_IMAGES.get(image_repository_name(image)) if image else None


def resolve_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    lookups: Lookups,
    base: Mapping[str, str],
    pod_ip: str = HOST_IP,
) -> dict[str, str]:
    """The container's environment: `base`, then `envFrom`, then `env` in order with `$(VAR)` expansion
    over the variables defined before each one (as the kubelet does); `status.podIP` is `pod_ip`."""
    namespace = str((pod.get("metadata") or {}).get("namespace", "default"))
    env: dict[str, str] = dict(base)
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix") or "")
        data: Mapping[str, Any] | None = None
        if "configMapRef" in source:
            ref = source["configMapRef"]
            data = lookups.config_map(namespace, str(ref.get("name", "")))
            if data is None and not ref.get("optional"):
                raise ContainerConfigError(f'configmap "{ref.get("name")}" not found')
        elif "secretRef" in source:
            ref = source["secretRef"]
            data = lookups.secret(namespace, str(ref.get("name", "")))
            if data is None and not ref.get("optional"):
                raise ContainerConfigError(f'secret "{ref.get("name")}" not found')
        for key, raw in (data or {}).items():
            name = prefix + str(key)
            if _ENV_NAME.match(name):
                env[name] = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    defined: dict[str, str] = {}
    for var in container.get("env") or []:
        name = str(var.get("name", ""))
        value: str | None
        if "valueFrom" in var and var["valueFrom"] is not None:
            source = var["valueFrom"]
            if "fieldRef" in source:
                value = field_value(pod, str(source["fieldRef"].get("fieldPath", "")), pod_ip)
            elif "resourceFieldRef" in source:
                value = _resource_value(container, str(source["resourceFieldRef"].get("resource", "")))
            elif "secretKeyRef" in source:
                value = _key_ref(source["secretKeyRef"], namespace, lookups.secret, "secret")
            elif "configMapKeyRef" in source:
                value = _key_ref(source["configMapKeyRef"], namespace, lookups.config_map, "configmap")
            else:
                raise ContainerConfigError(f"env {name}: unsupported valueFrom {sorted(source)}")
            if value is None:
                continue
        else:
            value = expand(str(var.get("value") or ""), {**env, **defined})
        defined[name] = value
        env[name] = value
    return env


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """`command` + `args`, each `$(VAR)`-expanded, as the kubelet combines them with the image's config:
    no `command` takes the image's ENTRYPOINT (and its CMD too when `args` is absent). Images are not
    pulled, so only the images of `KNOWN_IMAGES` can leave `command` out."""
    command = list(container.get("command") or [])
    args = container.get("args")
    if not command:
        image = str(container.get("image") or "")
        config = known_image(image)
        if config is None:
            raise StartError(
                f"container {container.get('name')!r} has no command: the local pod runner does not pull "
                f"images, so it cannot use the entrypoint of {image!r}; give `command`"
            )
        command = list(config.entrypoint)
        if args is None:
            args = list(config.cmd)
    return [expand(str(a), env) for a in [*command, *(args or [])]]


def find_executable(argv0: str, path: str, exists: Callable[[str], bool]) -> str | None:
    """Where `argv0` is found on `path` (as execvp would look); `exists` says if a file is executable."""
    if "/" in argv0:
        return argv0 if exists(argv0) else None
    for directory in path.split(":"):
        candidate = posixpath.join(directory or ".", argv0)
        if exists(candidate):
            return candidate
    return None


# ----------------------------------------------------------------------------------- volumes


@dataclass(frozen=True)
class Volume:
    """A pod volume the runner can provide. `source` is the volume's spec (e.g. its `secret` dict)."""

    name: str
    kind: str  # one of SUPPORTED_VOLUMES
    source: Mapping[str, Any] = field(default_factory=dict)

    @property
    def claim(self) -> str:
        return str(self.source.get("claimName", ""))


def claim_name_problem(claim: str) -> str | None:
    """Why a PVC claim name cannot be a directory name (None when it can)."""
    if not claim:
        return "persistentVolumeClaim.claimName is empty"
    if len(claim) > 253 or not _CLAIM_NAME.match(claim) or ".." in claim:
        return (
            f"claimName {claim!r} is not a valid PersistentVolumeClaim name (lowercase letters, digits, "
            "'-' and '.', at most 253 characters, no '..'); the local pod runner keeps each claim in a "
            "directory of that name and refuses anything else"
        )
    return None


def plan_volumes(pod_spec: Mapping[str, Any]) -> dict[str, Volume]:
    """The pod's volumes by name; a type the runner cannot provide or a bad claim is a PodProblem."""
    volumes: dict[str, Volume] = {}
    for raw in pod_spec.get("volumes") or []:
        name = str(raw.get("name", ""))
        kinds = [k for k in raw if k != "name"]
        kind = next((k for k in kinds if k in SUPPORTED_VOLUMES), None)
        if kind is None:
            raise PodProblem(
                "UnsupportedVolume",
                f"volume {name!r} is of type {', '.join(kinds) or '(none)'}, which the local pod runner "
                f"cannot provide (it supports {', '.join(SUPPORTED_VOLUMES)})",
            )
        volume = Volume(name, kind, raw.get(kind) or {})
        if kind == "persistentVolumeClaim":
            problem = claim_name_problem(volume.claim)
            if problem:
                raise PodProblem("InvalidClaimName", f"volume {name!r}: {problem}")
        volumes[name] = volume
    return volumes


def normalise_mount_path(path: str) -> str | None:
    """The mount path, normalised; None when it is not absolute or climbs with `..`."""
    if not path.startswith("/") or ".." in path.split("/"):
        return None
    norm = posixpath.normpath(path)
    return "/" + norm.lstrip("/")


def under(path: str, root: str) -> bool:
    """True when `path` is `root` or lies inside it (component-wise)."""
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def mount_target_problem(target: str) -> str | None:
    """Why `target` can never be a mount point in the sandbox, or None."""
    norm = normalise_mount_path(target)
    if norm is None:
        return f"{target!r} must be an absolute path without '..'"
    if norm == "/":
        return "cannot mount over /"
    if norm.split("/")[1] in ("proc", "sys"):
        return f"{norm} is under /proc or /sys"
    return None


def resolve_on_host(
    target: str, exists: Callable[[str], bool], realpath: Callable[[str], str]
) -> tuple[str, str | None]:
    """Where a mount point outside every volume goes: (canonical path, directory to re-create).

    The sandbox shows the host's tree read-only, so a mount point that does not exist must be
    created in a writable copy of its deepest existing ancestor: that directory is re-created as a
    tmpfs holding its host entries (read-only again once the mounts are made). Host symlinks on the
    way are followed (`/var/run` → `/run`), as they would be inside the sandbox. Returns no
    directory when the target exists (mounted over) or only its top level is new (the sandbox's `/`
    is a tmpfs already).
    """
    parts = [p for p in target.split("/") if p]
    for i in range(len(parts), 0, -1):
        prefix = "/" + "/".join(parts[:i])
        if exists(prefix):
            real = realpath(prefix)
            rest = parts[i:]
            canonical = real.rstrip("/") + "".join("/" + p for p in rest)
            if not rest or real == "/":
                return canonical or "/", None
            return canonical, real
    return "/" + "/".join(parts), None


# ----------------------------------------------------------------------------------- messages


def log_tail(data: bytes, lines: int = FALLBACK_LOG_LINES, limit: int = FALLBACK_LOG_BYTES) -> str:
    """The last `lines` lines of a log, at most `limit` bytes (FallbackToLogsOnError)."""
    parts = data.splitlines(keepends=True)[-lines:]
    tail = b"".join(parts)[-limit:]
    return tail.decode("utf-8", "replace")


def termination_message(
    file_data: bytes | None,
    policy: str,
    exit_code: int,
    log_data: Callable[[], bytes],
) -> str | None:
    """The termination message: the last 4096 bytes of the file (the kubelet reads it from the end),
    or with `FallbackToLogsOnError` and a failed container with an empty file, the tail of its log."""
    text = (file_data or b"")[-MAX_TERMINATION_MESSAGE:].decode("utf-8", "replace")
    if not text and policy == "FallbackToLogsOnError" and exit_code != 0:
        text = log_tail(log_data())
    return text or None


def exit_reason(exit_code: int, oom: bool = False) -> str:
    """The `reason` of a terminated state, as a runtime reports it."""
    if oom:
        return "OOMKilled"
    return "Completed" if exit_code == 0 else "Error"


def post_start_command(container: Mapping[str, Any]) -> list[str] | None:
    """The container's `lifecycle.postStart.exec.command`, which the kubelet runs in the container
    right after starting it and completes before it counts the container started (a sidecar's next
    container waits for it; a failing hook kills the container, which restarts by its policy).
    None without one (an `httpGet` or `sleep` hook is not imitated: it is ignored)."""
    hook = ((container.get("lifecycle") or {}).get("postStart") or {}).get("exec") or {}
    command = hook.get("command")
    return [str(c) for c in command] if isinstance(command, list) and command else None


def hook_container(container: Mapping[str, Any], command: list[str]) -> dict[str, Any]:
    """The container as its exec hook runs: the same image, env and mounts, the hook's command (which
    the kubelet does not `$(VAR)`-expand: each `$` doubled, so `container_argv`'s expansion gives it
    back as written, `$$` too -- the iteration pod's hook writes its PID with `$$`)."""
    hook = {k: v for k, v in container.items() if k not in ("lifecycle", "restartPolicy", "args")}
    hook["command"] = [c.replace("$", "$$") for c in command]
    return hook


def shares_process_namespace(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's containers share one PID namespace under a pause process, so that no
    container's command is PID 1 (docs/local-dev.md#pod-runner-signals)."""
    return bool((pod.get("spec") or {}).get("shareProcessNamespace"))


def uses_host_network(pod: Mapping[str, Any]) -> bool:
    """`hostNetwork: true`: the pod's IP is the host's, as a kubelet reports it."""
    return bool((pod.get("spec") or {}).get("hostNetwork"))


def grace_seconds(pod: Mapping[str, Any]) -> float:
    """The deletion grace period: the one the deletion set, else the pod's, else 30 s."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    for value in (meta.get("deletionGracePeriodSeconds"), spec.get("terminationGracePeriodSeconds")):
        if value is not None:
            return float(max(0, int(value)))
    return float(DEFAULT_GRACE_SECONDS)
