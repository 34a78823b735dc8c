"""The seam between a pod's worker and what runs its containers.

The worker (worker.py) decides *when* a container starts and stops and what its volumes, environment
and termination-message file are; a `ContainerRuntime` decides *how* it runs, keeps what a later
runner process needs to adopt it, and adopts it. The one runtime is the process runtime
(process.py: the host's tools in a bubblewrap sandbox; images are not pulled or used); real
containers run on the real node (docs/local-dev.md#real-node). The worker knows runtimes only
through this interface, so a fake one can stand in for it in a test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.adopt import Launches, LaunchRecord, PodObject
from agentrun_devcluster.podrunner.sandbox import Bind


class RuntimeUnavailable(RuntimeError):
    """The chosen runtime cannot run here (no bwrap, no real node); the message says why."""


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
    started_at: str | None = None
    """When the container started: it is recorded for a later runner to adopt. None: a postStart
    hook, which is not: a runner that dies before a hook runs never runs it, as a restarted kubelet
    (the iteration pod's reporter sees it and opens `main`'s gate itself, docs/design.md#hook-lost);
    a hook already running goes on under its shim."""
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
    lost: bool
    """It ended while no runner watched and left no exit code (reported `ContainerStatusUnknown`)."""

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

    def start_network(self, pod_dir: Path, api_host: str, api_port: int) -> PodSandbox:
        """The pod's own network namespace with the API server forwarded into it (an earlier runner's
        when it still holds one), recorded for a later runner (OSError if it cannot be made)."""

    def start_pid_namespace(self, pod: Mapping[str, Any], pod_dir: Path) -> PodSandbox | None:
        """The shared PID namespace of a pod with `shareProcessNamespace`, held by a pause-like PID 1
        (an earlier runner's when it still holds one); None where it cannot be (OSError if it fails)."""

    def close(self) -> None:
        """The runner stops; its containers keep running, for a later runner to adopt."""

    def earlier_launches(self, pod: PodObject, pod_dir: Path, names: Iterable[str], now: str) -> Launches:
        """The containers of `names` an earlier runner process started for this pod: those it
        recorded, and those it started but was killed before recording (`now` stands for their start
        time); a new runner adopts them (see adopt.py)."""

    def any_alive(self, pod_dir: Path) -> bool:
        """True when a container an earlier runner process started for this pod still runs."""

    def adopt(self, record: LaunchRecord, on_exit: OnExit) -> RunningContainer:
        """The container an earlier runner process started and recorded, taken over: still running,
        or ended with the exit code it left (or `lost`)."""

    def start(self, launch: Launch, on_exit: OnExit) -> RunningContainer:
        """Start the container (recorded when `launch.started_at` is set); `S.StartError` when it
        cannot start, `S.ContainerConfigError` when it must wait and be retried."""
