"""Processes the tests start: the operator and the local pod runner, each in its own session so it
is stopped as a group (SIGTERM, then SIGKILL), with its output in a log file the tests can read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_devcluster.podrunner.adopt import stop_leftovers
from agentrun_devcluster.podrunner.main import READY_LINE
from tests.support.polling import eventually


class GroupProcess:
    """A child process in its own session, writing to `log_path`; `ready_text` in the log means started."""

    ready_text = ""
    what = "process"

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 30) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        proc = self.proc
        try:
            eventually(
                lambda: (
                    self.ready_text in self.log_path.read_text(errors="replace") or proc.poll() is not None
                ),
                timeout=timeout,
                what=f"the {self.what} to start",
            )
        except AssertionError:
            raise RuntimeError(f"{self.what} did not start:\n{self.log_text()[-3000:]}") from None
        if proc.poll() is not None:
            raise RuntimeError(f"{self.what} exited {proc.returncode}:\n{self.log_text()[-3000:]}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to clean up (restart-safety tests)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, grace: float = 15) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


class OperatorProcess(GroupProcess):
    """`agentrun operator` against the local control plane (loops on); one log file per start."""

    ready_text = "operator started"
    what = "operator"

    def __init__(
        self,
        plane: ControlPlane,
        log_dir: Path,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        kubeconfig: Path | None = None,
    ) -> None:
        super().__init__(log_dir / "operator-0.log")
        self.args = args
        self.kubeconfig = kubeconfig or plane.kubeconfig  # e.g. a proxy's (tests/integration/watch_proxy.py)
        self.plane = plane
        self.log_dir = log_dir
        self.env = env or {}
        self.starts = 0

    def start(self) -> OperatorProcess:
        self.starts += 1
        self.log_path = self.log_dir / f"operator-{self.starts}.log"
        env = dict(os.environ)
        env.update(
            {
                "AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED": "true",
                "AGENTS_CONTROLLER_RESYNC_SECONDS": "5",
                "AGENTS_AGENT_RUNNER_IMAGE": "busybox:1.36",
            }
        )
        env.update(self.env)
        argv = [sys.executable, *self._profile_args(), "-m", "agentrun_operator.cli", "operator"]
        self._spawn([*argv, f"--kubeconfig={self.kubeconfig}", *self.args], env)
        return self

    def _profile_args(self) -> list[str]:
        """`AGENTRUN_OPERATOR_PROFILE=FILE` samples the operator's CPU into FILE.N (benchmarks)."""
        target = os.environ.get("AGENTRUN_OPERATOR_PROFILE")
        return ["-m", "tests.bench.cpu_profile", f"{target}.{self.starts}"] if target else []

    def logs(self) -> str:
        return "\n".join(
            (self.log_dir / f"operator-{i}.log").read_text(errors="replace")
            for i in range(1, self.starts + 1)
        )

    def decision_lines(self, uid: str) -> list[dict[str, Any]]:
        """The JSON decision lines about the run with this uid (docs/operator.md#logs), in order."""
        lines = []
        for raw in self.logs().splitlines():
            if not raw.startswith("{"):
                continue
            try:
                line = json.loads(raw)
            except ValueError:  # the line the operator is writing right now
                continue
            if line.get("correlation_id") == uid and "decision" in line:
                lines.append(line)
        return lines


class RunnerProcess(GroupProcess):
    """`agentrun dev pod-runner` for one node and its namespaces, its state under `state_dir`."""

    ready_text = READY_LINE
    what = "pod runner"

    def __init__(
        self,
        plane: ControlPlane,
        state_dir: Path,
        *,
        node: str,
        namespaces: tuple[str, ...],
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(state_dir / "pod-runner.log")
        self.plane = plane
        self.state_dir = state_dir
        self.node = node
        self.namespaces = namespaces
        self.env = env  # added to the runner's environment (the dev cluster's test switches)

    def start(self) -> RunnerProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "agentrun_operator.cli", "dev", "pod-runner"]
        self._spawn(
            [
                *argv,
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--state-dir={self.state_dir}",
                f"--node={self.node}",
                *(f"--namespace={ns}" for ns in self.namespaces),
            ],
            env=dict(os.environ, **self.env) if self.env else None,
            timeout=60,
        )
        return self

    def stop(self, grace: float = 30) -> None:
        """Stop the runner, then what it leaves running (containers outlive it, as `agentrun dev
        down` knows: adopt.stop_leftovers)."""
        super().stop(grace)
        stop_leftovers(self.state_dir)

    def logs(self) -> str:
        return self.log_text()

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """What a container of a pod this runner ran has printed so far (all restarts, in order)."""
        logs = sorted((self.state_dir / "pods" / namespace / pod).glob(f"*/logs/{container}/*.log"))
        return "".join(path.read_text(errors="replace") for path in logs)


def processes_with(*argv: str) -> list[int]:
    """PIDs whose command line is exactly `argv` (e.g. ("sleep", "7777")), zombies excluded."""
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes() != wanted:
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found
