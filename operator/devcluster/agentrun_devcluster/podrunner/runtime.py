"""The seam between the pod runner and what runs a container: a process sandbox or Docker.

The runner (runner.py) decides *when* a container starts and stops and what its volumes, environment
and termination-message file are; a `ContainerRuntime` decides *how* it runs:

- `process` (process.py): the host's tools in a bubblewrap sandbox; images are not pulled or used.
- `docker` (docker.py): a real container from a local image (never pulled) on a Docker engine.

`make_runtime` picks one from `--runtime process|docker|auto` (auto: docker when an engine answers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.adopt import Launches, PodObject
from agentrun_devcluster.podrunner.sandbox import Bind

RUNTIMES = ("process", "docker", "auto")


class RuntimeUnavailable(RuntimeError):
    """The chosen runtime cannot run here (no bwrap, no Docker engine); the message says why."""


class ImageNeverPulled(S.ContainerConfigError):
    """The container's image is not present locally and the runner never pulls (the kubelet's
    `ErrImageNeverPull`): the container waits and is retried, so importing the image later works."""

    reason = "ErrImageNeverPull"


@dataclass(frozen=True)
class Launch:
    """Everything a runtime needs to start one container of a pod."""

    pod: Mapping[str, Any]
    name: str
    container: Mapping[str, Any]
    env: Mapping[str, str]
    binds: list[Bind]
    """Volume directories on the host → the container's mount paths."""
    termination_file: Path
    """The host file shown at the container's terminationMessagePath (read back when it ends)."""
    pod_dir: Path
    log_path: Path
    restart: int
    network: PodSandbox | None = None
    """The pod's own network namespace (pods serving ports), made by the same runtime; None: the host's."""
    pid_namespace: PodSandbox | None = None
    """The pod's shared PID namespace (`shareProcessNamespace`), made by the same runtime; None: the
    container's own."""

    @property
    def namespace(self) -> str:
        return str((self.pod.get("metadata") or {}).get("namespace", "default"))

    @property
    def pod_name(self) -> str:
        return str((self.pod.get("metadata") or {}).get("name", "pod"))

    @property
    def uid(self) -> str:
        return str((self.pod.get("metadata") or {}).get("uid", ""))

    @property
    def termination_target(self) -> str:
        return str(self.container.get("terminationMessagePath") or S.DEFAULT_TERMINATION_PATH)

    @property
    def hostname(self) -> str:
        return str(self.env.get("HOSTNAME") or self.pod_name)[:63]


class PodSandbox(Protocol):
    """What holds a pod's own network namespace (see network.py), or its shared PID namespace
    (pidns.py, a pause container), until the pod ends."""

    def stop(self) -> None: ...


class RunningContainer(Protocol):
    """A started container; the runtime calls `on_exit(container)` from a helper thread when it ends."""

    log_path: Path
    container_id: str

    @property
    def done(self) -> bool: ...

    @property
    def exit_code(self) -> int | None: ...

    def start_failure(self) -> str | None:
        """Why the container never ran (a runtime `StartError`, exit 128), or None when it ran."""

    def terminate(self) -> None:
        """SIGTERM to the container's command."""

    def kill(self) -> None:
        """SIGKILL everything of the container."""


OnExit = Callable[[Any], None]


class ContainerRuntime(Protocol):
    """How the containers of pods run (see the module docstring)."""

    name: str

    def base_env(self, pod: Mapping[str, Any], api_server: str | None) -> dict[str, str]:
        """The variables a runtime adds before the container's own `env` (HOSTNAME, PATH,
        KUBERNETES_SERVICE_HOST/PORT for `api_server`...)."""

    def start_network(
        self, pod: Mapping[str, Any], api_host: str, api_port: int, log_path: Path
    ) -> PodSandbox:
        """The pod's own network namespace with the API server forwarded into it (OSError if not)."""

    def start_pid_namespace(self, pod: Mapping[str, Any], pod_dir: Path) -> PodSandbox | None:
        """The shared PID namespace of a pod with `shareProcessNamespace`, held by a pause-like PID 1
        (an earlier runner's when it still holds one); None where it cannot be (OSError if it fails)."""

    def close(self) -> None:
        """The runner stops: remove what is left of its containers (their pods are reported lost)."""

    def unrecorded_launches(
        self, pod: PodObject, pod_dir: Path, names: Iterable[str], recorded: Launches, now: str
    ) -> Launches:
        """Containers an earlier runner started but did not record (it was killed in between),
        as launch records a new runner adopts (see adopt.py); `now` stands for their start time."""

    def start(self, launch: Launch, on_exit: OnExit) -> RunningContainer:
        """Start the container; `S.StartError` when it cannot start, `S.ContainerConfigError`
        (e.g. `ImageNeverPulled`) when it must wait and be retried."""


def make_runtime(choice: str, node: str, container_path: str) -> ContainerRuntime:
    """The runtime for `--runtime`: RuntimeUnavailable (one line) when it cannot run here."""
    from agentrun_devcluster.dockerengine import engine_problem

    if choice not in RUNTIMES:
        raise RuntimeUnavailable(f"--runtime must be one of {', '.join(RUNTIMES)}, not {choice!r}")
    if choice == "auto":
        choice = "docker" if engine_problem() is None else "process"
    if choice == "docker":
        from agentrun_devcluster.podrunner.docker import DockerRuntime

        return DockerRuntime(node)
    from agentrun_devcluster.podrunner.process import ProcessRuntime

    return ProcessRuntime(container_path)
