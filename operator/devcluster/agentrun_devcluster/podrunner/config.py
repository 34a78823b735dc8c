"""What the pod runner is told (`RunnerConfig`) and where it keeps things (`Layout`).

Its own module so a pod's worker (worker.py) reads them without importing the runner that owns it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agentrun_devcluster.podrunner.process import default_container_path
from agentrun_devcluster.podrunner.retry import Backoff

DEFAULT_NODE = "agentrun-local"
HEALTH_FILE = "pod-runner.health.json"


@dataclass(frozen=True)
class RunnerConfig:
    kubeconfig: Path
    state_dir: Path
    node_name: str = DEFAULT_NODE
    namespaces: tuple[str, ...] = ()
    container_path: str = field(default_factory=default_container_path)
    restart_backoff: float = 10.0
    retry_seconds: float = 2.0
    resync_seconds: float = 30.0
    """How often the runner lists its pods again (a missed event is noticed by then)."""
    api_backoff: Backoff = field(default_factory=Backoff)
    """Retries of binds, status writes and watches while the API server does not answer."""


@dataclass(frozen=True)
class Layout:
    """Where the runner keeps things under its state directory."""

    root: Path

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def health_file(self) -> Path:
        return self.run_dir / HEALTH_FILE

    @property
    def volumes_root(self) -> Path:
        """The local provisioner's volumes live under here (and only these are mounted for claims)."""
        return self.root / "pv"

    def pods_dir(self, namespace: str, name: str) -> Path:
        return self.root / "pods" / namespace / name

    def pod_dir(self, namespace: str, name: str, uid: str) -> Path:
        return self.pods_dir(namespace, name) / uid
