"""Containers outlive the pod runner, as containers outlive a kubelet restart.

Every container runs under a tiny shell shim (`shim_argv`) in its own session: the shim waits for
the sandbox and writes its exit code to `<pod>/containers/<name>/<restart>.exit`, whether or not the
runner that started it is still alive. When a container starts, the runner writes a launch record
(`<pod>/containers/<name>/launch.json`: the shim's pid and start time, the restart count, the log).
A runner started later reads these records and re-adopts what still runs (`AdoptedContainer`), and
reports what ended meanwhile with the exit code and termination message it left; a container
whose shim is gone without an exit file is reported as lost (exit 137, ContainerStatusUnknown).

A pod with its own network namespace records its helper process in `<pod>/network.json` the same
way, so a new runner keeps it. `agentrun dev down` (and the test fixtures) stop whatever is left
with `stop_leftovers`, because stopping the runner itself leaves its containers running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrun_devcluster.podrunner import network, pidns
from agentrun_devcluster.podrunner.procfs import children, process_start

LAUNCH_RECORD = "launch.json"
_SHIM = '"$@"; code=$?; echo "$code" > "$0.tmp" && mv "$0.tmp" "$0"; exit "$code"'
_SHIM_GROUP = (
    'setsid "$@" & pid=$!; wait "$pid"; code=$?; kill -KILL -"$pid" 2>/dev/null; '
    'echo "$code" > "$0.tmp" && mv "$0.tmp" "$0"; exit "$code"'
)
"""The shim of a container in a pod's shared PID namespace (pidns.py): the sandbox is a process group
(and session) of its own, killed when its command has ended, as a runtime kills a container's
leftover processes (without a PID namespace of its own, the kernel no longer does it); the other
containers' processes are untouched."""
_POLL_SECONDS = 0.5


def shim_argv(argv: list[str], exit_file: Path, group: bool = False) -> list[str]:
    """`argv` under `/bin/sh`, which records the exit code in `exit_file` when it ends; `group`: in
    a process group of its own, killed when `argv` has ended (`_SHIM_GROUP`)."""
    return ["/bin/sh", "-c", _SHIM_GROUP if group else _SHIM, str(exit_file), *argv]


def exit_file(pod_dir: Path, name: str, restart: int) -> Path:
    return pod_dir / "containers" / name / f"{restart}.exit"


@dataclass(frozen=True)
class LaunchRecord:
    """What the runner wrote when it started one container (see the module docstring)."""

    name: str
    restart: int
    pid: int
    pid_start: str
    started_at: str
    container_id: str
    log: str
    exit_file: str

    def alive(self) -> bool:
        """The shim (`pid`) still runs: the container has not ended."""
        return process_start(self.pid) == self.pid_start

    def exit_code(self) -> int | None:
        """The exit code the shim recorded, None when it recorded none."""
        try:
            return int(Path(self.exit_file).read_text().strip())
        except (OSError, ValueError):
            return None


def write_launch(pod_dir: Path, record: LaunchRecord) -> None:
    path = pod_dir / "containers" / record.name / LAUNCH_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record)))
    tmp.replace(path)


def read_launches(pod_dir: Path) -> dict[str, LaunchRecord]:
    """The latest launch of each container of a pod (empty when none ran here)."""
    found: dict[str, LaunchRecord] = {}
    for path in sorted(pod_dir.glob(f"containers/*/{LAUNCH_RECORD}")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            record = _launch_record(json.loads(path.read_text()))
            found[record.name] = record
    return found


def _launch_record(doc: dict[str, Any]) -> LaunchRecord:
    """A record as written; `runtime` (always `process`) was written until the docker runtime went."""
    doc.pop("runtime", None)
    return LaunchRecord(**doc)


def any_alive(pod_dir: Path) -> bool:
    """True when a container an earlier runner started for this pod still runs."""
    return bool(running_shims(pod_dir)) or any(record.alive() for record in read_launches(pod_dir).values())


def running_shims(pod_dir: Path) -> dict[Path, int]:
    """The shims running for this pod's containers, found by the exit file their argv names:
    {exit file: shim pid}."""
    return _shims_under(pod_dir / "containers")


def _shims_under(root: Path) -> dict[Path, int]:
    """{exit file: shim pid} for the shims whose exit file is under `root`. A shim forks before it
    execs the command, so its child may briefly show the same command line: the shim is the one
    whose parent is not a match."""
    prefix = (str(root) + "/").encode()
    heads = ([b"/bin/sh", b"-c", _SHIM.encode()], [b"/bin/sh", b"-c", _SHIM_GROUP.encode()])
    matches: dict[int, tuple[Path, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        ours = argv[:3] in heads and len(argv) > 3 and argv[3].startswith(prefix)
        if ours and stat[0] != "Z":
            matches[int(entry.name)] = (Path(argv[3].decode(errors="replace")), int(stat[1]))
    return {path: pid for pid, (path, parent) in matches.items() if parent not in matches}


def sigterm_or_kill(command_pid: int | None, kill: Callable[[], None]) -> None:
    """SIGTERM to a sandbox's command, as a kubelet stops a container; `kill` (the whole sandbox)
    when the command cannot be found."""
    if command_pid is None:
        kill()
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(command_pid, signal.SIGTERM)


Launches = dict[str, LaunchRecord]
"""Launch records by container name."""
PodObject = Mapping[str, Any]
"""A pod as the API server returns it."""


def unrecorded_launches(
    pod_dir: Path, uid: str, names: Iterable[str], recorded: Mapping[str, LaunchRecord], now: str
) -> dict[str, LaunchRecord]:
    """Containers an earlier runner started but did not record: it was
    killed between starting one and writing its launch record. Found by the shim still running
    or the exit file it left, for a restart later than the recorded one; started again they would
    run twice. `now` stands for their unknown start time."""
    shims = running_shims(pod_dir)
    found: dict[str, LaunchRecord] = {}
    for name in names:
        prior = recorded.get(name)
        floor = prior.restart + 1 if prior is not None else 0
        directory = pod_dir / "containers" / name
        exits = {p: 0 for p in directory.glob("*.exit")}
        candidates = {**exits, **{p: pid for p, pid in shims.items() if p.parent == directory}}
        restarts = {
            int(p.stem): pid for p, pid in candidates.items() if p.stem.isdigit() and int(p.stem) >= floor
        }
        if not restarts:
            continue
        restart = max(restarts)
        pid = restarts[restart]
        found[name] = LaunchRecord(
            name=name,
            restart=restart,
            pid=pid,
            pid_start=(process_start(pid) or "") if pid else "",
            started_at=now,
            container_id=f"agentrun://{uid[:8]}-{name}-{restart}",
            log=str(pod_dir / "logs" / name / f"{restart}.log"),
            exit_file=str(exit_file(pod_dir, name, restart)),
        )
    return found


def launch_record(
    pod_dir: Path,
    name: str,
    restart: int,
    pid: int,
    started_at: str,
    container_id: str,
    log: Path,
) -> LaunchRecord | None:
    """The record of a container just started; None for a process that already ended (its shim
    is gone, so it cannot be adopted)."""
    start = process_start(pid)
    if start is None:
        return None
    return LaunchRecord(
        name=name,
        restart=restart,
        pid=pid,
        pid_start=start,
        started_at=started_at,
        container_id=container_id,
        log=str(log),
        exit_file=str(exit_file(pod_dir, name, restart)),
    )


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _sandbox_pids(shim: int) -> tuple[int | None, int | None]:
    """(the sandbox's init, the container's command) under a shim: sh → bwrap → init → command, or
    sh → bwrap → command when the command is PID 1 (`--as-pid-1`: bwrap's init, a fork of bwrap,
    has bwrap's command line; the command has its own)."""
    for bwrap in children(shim):
        for init in children(bwrap):
            if _cmdline(init) != _cmdline(bwrap):
                return init, init
            commands = children(init)
            return init, commands[0] if commands else None
    return None, None


def kill_sandbox_group(shim: int) -> None:
    """SIGKILL the sandbox of a shim that runs it in a process group of its own (`_SHIM_GROUP`: a
    container in a pod's shared PID namespace), with everything that group holds."""
    for sandbox in children(shim):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(sandbox) == sandbox:
                os.killpg(sandbox, signal.SIGKILL)


def _kill_tree(record: LaunchRecord) -> None:
    if not record.alive():
        return
    init, _command = _sandbox_pids(record.pid)
    kill_sandbox_group(record.pid)
    if init is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(init, signal.SIGKILL)  # PID 1 of the namespace: everything in it dies
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(record.pid, signal.SIGKILL)  # the shim is its session's leader


class AdoptedContainer:
    """A container started by an earlier runner process; its end is noticed by polling its shim."""

    def __init__(self, record: LaunchRecord, on_exit: Callable[[AdoptedContainer], None]) -> None:
        self.record = record
        self.log_path = Path(record.log)
        self.container_id = record.container_id
        self.exit_code: int | None = None
        self.lost = False
        self._on_exit = on_exit
        if record.alive():
            threading.Thread(target=self._poll, daemon=True, name=f"adopted-{record.pid}").start()
        else:
            self._ended()

    @property
    def pid(self) -> int:
        return self.record.pid

    @property
    def done(self) -> bool:
        return self.exit_code is not None

    def start_failure(self) -> str | None:
        """An adopted container did run (a start failure was reported by the runner that saw it)."""
        return None

    def _poll(self) -> None:
        while self.record.alive():
            time.sleep(_POLL_SECONDS)
        self._ended()
        self._on_exit(self)

    def _ended(self) -> None:
        code = self.record.exit_code()
        self.lost = code is None
        self.exit_code = 137 if code is None else code

    def terminate(self) -> None:
        """SIGTERM to the container's command (the whole sandbox when it cannot be found)."""
        if not self.done:
            sigterm_or_kill(_sandbox_pids(self.record.pid)[1], self.kill)

    def kill(self) -> None:
        if not self.done:
            _kill_tree(self.record)


# -- leftovers ---------------------------------------------------------------------------------
def stop_leftovers(state_dir: Path) -> int:
    """Kill every container and network helper still running from the runner state `state_dir`
    (the runner is already stopped); the number of containers stopped."""
    stopped = 0
    pods = state_dir / "pods"
    if not pods.is_dir():
        return 0
    for path in pods.glob(f"*/*/*/containers/*/{LAUNCH_RECORD}"):
        with contextlib.suppress(OSError, ValueError, TypeError):
            record = _launch_record(json.loads(path.read_text()))
            if record.alive():
                _kill_tree(record)
                stopped += 1
    for pid in _shims_under(pods).values():  # started but never recorded (the runner died)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # the shim is its session's leader
            stopped += 1
    for path in pods.glob(f"*/*/*/{network.RECORD}"):
        network.stop_recorded(path.parent)
    for path in pods.glob(f"*/*/*/{pidns.RECORD}"):
        pidns.stop_recorded(path.parent)
    return stopped
