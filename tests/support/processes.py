"""Run the operator as its own process (`agentrun operator`) against the local control plane."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentrun_operator.devcluster.controlplane import ControlPlane


class OperatorProcess:
    def __init__(
        self,
        plane: ControlPlane,
        log_dir: Path,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.args = args
        self.plane = plane
        self.log_dir = log_dir
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.starts}.log"

    def start(self) -> OperatorProcess:
        self.starts += 1
        env = dict(os.environ)
        env.update(
            {
                "AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED": "true",
                "AGENTS_CONTROLLER_RESYNC_SECONDS": "5",
                "AGENTS_AGENT_RUNNER_IMAGE": "busybox:1.36",
            }
        )
        env.update(self.env)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    *self._profile_args(),
                    "-m",
                    "agentrun_operator.cli",
                    "operator",
                    f"--kubeconfig={self.plane.kubeconfig}",
                    *self.args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if "operator started" in self.log_path.read_text(errors="replace"):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"operator exited {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}"
                )
            time.sleep(0.1)
        raise RuntimeError(f"operator did not start:\n{self.log_path.read_text()[-3000:]}")

    def _profile_args(self) -> list[str]:
        """`AGENTRUN_OPERATOR_PROFILE=FILE` runs the operator under cProfile (for benchmarks)."""
        target = os.environ.get("AGENTRUN_OPERATOR_PROFILE")
        return ["-m", "cProfile", "-o", f"{target}.{self.starts}"] if target else []

    def kill(self) -> None:
        """SIGKILL: the operator gets no chance to clean up (restart-safety tests)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(
            (self.log_dir / f"operator-{i}.log").read_text(errors="replace")
            for i in range(1, self.starts + 1)
        )
