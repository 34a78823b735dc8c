"""`agentrun dev up | status | run | logs | down` as a user runs them, with its own state directory:
up starts the control plane, the pod runner and the operator (idempotently); down leaves no process
and no mount behind, even with a pod running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from agentrun_devcluster import processes
from agentrun_devcluster.controlplane import ControlPlane
from agentrun_devcluster.dev import SERVICES, component_rows
from agentrun_devcluster.toolchain import bin_dir
from tests.e2e.conftest import EXAMPLES
from tests.support.polling import eventually
from tests.support.processes import processes_with


def agentrun(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentrun_operator.cli", *args],
        env=dict(os.environ, AGENTRUN_DEV_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line mentions `text` (bwrap's argv names the pod's directories)."""
    found = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z":
            shown = cmdline.replace(b"\0", b" ")[:200]
            found.append(f"{entry.name}: {shown!r}")
    return found


def mounts_mentioning(text: str) -> list[str]:
    """Mount entries naming `text`, in any mount namespace still alive."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            lines = (entry / "mountinfo").read_text().splitlines()
        except OSError:
            continue
        found += [f"{entry.name}: {line}" for line in lines if text in line]
    return found


def test_dev_up_runs_examples_and_down_leaves_nothing(tmp_path: Path) -> None:
    home = tmp_path / "dev"
    try:
        first = agentrun(home, "dev", "up")
        assert first.returncode == 0, first.stderr
        plane = ControlPlane(home, bin_dir())
        rows = {r.name: r for r in component_rows(plane)}
        assert set(SERVICES) <= set(rows)
        assert all(r.healthy for r in rows.values()), rows
        pids = {name: r.pid for name, r in rows.items()}

        second = agentrun(home, "dev", "up")
        assert second.returncode == 0, second.stderr
        assert "pod-runner already running" in second.stderr
        assert "operator already running" in second.stderr
        assert {r.name: r.pid for r in component_rows(plane)} == pids  # nothing restarted

        status = agentrun(home, "dev", "status")
        assert status.returncode == 0, status.stdout
        for name, pid in pids.items():
            line = next(ln for ln in status.stdout.splitlines() if ln.startswith(name))
            assert str(pid) in line and "healthy" in line

        ran = agentrun(home, "dev", "run", str(EXAMPLES / "fixed-loop.yaml"), "--timeout", "240")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "Succeeded" in ran.stdout and "LoopMaxIterationsReached" in ran.stdout
        assert "iteration 3 of 3" in ran.stdout
        pod = next(p for p in (home / "pods" / "default").iterdir() if "iter-3" in p.name).name
        logs = agentrun(home, "dev", "logs", pod)
        assert logs.returncode == 0 and "iteration 3 of 3" in logs.stdout, logs.stderr
        reporter = agentrun(home, "dev", "logs", pod, "-c", "reporter")
        assert '"status":"missing"' in reporter.stdout, reporter.stdout + reporter.stderr

        # A pod still running when `down` comes.
        plane.kubectl(
            "run", "sleeper", "--image=busybox", "--restart=Never", "--command", "--", "sleep", "7781"
        )
        eventually(lambda: processes_with("sleep", "7781"), timeout=120, what="the sleeper to run")
        assert processes_mentioning(str(home))
        ports = plane.ports()
    finally:
        down = agentrun(home, "dev", "down")
    assert down.returncode == 0, down.stderr
    time.sleep(0.5)
    assert not processes_with("sleep", "7781")
    assert processes_mentioning(str(home)) == []
    assert mounts_mentioning(str(home)) == []
    for port in (ports.etcd_client, ports.apiserver, ports.controller_manager):
        assert not processes.port_open(port)
    stopped = agentrun(home, "dev", "status")
    assert stopped.returncode == 1
    for name in pids:
        assert name in stopped.stdout
    assert not list((home / "run").glob("*.pid"))
