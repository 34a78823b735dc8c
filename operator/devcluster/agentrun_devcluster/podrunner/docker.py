"""The docker runtime: each container of a pod as a real container from a local image.

`docker create`, then `docker start --attach` (so its output goes to the container's log file for
`agentrun dev logs`), with the pod's volumes bind-mounted (the same host directories the process
runtime uses), the termination-message file bind-mounted at its path and read back by the runner
when it ends, the securityContext's user, groups and read-only root filesystem, and for a pod with
`shareProcessNamespace` `--pid container:<pause>`: one PID namespace for the pod's containers and
hooks, whose PID 1 is a pause container's (it reaps, as the pod's pause process does), so a SIGTERM
reaches the command; without it the command is PID 1 and ignores SIGTERM unless it handles it, as
in a real container: docs/local-dev.md#pod-runner-signals. Images are never
pulled: a missing one leaves the container waiting with `ErrImageNeverPull`, retried until it is
there.

Networking follows the process runtime (docs/local-dev.md#network): a pod shares the host's network
(`--network host`; the engine we start has no bridge network anyway), except a pod that serves
ports, which gets its own network namespace: a pause container (`busybox:1.36`, `--network none`)
holds it, the pod's containers join it (`--network container:<pause>`), and the API server is
forwarded into it at the address `KUBERNETES_SERVICE_HOST/PORT` name (network.py), so the operator
installed by Helm, two replicas of it included, works unchanged.

Containers carry labels with the node, namespace, pod and uid. They outlive the runner, as
containers outlive a kubelet restart: the runner writes a launch record for each (adopt.py), and a
runner started later re-adopts the ones still running (`DockerAdoptedContainer`: it waits on the
engine and rewrites the log from the engine's copy) and reports the ones that ended meanwhile with
the exit code the engine kept; a container the engine no longer has is reported lost. A pod's pause
container is reused the same way. `agentrun dev down` removes what is left (`adopt.stop_leftovers`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from agentrun_devcluster import dockerengine as engine
from agentrun_devcluster import toolchain
from agentrun_devcluster.baseimages import BUSYBOX
from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.adopt import Launches, LaunchRecord, PodObject, process_start
from agentrun_devcluster.podrunner.network import PodNetwork
from agentrun_devcluster.podrunner.runtime import (
    ImageNeverPulled,
    Launch,
    OnExit,
    RuntimeUnavailable,
)
from agentrun_devcluster.podrunner.sandbox import Bind

LABEL_NODE: Final = "ai.proompteng.agentrun.node"
LABEL_POD: Final = "ai.proompteng.agentrun.pod"
LABEL_UID: Final = "ai.proompteng.agentrun.pod-uid"
IMAGE_ENV: Final = ("PATH", "HOME")
"""Variables the image (or Docker) provides; the process runtime's defaults for them are dropped."""
CLIENT_ENV: Final = (
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
)
_NAME_UNSAFE: Final = re.compile(r"[^a-zA-Z0-9_.-]")
PAUSE_IMAGE: Final = BUSYBOX
"""What holds a pod's own network namespace: any local image with `sleep` would do."""


def container_name(launch: Launch) -> str:
    """A unique, readable Docker name: namespace, pod, container, uid prefix and restart count."""
    raw = f"agentrun_{launch.namespace}_{launch.pod_name}_{launch.name}_{launch.uid[:8]}_{launch.restart}"
    return _NAME_UNSAFE.sub("-", raw)[:250]


def pause_name(pod: Mapping[str, Any], holds: str = "POD") -> str:
    """The pause container holding a pod's network namespace (`POD`) or its PID namespace (`PIDNS`)."""
    meta = pod.get("metadata") or {}
    raw = f"agentrun_{meta.get('namespace')}_{meta.get('name')}_{holds}_{str(meta.get('uid', ''))[:8]}"
    return _NAME_UNSAFE.sub("-", raw)[:250]


class DockerPidNamespace:
    """A pod's shared PID namespace: a pause container whose PID 1 is the node's pause binary (it
    reaps what it inherits), joined by the pod's containers and hooks (`--pid container:<pause>`)."""

    def __init__(self, pause: str) -> None:
        self.pause = pause

    @property
    def mode(self) -> str:
        return f"container:{self.pause}"

    def stop(self) -> None:
        engine.docker("rm", "--force", self.pause, timeout=60)


def pod_labels(node: str, pod: Mapping[str, Any]) -> list[str]:
    meta = pod.get("metadata") or {}
    argv: list[str] = []
    for label, value in (
        (LABEL_NODE, node),
        (LABEL_POD, f"{meta.get('namespace')}/{meta.get('name')}"),
        (LABEL_UID, str(meta.get("uid", ""))),
    ):
        argv += ["--label", f"{label}={value}"]
    return argv


class DockerPodNetwork:
    """A pod's own network namespace: the pause container holding it and the API forwarder in it."""

    def __init__(self, pause: str, forwarder: PodNetwork | None = None) -> None:
        self.pause = pause
        self.forwarder = forwarder

    @property
    def mode(self) -> str:
        return f"container:{self.pause}"

    def stop(self) -> None:
        if self.forwarder is not None:
            self.forwarder.stop()
        engine.docker("rm", "--force", self.pause, timeout=60)


def _security(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, Any]:
    """The effective securityContext: the container's fields over the pod's."""
    pod_ctx = (pod.get("spec") or {}).get("securityContext") or {}
    ctx = dict(pod_ctx)
    ctx.update({k: v for k, v in (container.get("securityContext") or {}).items() if v is not None})
    return ctx


def user_flag(ctx: Mapping[str, Any]) -> str | None:
    """`--user` for runAsUser/runAsGroup (None: the image's USER, as the kubelet does)."""
    user, group = ctx.get("runAsUser"), ctx.get("runAsGroup")
    if user is None and group is None:
        return None
    if user is None:
        raise S.ContainerConfigError("runAsGroup without runAsUser is not supported by the local pod runner")
    return f"{int(user)}" if group is None else f"{int(user)}:{int(group)}"


def non_root_problem(ctx: Mapping[str, Any], image_user: str) -> str | None:
    """The kubelet's runAsNonRoot check: the user must be numeric and not 0."""
    if not ctx.get("runAsNonRoot"):
        return None
    user = ctx.get("runAsUser")
    if user is not None:
        return "container's runAsUser breaks non-root policy" if int(user) == 0 else None
    name = image_user.split(":")[0]
    if name in ("", "root", "0"):
        return "container has runAsNonRoot and image will run as root"
    if not name.isdigit():
        return (
            f"container has runAsNonRoot and image has non-numeric user ({name}), "
            "cannot verify user is non-root"
        )
    return None


def create_argv(
    docker: str,
    launch: Launch,
    name: str,
    node: str,
    ctx: Mapping[str, Any],
) -> list[str]:
    """The `docker create` command line (pure). Env values are passed by name (`-e NAME`) from the
    client's environment, so secrets never show on a command line."""
    container = launch.container
    argv = [docker, "create", "--name", name]
    if isinstance(launch.pid_namespace, DockerPidNamespace):
        argv += ["--pid", launch.pid_namespace.mode]
    elif S.shares_process_namespace(launch.pod):
        argv += ["--init"]
    if isinstance(launch.network, DockerPodNetwork):  # the hostname is the pause container's
        argv += ["--network", launch.network.mode]
    else:
        argv += ["--network", "host", "--hostname", launch.hostname]
    argv += pod_labels(node, launch.pod)
    user = user_flag(ctx)
    if user is not None:
        argv += ["--user", user]
    for group in [ctx.get("fsGroup"), *(ctx.get("supplementalGroups") or [])]:
        if group is not None:
            argv += ["--group-add", str(int(group))]
    if ctx.get("readOnlyRootFilesystem"):
        argv += ["--read-only"]
    if ctx.get("privileged"):
        argv += ["--privileged"]
    for bind in [*launch.binds, Bind(str(launch.termination_file), launch.termination_target)]:
        problem = S.mount_target_problem(bind.target)
        if problem:
            raise S.StartError(f"bad mount path {bind.target!r}: {problem}")
        mount = f"type=bind,source={bind.source},target={S.normalise_mount_path(bind.target)}"
        argv += ["--mount", mount + (",readonly" if bind.read_only else "")]
    for key in launch.env:
        argv += ["--env", key]
    if container.get("workingDir"):
        argv += ["--workdir", str(container["workingDir"])]
    command = [S.expand(str(a), launch.env) for a in container.get("command") or []]
    args = [S.expand(str(a), launch.env) for a in container.get("args") or []]
    if command:
        argv += ["--entrypoint", command[0], str(container.get("image", "")), *command[1:], *args]
    else:  # the image's entrypoint, with `args` in place of its CMD when given
        argv += [str(container.get("image", "")), *args]
    return argv


class _DockerControls:
    """What a started and an adopted container share: the exit code read back from the engine, and
    SIGTERM through it (`kill` differs: a started one may still be only a `docker start` client)."""

    name: str
    _exit_code: int | None
    _failure: str | None

    @property
    def done(self) -> bool:
        return self._exit_code is not None

    @property
    def exit_code(self) -> int | None:
        return self._exit_code

    def start_failure(self) -> str | None:
        return self._failure

    def terminate(self) -> None:
        if not self.done:
            engine.docker("kill", "--signal", "SIGTERM", self.name, timeout=30)


class DockerContainer(_DockerControls):
    """One container: created (so it exists once this returns), started attached, its exit read back
    with `docker inspect`. A create that fails is a `StartError` (the runner reports exit 128)."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], name: str, log_path: Path, on_exit: OnExit
    ) -> None:
        created = subprocess.run(list(argv), capture_output=True, text=True, env=dict(env), check=False)
        if created.returncode != 0:
            lines = [ln for ln in created.stderr.splitlines() if ln.strip()] or ["docker create failed"]
            raise S.StartError(lines[0])
        self.name = name
        self.log_path = log_path
        self.container_id = f"docker://{name}"
        self._exit_code: int | None = None
        self._failure: str | None = None
        self._on_exit = on_exit
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [argv[0], "start", "--attach", name],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in env.items() if k in CLIENT_ENV},
            )
        threading.Thread(target=self._wait, daemon=True, name=f"docker-wait-{name}").start()

    def _wait(self) -> None:
        client_code = self.proc.wait()
        state = container_state(self.name) or {}
        engine.docker("rm", "--force", self.name, timeout=60)
        if state.get("Error"):
            self._failure = str(state["Error"])
        elif not state:  # the container vanished before it could be inspected
            self._failure = _last_log_line(self.log_path) or f"docker start exited {client_code}"
        self._exit_code = exit_code(state, client_code if client_code >= 0 else 128 - client_code)
        self._on_exit(self)

    def kill(self) -> None:
        if self.done:
            return
        if engine.docker("kill", self.name, timeout=30).returncode != 0 and self.proc.poll() is None:
            self.proc.kill()  # not created yet: stop the client (its waiter removes what is left)


_NO_SUCH: Final = ("no such object", "no such container")
_RUNNING: Final = ("running", "paused", "restarting")


def container_name_of(container_id: str) -> str:
    return container_id.removeprefix("docker://")


def container_state(container_id: str) -> dict[str, Any] | None:
    """The engine's `.State` of a container (`docker://NAME` or NAME); None when the engine has no
    such container. OSError when the engine does not answer (nothing is known then)."""
    proc = engine.docker(
        "inspect", "--format", "{{json .State}}", container_name_of(container_id), timeout=30
    )
    if proc.returncode != 0:
        if any(text in proc.stderr.lower() for text in _NO_SUCH):
            return None
        raise OSError(f"docker inspect: {proc.stderr.strip() or proc.returncode}")
    state: dict[str, Any] = json.loads(proc.stdout or "{}")
    return state


def container_running(container_id: str) -> bool:
    """True when the engine still runs the container (True too when the engine does not answer:
    nothing is known, so nothing is taken for ended)."""
    try:
        state = container_state(container_id)
    except OSError:
        return True
    return state is not None and str(state.get("Status")) in _RUNNING


def remove_container(container_id: str) -> None:
    engine.docker("rm", "--force", container_name_of(container_id), timeout=60)


def remove_recorded(records: Sequence[tuple[Path, LaunchRecord]]) -> int:
    """Remove the containers these launch records name (each with its pod directory,
    `pods/<namespace>/<pod>/<uid>`) and their pods' pause containers, in one `docker rm`; the
    number that still ran. Nothing when no engine answers (nothing of ours can run then)."""
    try:
        listing = engine.docker("ps", "--all", "--format", "{{.Names}}\t{{.State}}", timeout=60)
    except engine.EngineUnavailable:
        return 0
    present = dict(line.split("\t", 1) for line in listing.stdout.splitlines() if "\t" in line)
    names = {container_name_of(record.container_id) for _, record in records}
    for pod_dir, _ in records:
        meta = {"namespace": pod_dir.parent.parent.name, "name": pod_dir.parent.name, "uid": pod_dir.name}
        names.update((pause_name({"metadata": meta}), pause_name({"metadata": meta}, "PIDNS")))
    doomed = sorted(names & present.keys())
    if doomed:
        engine.docker("rm", "--force", *doomed, timeout=120)
    return sum(present.get(container_name_of(r.container_id)) in _RUNNING for _, r in records)


def exit_code(state: Mapping[str, Any], fallback: int) -> int:
    """The exit code of an ended container as the kubelet reports it (an OOM kill is 137)."""
    code = int(state.get("ExitCode", fallback))
    return 137 if state.get("OOMKilled") and code == 0 else code


class DockerAdoptedContainer(_DockerControls):
    """A container an earlier runner process started (see the module docstring). Running: its log
    is rewritten from the engine's copy and followed, and its end is waited for on the engine;
    ended: reported at once with the exit code the engine kept; gone from the engine: `lost`."""

    def __init__(self, record: LaunchRecord, on_exit: OnExit) -> None:
        self.record = record
        self.name = container_name_of(record.container_id)
        self.container_id = record.container_id
        self.log_path = Path(record.log)
        self.lost = False
        self._exit_code: int | None = None
        self._failure: str | None = None
        self._on_exit = on_exit
        self._stop_old_client()
        state = container_state(self.name)
        if state is None:
            self.lost = True
            self._exit_code = 137
        elif str(state.get("Status")) in _RUNNING or self._started_now(state):
            self._follower = self._follow_log()
            threading.Thread(target=self._wait, daemon=True, name=f"docker-adopted-{self.name}").start()
        elif str(state.get("Status")) in ("exited", "dead"):
            self._copy_log()
            self._ended(state)
        else:  # being removed, or its start failed: nothing to tell
            remove_container(self.name)
            self.lost = True
            self._exit_code = 137

    def _started_now(self, state: Mapping[str, Any]) -> bool:
        """Created, and the runner died before its `docker start` did: start it (the runner had
        decided to), detached this time; its log comes from the engine as for any adopted one."""
        if str(state.get("Status")) != "created":
            return False
        return engine.docker("start", self.name, timeout=120).returncode == 0

    def _stop_old_client(self) -> None:
        """The earlier runner's `docker start --attach` client, if it outlived that runner, would
        write to the same log: stop it (SIGKILL is not proxied, so the container is untouched)."""
        if self.record.pid_start and process_start(self.record.pid) == self.record.pid_start:
            os.kill(self.record.pid, signal.SIGKILL)

    def _copy_log(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            subprocess.run(
                [engine.docker_cli(), "logs", self.name],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=120,
                check=False,
            )

    def _follow_log(self) -> subprocess.Popen[bytes]:
        """The whole log the engine kept (what the dead client wrote and what it missed), then on."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            return subprocess.Popen(
                [engine.docker_cli(), "logs", "--follow", self.name],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def _wait(self) -> None:
        state: dict[str, Any] | None = None
        while True:
            waited = engine.docker("wait", self.name, timeout=3600)
            try:
                state = container_state(self.name)
            except OSError:  # the engine does not answer: ask again
                time.sleep(2.0)
                continue
            if state is None or str(state.get("Status")) not in _RUNNING:
                break
            if waited.returncode not in (0, 124):  # refused while it runs (an engine restarting)
                time.sleep(2.0)
        try:
            self._follower.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._follower.kill()
        if state is None:
            self.lost = True
            self._exit_code = 137
        else:
            self._ended(state)
        self._on_exit(self)

    def _ended(self, state: Mapping[str, Any]) -> None:
        if state.get("Error"):
            self._failure = str(state["Error"])
        remove_container(self.name)
        self._exit_code = exit_code(state, 137)

    @property
    def pid(self) -> int:
        return self.record.pid

    def kill(self) -> None:
        if not self.done:
            engine.docker("kill", self.name, timeout=30)


def _last_log_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


class DockerRuntime:
    """Containers on a Docker engine from local images (see the module docstring)."""

    name = "docker"

    def __init__(self, node: str) -> None:
        problem = engine.engine_problem()
        if problem is not None:
            raise RuntimeUnavailable(f"the docker runtime needs a Docker engine: {problem}")
        self.node = node
        self.docker = engine.docker_cli()

    def close(self) -> None:
        """Nothing to do: containers outlive the runner and a new runner adopts them (adopt.py);
        `agentrun dev down` removes what is left (`adopt.stop_leftovers`)."""

    def unrecorded_launches(
        self, pod: PodObject, pod_dir: Path, names: Iterable[str], recorded: Launches, now: str
    ) -> Launches:
        """Found by the pod's uid label and the container's name, for a restart later than the
        recorded one (see `container_name`)."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        listing = engine.docker(
            "ps", "--all", "--format", "{{.Names}}\t{{.State}}", "--filter", f"label={LABEL_UID}={uid}"
        )
        rows = [line.split("\t", 1) for line in listing.stdout.splitlines() if "\t" in line]
        present = [n for n, state in rows if state != "created"]  # never started: it is started anew
        found: dict[str, LaunchRecord] = {}
        for name in names:
            prior = recorded.get(name)
            floor = prior.restart + 1 if prior is not None else 0
            prefix = _NAME_UNSAFE.sub(
                "-", f"agentrun_{meta.get('namespace')}_{meta.get('name')}_{name}_{uid[:8]}_"
            )
            restarts = [
                int(n[len(prefix) :]) for n in present if n.startswith(prefix) and n[len(prefix) :].isdigit()
            ]
            restarts = [r for r in restarts if r >= floor]
            if not restarts:
                continue
            restart = max(restarts)
            found[name] = LaunchRecord(
                name=name,
                restart=restart,
                pid=0,
                pid_start="",
                started_at=now,
                container_id=f"docker://{prefix}{restart}",
                log=str(pod_dir / "logs" / name / f"{restart}.log"),
                exit_file=str(pod_dir / "containers" / name / f"{restart}.exit"),
                runtime="docker",
            )
        return found

    def base_env(self, pod: Mapping[str, Any], api_server: str | None) -> dict[str, str]:
        env = S.default_env(pod, "", api_server)
        return {k: v for k, v in env.items() if k not in IMAGE_ENV}

    def start_network(
        self, pod: Mapping[str, Any], api_host: str, api_port: int, log_path: Path
    ) -> DockerPodNetwork:
        if not engine.image_exists(PAUSE_IMAGE):
            raise OSError(
                f"the pause image {PAUSE_IMAGE} is not present locally (make it: agentrun dev base-images)"
            )
        name = pause_name(pod)
        spec = pod.get("spec") or {}
        hostname = str(spec.get("hostname") or (pod.get("metadata") or {}).get("name") or "pod")[:63]
        pid = engine.docker("inspect", "--format", "{{.State.Pid}}", name, timeout=30).stdout.strip()
        if pid.isdigit() and pid != "0":  # an earlier runner's, still holding the pod's namespace
            return self._forward(DockerPodNetwork(name), pid, api_host, api_port, log_path)
        engine.docker("rm", "--force", name, timeout=60)
        started = engine.docker(
            "run", "--detach", "--init", "--name", name, "--network", "none", "--hostname", hostname,
            *pod_labels(self.node, pod), "--entrypoint", "sleep", PAUSE_IMAGE, "2147483647",
            timeout=120,
        )  # fmt: skip
        network = DockerPodNetwork(name)
        pid = engine.docker("inspect", "--format", "{{.State.Pid}}", name, timeout=30).stdout.strip()
        if started.returncode != 0 or not pid.isdigit() or pid == "0":
            network.stop()
            raise OSError(f"the pause container did not start: {started.stderr.strip() or 'no pid'}")
        return self._forward(network, pid, api_host, api_port, log_path)

    def start_pid_namespace(self, pod: Mapping[str, Any], pod_dir: Path) -> DockerPidNamespace:
        """The pod's PID pause container (an earlier runner's when it still runs: its containers run
        in it); its PID 1 is the pause binary built with the node's tools, bind-mounted into busybox."""
        name = pause_name(pod, "PIDNS")
        state = engine.docker("inspect", "--format", "{{.State.Running}}", name, timeout=30).stdout.strip()
        if state == "true":
            return DockerPidNamespace(name)
        pause = toolchain.tool_path("pause")
        if not pause.is_file():
            raise OSError(f"the pause binary is not built ({pause}): run `agentrun dev tools`")
        if not engine.image_exists(PAUSE_IMAGE):
            raise OSError(
                f"the pause image {PAUSE_IMAGE} is not present locally (make it: agentrun dev base-images)"
            )
        engine.docker("rm", "--force", name, timeout=60)
        started = engine.docker(
            "run", "--detach", "--name", name, "--network", "none", *pod_labels(self.node, pod),
            "--mount", f"type=bind,source={pause},target=/pause,readonly", "--entrypoint", "/pause",
            PAUSE_IMAGE,
            timeout=120,
        )  # fmt: skip
        if started.returncode != 0:
            engine.docker("rm", "--force", name, timeout=60)
            raise OSError(f"the pause container did not start: {started.stderr.strip()}")
        return DockerPidNamespace(name)

    def _forward(
        self, network: DockerPodNetwork, pid: str, api_host: str, api_port: int, log_path: Path
    ) -> DockerPodNetwork:
        """The API server forwarded into the pause container's namespace."""
        try:
            network.forwarder = PodNetwork(api_host, api_port, log_path, netns=f"/proc/{pid}/ns/net").start()
        except OSError:
            network.stop()
            raise
        return network

    def _image_user(self, image: str) -> str | None:
        """The image's USER, or None when the image is not present locally."""
        proc = engine.docker("image", "inspect", "--format", "{{.Config.User}}", image, timeout=30)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def start(self, launch: Launch, on_exit: OnExit) -> DockerContainer:
        image = str(launch.container.get("image") or "")
        image_user = self._image_user(image) if image else None
        if image_user is None:
            raise ImageNeverPulled(
                f'container image "{image}" is not present locally; the local pod runner never pulls '
                "(make it with `make image`, `agentrun dev base-images` or `docker load`)"
            )
        ctx = _security(launch.pod, launch.container)
        problem = non_root_problem(ctx, image_user)
        if problem:
            raise S.ContainerConfigError(problem)
        name = container_name(launch)
        engine.docker("rm", "--force", name, timeout=60)  # a leftover of the same name
        argv = create_argv(self.docker, launch, name, self.node, ctx)
        client_env = {k: os.environ[k] for k in CLIENT_ENV if k in os.environ}
        return DockerContainer(argv, {**launch.env, **client_env}, name, launch.log_path, on_exit)
