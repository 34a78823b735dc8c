"""One container as a local process: `bwrap` with the container's argv, its log, its exit code.

bwrap reports in a status file the host PID of its PID-namespace init (`child-pid`); the command is
that init's only child. `terminate()` sends SIGTERM to the command (as a runtime signals the
container's main process); `kill()` sends SIGKILL to the init, which takes the whole PID namespace
with it, and to the bwrap monitor.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


class ContainerProcess:
    """A started container. `on_exit(self)` is called from a helper thread when it has ended."""

    def __init__(
        self,
        argv_for_fd: Callable[[int], Sequence[str]],
        env: Mapping[str, str],
        log_path: Path,
        on_exit: Callable[[ContainerProcess], None],
    ) -> None:
        self.log_path = log_path
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
                    pass_fds=(write_fd,),
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

    def command_pid(self) -> int | None:
        """The host PID of the container's command (PID 2 of its namespace)."""
        self._pid_known.wait(timeout=2)
        if self.init_pid is None:
            return None
        try:
            children = Path(f"/proc/{self.init_pid}/task/{self.init_pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def terminate(self) -> None:
        """SIGTERM to the command; when it cannot be found, the sandbox is killed outright."""
        if self.done:
            return
        pid = self.command_pid()
        if pid is None:
            self.kill()
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the namespace's init (everything in the sandbox dies) and the bwrap monitor."""
        if self.done:
            return
        if self.init_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.init_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.proc.kill()
