"""Background processes with pid files, so a later command (or a crashed test) can stop them.

Each component runs in its own session (process group) so stopping it also stops its children. A pid
file records the pid and the executable it must be, so a recycled pid is never killed by mistake.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessRecord:
    """What a pid file says about one started component."""

    name: str
    pid: int
    executable: str
    log: str

    def alive(self) -> bool:
        """True when the pid is running and is still the executable we started."""
        try:
            os.kill(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
        return Path(cmdline).name == Path(self.executable).name


def pid_file(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.pid"


def read_record(run_dir: Path, name: str) -> ProcessRecord | None:
    path = pid_file(run_dir, name)
    try:
        data = json.loads(path.read_text())
        return ProcessRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def start_process(
    run_dir: Path, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a detached component, logging to `log`, and record it in a pid file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
    record = ProcessRecord(name=name, pid=proc.pid, executable=argv[0], log=str(log))
    pid_file(run_dir, name).write_text(json.dumps(record.__dict__))
    return proc


def stop_process(run_dir: Path, name: str, grace: float = 10.0) -> bool:
    """SIGTERM the component's process group, SIGKILL after `grace`; True if something was stopped."""
    record = read_record(run_dir, name)
    path = pid_file(run_dir, name)
    if record is None:
        path.unlink(missing_ok=True)
        return False
    stopped = False
    if record.alive():
        stopped = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and record.alive():
            _reap(record.pid)
            time.sleep(0.05)
        if record.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and record.alive():
                _reap(record.pid)
                time.sleep(0.05)
    # Children of the group that outlived the leader (rare) still share the pgid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(record.pid, signal.SIGKILL)
    _reap(record.pid)
    path.unlink(missing_ok=True)
    return stopped


def _reap(pid: int) -> None:
    """Collect our own exited child so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def free_port() -> int:
    """A loopback port that is free right now (the caller retries if it is taken by then)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


@contextlib.contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file` (created with its directory): one of a kind at a time
    across processes, e.g. a tool build or an engine start that pytest and `make` may race for."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
