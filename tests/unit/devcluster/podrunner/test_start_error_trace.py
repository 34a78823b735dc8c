"""A container that cannot start, in a pod with a shared PID namespace, leaves a process come and
gone in that namespace, as runc's init process does on a node (docs/local-dev.md#pod-runner-start-error):
what an iteration pod's reporter takes for `main`'s end. Run for real: the pod's namespace holder
(pidns.py) and the process runtime's bwrap. Root only (joining a PID namespace needs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agentrun_devcluster.podrunner import pidns
from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.process import ProcessRuntime
from agentrun_devcluster.podrunner.runtime import Launch

pytestmark = pytest.mark.skipif(
    pidns.unavailable() is not None or shutil.which("bwrap") is None or shutil.which("nsenter") is None,
    reason="a pod's shared PID namespace needs root, bwrap and util-linux's nsenter",
)


def last_pid_inside(holder: pidns.PodPidNamespace) -> int:
    """The namespace's last PID, read by a process nsenter forks into it (which takes one itself)."""
    out = subprocess.run(
        ["nsenter", "-t", str(holder.namespace_pid), "-p", "--", "cat", "/proc/loadavg"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[4])


def test_a_command_that_cannot_start_leaves_a_pid_in_the_pods_namespace(tmp_path: Path) -> None:
    holder = pidns.start(tmp_path / "pidns.log")
    try:
        pod = {"metadata": {"namespace": "e2e", "name": "typo", "uid": "0123456789abcdef"}}
        pod["spec"] = {"shareProcessNamespace": True}
        term = tmp_path / "termination-log"
        term.write_bytes(b"")
        launch = Launch(
            pod=pod,
            name="main",
            container={"name": "main", "command": ["/bin/no-such-agent"]},
            env={"PATH": "/usr/bin:/bin", "HOSTNAME": "typo"},
            binds=[],
            termination_file=term,
            pod_dir=tmp_path,
            log_path=tmp_path / "logs" / "main" / "0.log",
            restart=0,
            pid_namespace=holder,
        )
        before = last_pid_inside(holder)
        with pytest.raises(S.StartError, match='exec: "/bin/no-such-agent": no such file or directory'):
            ProcessRuntime().start(launch, lambda _proc: None)
        after = last_pid_inside(holder)
        # One PID for the failed container's process, one for this second look's own.
        assert after == before + 2, (before, after)
    finally:
        holder.stop()
