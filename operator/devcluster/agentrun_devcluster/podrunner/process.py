"""The process runtime: one container as a local process, `bwrap` with the container's argv.

`ProcessRuntime` places the mounts (see `spec.resolve_on_host`), checks the command can be found
among the host's tools (images are not used) and starts a `ContainerProcess`.

bwrap reports in a status file the host PID of its PID-namespace init (`child-pid`): the command
itself when it is PID 1 (a pod without `shareProcessNamespace`, `sandbox.bwrap_argv`) or when it
joins the pod's shared PID namespace (pidns.py), else bwrap's init, whose only child the command is.
`terminate()` sends SIGTERM to the command (as a runtime
signals the container's main process; a PID 1 without a handler ignores it, as in a real container);
`kill()` sends SIGKILL to the init, which takes the whole PID namespace with it, and to the bwrap
monitor.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentrun_devcluster.podrunner import adopt, network, pidns
from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.network import PodNetwork
from agentrun_devcluster.podrunner.pidns import PodPidNamespace
from agentrun_devcluster.podrunner.runtime import Launch, OnExit
from agentrun_devcluster.podrunner.sandbox import (
    Bind,
    HostEntry,
    bwrap_argv,
    find_bwrap,
    host_root_entries,
)


def host_tool_paths() -> list[str]:
    """Where this Python's tools live: the venv (its `agentrun`), its site-packages where they really
    are (a venv may link them from elsewhere, e.g. another venv under /tmp), and the package's
    source tree."""
    import agentrun_operator

    package_root = Path(agentrun_operator.__file__).resolve().parent.parent
    site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
    return sorted({sys.prefix, str(site_packages), str(package_root)})


def default_container_path() -> str:
    """PATH inside pods: the running Python's bin (the venv, so `agentrun` works) then the system's."""

    return f"{Path(sys.executable).parent}:{S.SYSTEM_PATH}"


class ContainerProcess:
    """A started container. `on_exit(self)` is called from a helper thread when it has ended."""

    def __init__(
        self,
        argv_for_fd: Callable[[int], Sequence[str]],
        env: Mapping[str, str],
        log_path: Path,
        on_exit: Callable[[ContainerProcess], None],
        command_is_pid_1: bool = False,
        extra_fds: Sequence[int] = (),
        shared_pidns: bool = False,
    ) -> None:
        self.log_path = log_path
        self.command_is_pid_1 = command_is_pid_1 or shared_pidns
        self.shared_pidns = shared_pidns
        self.container_id = ""
        self.lost = False
        self.init_pid: int | None = None
        self.exit_code: int | None = None
        self._pid_known = threading.Event()
        self._on_exit = on_exit
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # bwrap's status goes to a file, not a pipe: a pipe would SIGPIPE the sandbox when it ends
        # after the runner that read the pipe is gone (containers outlive the runner, see adopt.py).
        self.status_path = log_path.with_suffix(".status")
        write_fd = os.open(self.status_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with log_path.open("ab") as log:
                self.proc = subprocess.Popen(
                    list(argv_for_fd(write_fd)),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(env),
                    pass_fds=(write_fd, *extra_fds),
                    close_fds=True,
                    start_new_session=True,  # outlives a restart of the runner (see adopt.py)
                )
        finally:
            os.close(write_fd)
        threading.Thread(target=self._read_status, daemon=True, name=f"bwrap-status-{self.proc.pid}").start()
        threading.Thread(target=self._wait, daemon=True, name=f"bwrap-wait-{self.proc.pid}").start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_status(self) -> None:
        """Poll the status file until bwrap has written its init's pid (or the sandbox ended)."""
        while self.init_pid is None and self.exit_code is None:
            with contextlib.suppress(OSError):
                for line in self.status_path.read_bytes().splitlines():
                    with contextlib.suppress(ValueError):
                        doc = json.loads(line)
                        if isinstance(doc, dict) and "child-pid" in doc:
                            self.init_pid = int(doc["child-pid"])
            if self.init_pid is None:
                time.sleep(0.02)
        self._pid_known.set()

    def _wait(self) -> None:
        code = self.proc.wait()
        self.exit_code = code if code >= 0 else 128 - code  # killed bwrap itself: 128 + signal
        self._pid_known.set()
        self._on_exit(self)

    @property
    def done(self) -> bool:
        return self.exit_code is not None

    def start_failure(self) -> str | None:
        """bwrap's own error (it exits 1 before the command runs) when the sandbox could not be set up."""
        if self.exit_code != 1:
            return None
        try:
            with self.log_path.open("rb") as handle:
                head = handle.read(512)
        except OSError:
            return None
        if not head.startswith(b"bwrap: "):
            return None
        return head.splitlines()[0].decode("utf-8", "replace")

    def command_pid(self) -> int | None:
        """The host PID of the container's command (PID 1 or 2 of its namespace)."""
        self._pid_known.wait(timeout=2)
        if self.init_pid is None or self.command_is_pid_1:
            return self.init_pid
        try:
            children = Path(f"/proc/{self.init_pid}/task/{self.init_pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def terminate(self) -> None:
        """SIGTERM to the command; when it cannot be found, the sandbox is killed outright."""
        if not self.done:
            adopt.sigterm_or_kill(self.command_pid(), self.kill)

    def kill(self) -> None:
        """SIGKILL the namespace's init (everything in the sandbox dies) and the bwrap monitor; in a
        pod's shared PID namespace, the sandbox's process group (the container's processes) instead."""
        if self.done:
            return
        if self.shared_pidns:
            adopt.kill_sandbox_group(self.proc.pid)
        if self.init_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.init_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.proc.kill()


class ProcessRuntime:
    """Containers as sandboxed host processes (the default; see the module docstring)."""

    name = "process"

    def __init__(self, container_path: str | None = None) -> None:
        self.bwrap = find_bwrap()
        self.host_entries = host_root_entries()
        self.container_path = container_path or default_container_path()

    def base_env(self, pod: Mapping[str, Any], api_server: str | None) -> dict[str, str]:
        return S.default_env(pod, self.container_path, api_server)

    def close(self) -> None:
        """Nothing to do: containers outlive the runner and a new runner adopts them (adopt.py);
        `agentrun dev down` stops what is left (`adopt.stop_leftovers`)."""

    def earlier_launches(
        self, pod: adopt.PodObject, pod_dir: Path, names: Iterable[str], now: str
    ) -> adopt.Launches:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        launched = adopt.read_launches(pod_dir)
        launched.update(adopt.unrecorded_launches(pod_dir, uid, names, launched, now))
        return launched

    def any_alive(self, pod_dir: Path) -> bool:
        return adopt.any_alive(pod_dir)

    def adopt(self, record: adopt.LaunchRecord, on_exit: OnExit) -> adopt.AdoptedContainer:
        return adopt.AdoptedContainer(record, on_exit)

    def start_network(self, pod_dir: Path, api_host: str, api_port: int) -> PodNetwork:
        return network.adopt_or_start(pod_dir, api_host, api_port)

    def start_pid_namespace(self, pod: Mapping[str, Any], pod_dir: Path) -> PodPidNamespace | None:
        if pidns.unavailable() is not None:
            return None
        return pidns.adopt_or_start(pod_dir)

    def start(self, launch: Launch, on_exit: OnExit) -> ContainerProcess:
        try:
            proc = self._checked_start(launch, on_exit)
        except S.StartError:
            self._fail_inside(launch)
            raise
        if launch.started_at is not None:  # a later runner can adopt it (adopt.py)
            record = adopt.launch_record(
                launch.pod_dir, launch.name, launch.restart, proc.pid, launch.started_at,
                proc.container_id, proc.log_path,
            )  # fmt: skip
            if record is not None:
                adopt.write_launch(launch.pod_dir, record)
        return proc

    def _fail_inside(self, launch: Launch) -> None:
        """A container that cannot start leaves a process come and gone in the pod's shared PID
        namespace, as on a node: runc creates the container's init process in the pod's namespaces
        and only then finds it cannot set up or exec the command (`exec: "…": no such file or
        directory` is `runc init`'s). The reporter of an iteration pod sees `main` end that way and
        reports, so the pod ends; without this trace it would wait for `main` forever
        (docs/local-dev.md#pod-runner-start-error)."""
        holder = launch.pid_namespace if isinstance(launch.pid_namespace, PodPidNamespace) else None
        if holder is None:
            return
        try:  # an ordinary user's namespace is joined through its user namespace (non-root)
            fds = [os.open(path, os.O_RDONLY) for path in (holder.user_path, holder.path) if path is not None]
        except OSError:  # the namespace is gone: nothing of the pod sees it
            return
        try:
            true = shutil.which("true") or "/bin/true"
            pod_tmp = launch.pod_dir / "tmp"
            pod_tmp.mkdir(parents=True, exist_ok=True)
            argv = bwrap_argv(
                self.bwrap, [true], self.host_entries, str(pod_tmp), [], [], "/",
                pidns_fd=fds[-1], userns_fd=fds[0] if len(fds) > 1 else None,
            )  # fmt: skip
            subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, pass_fds=tuple(fds), check=False
            )
        except OSError:  # bwrap itself cannot run: the container's start failed anyway
            pass
        finally:
            for fd in fds:
                os.close(fd)

    def _checked_start(self, launch: Launch, on_exit: OnExit) -> ContainerProcess:
        container = launch.container
        env = dict(launch.env)
        argv = S.container_argv(container, env)
        pod_tmp = launch.pod_dir / "tmp"
        files = [Bind(str(launch.termination_file), launch.termination_target)]
        binds, files, expand = place_mounts(launch.binds, files, pod_tmp)
        pod_tmp.mkdir(parents=True, exist_ok=True)
        workdir = str(container.get("workingDir") or "/")
        host_workdir = host_path(workdir, binds, pod_tmp)
        if host_workdir != workdir:
            Path(host_workdir).mkdir(parents=True, exist_ok=True)
        elif not os.path.isdir(workdir):
            raise S.StartError(
                f"chdir to cwd ({workdir!r}) set in config.json failed: no such file or directory"
            )

        def runnable(path: str) -> bool:
            host = host_path(path, binds, pod_tmp)
            return os.path.isfile(host) and os.access(host, os.X_OK)

        if S.find_executable(argv[0], env.get("PATH", ""), runnable) is None:
            what = "executable file not found in $PATH" if "/" not in argv[0] else "no such file or directory"
            raise S.StartError(
                f'exec: "{argv[0]}": {what} '
                "(the local pod runner runs the host's tools; images are not pulled)"
            )
        pid_1 = not S.shares_process_namespace(launch.pod)
        holder = launch.pid_namespace if isinstance(launch.pid_namespace, PodPidNamespace) else None
        fds: list[int] = []
        try:
            # The owning user namespace first (a runner that is not root, pidns.py), then the PID one.
            for path in (holder.user_path, holder.path) if holder is not None else ():
                if path is not None:
                    fds.append(os.open(path, os.O_RDONLY))
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            raise S.StartError(f"the pod's PID namespace is gone ({exc})") from None
        try:
            return self._start(launch, on_exit, argv, binds, files, expand, workdir, pid_1, fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _start(
        self,
        launch: Launch,
        on_exit: OnExit,
        argv: list[str],
        binds: list[Bind],
        files: list[Bind],
        expand: list[tuple[str, list[HostEntry]]],
        workdir: str,
        pid_1: bool,
        namespace_fds: list[int],
    ) -> ContainerProcess:
        """`namespace_fds`: the pod's shared PID namespace, after the user namespace that owns it when
        there is one (none: the container keeps a PID namespace of its own)."""
        pidns_fd = namespace_fds[-1] if namespace_fds else None
        userns_fd = namespace_fds[0] if len(namespace_fds) > 1 else None
        pod_tmp = launch.pod_dir / "tmp"
        bwrap = self.bwrap
        entries = self.host_entries
        enter = launch.network.enter_argv() if isinstance(launch.network, PodNetwork) else []
        exit_file = adopt.exit_file(launch.pod_dir, launch.name, launch.restart)
        exit_file.unlink(missing_ok=True)
        proc = ContainerProcess(
            lambda fd: adopt.shim_argv(  # the shim records the exit code, runner or not (adopt.py)
                enter
                + bwrap_argv(
                    bwrap,
                    argv,
                    entries,
                    str(pod_tmp),
                    binds,
                    files,
                    workdir,
                    fd,
                    launch.hostname,
                    expand,
                    tool_paths=host_tool_paths(),
                    command_is_pid_1=pid_1,
                    pidns_fd=pidns_fd,
                    userns_fd=userns_fd,
                ),
                exit_file,
                group=pidns_fd is not None,
            ),
            launch.env,
            launch.log_path,
            on_exit,
            command_is_pid_1=pid_1,
            extra_fds=tuple(namespace_fds),
            shared_pidns=pidns_fd is not None,
        )
        proc.container_id = f"agentrun://{launch.uid[:8]}-{launch.name}-{launch.restart}"
        return proc


def host_path(path: str, binds: list[Bind], pod_tmp: Path) -> str:
    """Where a path inside the sandbox is on the host (volumes and /tmp are mapped)."""
    best: Bind | None = None
    tools = [Bind(p, p, True) for p in host_tool_paths() if p.startswith("/tmp/")]
    for bind in [*binds, Bind(str(pod_tmp), "/tmp"), *tools]:
        root = bind.target.rstrip("/")
        if (path == root or path.startswith(root + "/")) and (best is None or len(root) > len(best.target)):
            best = bind
    if best is None:
        return path
    return best.source + path[len(best.target.rstrip("/")) :]


def place_mounts(
    binds: list[Bind], files: list[Bind], pod_tmp: Path
) -> tuple[list[Bind], list[Bind], list[tuple[str, list[HostEntry]]]]:
    """Check every mount point and say where it goes (see `spec.resolve_on_host`).

    A mount point inside a volume or the pod's tmp is made in that directory beforehand (as a
    runtime creates mount points); one elsewhere follows the host's tree.
    """
    roots = [Bind(str(pod_tmp), "/tmp"), Bind("", "/dev"), *binds]
    expand: dict[str, list[HostEntry]] = {}
    placed: dict[str, str] = {"/tmp": "/tmp", "/dev": "/dev"}

    def place(bind: Bind, is_file: bool, what: str = "mountPath") -> Bind:
        problem = S.mount_target_problem(bind.target)
        if problem:
            raise S.StartError(f"bad {what} {bind.target!r}: {problem}")
        target = S.normalise_mount_path(bind.target) or bind.target
        inside = [r for r in roots if r.target != bind.target and S.under(target, r.target)]
        if inside:
            root = max(inside, key=lambda r: len(r.target))
            rest = target[len(root.target.rstrip("/")) :]
            if root.source:
                host = Path(root.source + rest)
                host.parent.mkdir(parents=True, exist_ok=True)
                if is_file:
                    host.touch(exist_ok=True)
                else:
                    host.mkdir(exist_ok=True)
            base = placed.get(root.target, root.target).rstrip("/")
            placed[bind.target] = base + rest
            return replace(bind, target=base + rest)
        canonical, directory = S.resolve_on_host(target, os.path.lexists, os.path.realpath)
        placed[bind.target] = canonical
        if directory is not None:
            if not os.path.isdir(directory) or directory.split("/")[1] in ("proc", "sys", "dev", "tmp"):
                raise S.StartError(
                    f"bad {what} {bind.target!r}: {directory} is not a directory the local pod "
                    "runner can re-create"
                )
            expand.setdefault(directory, host_root_entries(directory))
        return replace(bind, target=canonical)

    # A volume's mount point is a directory; a subPath that is a file (a key of a configMap or
    # secret volume) is mounted on a file, as the kubelet does.
    ordered = sorted(binds, key=lambda b: b.target.count("/"))
    placed_binds = [place(b, os.path.isfile(b.source)) for b in ordered]
    placed_files = [place(f, True, "terminationMessagePath") for f in files]
    return placed_binds, placed_files, sorted(expand.items())
