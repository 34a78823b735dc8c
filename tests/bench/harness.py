"""The operator under measurement: the released operator as its own process, its metrics on a free
port, loops allowed as many iterations as the benchmark runs (at least the default 20)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from agentrun_devcluster import processes
from agentrun_devcluster.controlplane import ControlPlane
from tests.support.processes import OperatorProcess


def start_operator(
    plane: ControlPlane,
    home: Path,
    iterations: int,
    resync_seconds: int,
    env: dict[str, str] | None = None,
    workers: Iterable[int] = (),
    kubeconfig: Path | None = None,
) -> tuple[OperatorProcess, int, int]:
    """Start it (logs under `home`/operator) and return it, its pid and its metrics port. `env` adds
    to its environment; `workers` sets `--workers`; `kubeconfig`: its credentials (default the
    plane's admin)."""
    port = processes.free_port()
    operator = OperatorProcess(
        plane,
        home / "operator",
        env={
            "AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS": str(max(20, iterations)),
            "AGENTS_CONTROLLER_RESYNC_SECONDS": str(resync_seconds),
            **(env or {}),
        },
        args=(f"--metrics-port={port}", "--log-format=text", *(f"--workers={w}" for w in workers)),
        kubeconfig=kubeconfig,
    ).start()
    assert operator.proc is not None
    return operator, operator.proc.pid, port
