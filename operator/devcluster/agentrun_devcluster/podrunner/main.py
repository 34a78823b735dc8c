"""`agentrun dev pod-runner`: run the local pod runner in the foreground (`agentrun dev up` detaches it)."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from types import FrameType

from agentrun_devcluster.podrunner.config import DEFAULT_NODE, RunnerConfig
from agentrun_devcluster.podrunner.runner import PodRunner
from agentrun_devcluster.podrunner.sandbox import SandboxUnavailable

READY_LINE = "pod runner ready"


def run_pod_runner(
    kubeconfig: Path,
    state_dir: Path,
    node: str = DEFAULT_NODE,
    namespaces: tuple[str, ...] = (),
    restart_backoff: float = 10.0,
) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        runner = PodRunner(
            RunnerConfig(
                kubeconfig=kubeconfig,
                state_dir=state_dir,
                node_name=node,
                namespaces=namespaces,
                restart_backoff=restart_backoff,
            )
        )
    except SandboxUnavailable as exc:
        print(f"agentrun dev pod-runner: {exc}", file=sys.stderr)
        return 2

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("agentrun.podrunner").info("got %s; stopping", signal.Signals(signum).name)
        runner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    runner.run(ready=lambda: print(READY_LINE, file=sys.stderr, flush=True))
    return 0
