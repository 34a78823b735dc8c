"""The real node for tests: its own control plane and a kubelet on containerd (docs/development.md#tiers).

One per test session at most, and only on the worker that runs the real-node tier: the node is a
host-wide thing (a bridge, a blackhole route, the kubelet's fixed host paths), and its kube-scheduler
would bind any unscheduled pod of a shared control plane, so it never joins another tier's plane.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from agentrun_devcluster.controlplane import ControlPlane


class NodeHost:
    """What the e2e fixtures need of whatever runs pods, for the real node: where the claims'
    volumes are (the provisioner's `<state>/pv/`), its log, a container's log (`kubectl logs`)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.state_dir: Path = plane.home

    def logs(self) -> str:
        log = self.plane.log_dir / "kubelet.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        done = subprocess.run(
            [
                str(self.plane.bin_dir / "kubectl"),
                f"--kubeconfig={self.plane.kubeconfig}",
                "logs",
                "-n",
                namespace,
                pod,
                f"--container={container}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout

    def stop(self, grace: float = 30) -> None:
        """Nothing per namespace: the node lives for the session (its fixture stops it)."""
