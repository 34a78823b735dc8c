"""`agentrun dev up | status | env | down` as a user runs them (separate processes, own state dir)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentrun_operator.devcluster import processes
from agentrun_operator.devcluster.controlplane import COMPONENTS, ControlPlane
from agentrun_operator.devcluster.toolchain import bin_dir


def agentrun(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, AGENTRUN_DEV_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "agentrun_operator.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_dev_up_is_idempotent_and_down_leaves_nothing(tmp_path: Path) -> None:
    home = tmp_path / "dev"
    try:
        first = agentrun(home, "dev", "up")
        assert first.returncode == 0, first.stderr
        assert "control plane ready" in first.stderr
        plane = ControlPlane(home, bin_dir())
        pids = {c.name: c.pid for c in plane.component_status()}

        second = agentrun(home, "dev", "up")
        assert second.returncode == 0, second.stderr
        assert "already running" in second.stderr
        assert {c.name: c.pid for c in plane.component_status()} == pids  # nothing restarted

        status = agentrun(home, "dev", "status")
        assert status.returncode == 0, status.stdout
        for name in COMPONENTS:
            line = next(ln for ln in status.stdout.splitlines() if ln.startswith(name))
            assert str(pids[name]) in line and "healthy" in line

        env = agentrun(home, "dev", "env")
        assert f"export KUBECONFIG={home / 'kubeconfig'}" in env.stdout
        assert f"export PATH={bin_dir()}:" in env.stdout
        shell = subprocess.run(
            [
                "bash",
                "-c",
                f'eval "$({sys.executable} -m agentrun_operator.cli dev env)" && kubectl get crd -o name',
            ],
            env=dict(os.environ, AGENTRUN_DEV_HOME=str(home)),
            capture_output=True,
            text=True,
            check=False,
        )
        assert (
            "customresourcedefinition.apiextensions.k8s.io/agentruns.agents.proompteng.ai" in shell.stdout
        ), shell.stderr
        ports = plane.ports()
    finally:
        down = agentrun(home, "dev", "down")
    assert down.returncode == 0, down.stderr
    for pid in pids.values():
        assert pid is not None
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    for port in (ports.etcd_client, ports.etcd_peer, ports.apiserver, ports.controller_manager):
        assert not processes.port_open(port)
    stopped = agentrun(home, "dev", "status")
    assert stopped.returncode == 1 and "stopped" in stopped.stdout
