"""`agentrun dev up | status | env | down` as a user runs them (separate processes, own state dir)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from agentrun_devcluster import processes
from agentrun_devcluster.controlplane import COMPONENTS, ControlPlane
from agentrun_devcluster.toolchain import bin_dir


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


def _pids(home: Path) -> dict[str, int | None]:
    run_dir = home / "run"
    names = (*COMPONENTS, "pod-runner", "operator")
    return {n: (r.pid if (r := processes.read_record(run_dir, n)) else None) for n in names}


def test_up_restarts_only_what_is_down_on_the_same_ports(tmp_path: Path) -> None:
    home = tmp_path / "dev"
    try:
        first = agentrun(home, "dev", "up")
        assert first.returncode == 0, first.stderr
        plane = ControlPlane(home, bin_dir())
        ports = plane.ports()
        pids = _pids(home)

        # The API server dies: `up` restarts it alone, on its port; everything else keeps running.
        os.kill(pids["kube-apiserver"] or 0, signal.SIGKILL)
        again = agentrun(home, "dev", "up")
        assert again.returncode == 0, again.stderr
        after = _pids(home)
        assert after["kube-apiserver"] != pids["kube-apiserver"]
        assert {k: v for k, v in after.items() if k != "kube-apiserver"} == {
            k: v for k, v in pids.items() if k != "kube-apiserver"
        }
        assert plane.ports() == ports
        assert "etcd already running" in again.stderr

        # `dev restart` of etcd and of the pod runner: new processes, same addresses.
        for component in ("etcd", "pod-runner"):
            restarted = agentrun(home, "dev", "restart", component)
            assert restarted.returncode == 0, restarted.stderr
            assert _pids(home)[component] != after[component]
        assert plane.ports() == ports
        status = agentrun(home, "dev", "status")
        assert status.returncode == 0, status.stdout

        # A port taken by someone else while the rest runs: `up` names it and says what to do.
        kcm = _pids(home)["kube-controller-manager"]
        os.kill(kcm or 0, signal.SIGKILL)
        while processes.port_open(ports.controller_manager):
            time.sleep(0.1)
        with socket.create_server(("127.0.0.1", ports.controller_manager)):
            taken = agentrun(home, "dev", "up")
        assert taken.returncode == 1
        assert f"kube-controller-manager cannot start on its port {ports.controller_manager}" in taken.stderr
        assert "agentrun dev down" in taken.stderr

        # A state directory of another version: refused, nothing touched.
        (home / "state-format").write_text("0\n")
        old = agentrun(home, "dev", "up")
        assert old.returncode == 1 and "state format '0'" in old.stderr, old.stderr
        assert (home / "etcd-data").is_dir()
        (home / "state-format").write_text("2\n")
        back = agentrun(home, "dev", "up")
        assert back.returncode == 0, back.stderr
        assert plane.ports() == ports
    finally:
        down = agentrun(home, "dev", "down")
    assert down.returncode == 0, down.stderr
