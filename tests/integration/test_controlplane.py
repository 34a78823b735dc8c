"""The local control plane is real: the Job controller makes pods, the garbage collector cleans up."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agentrun_devcluster import processes, toolchain
from agentrun_devcluster.controlplane import COMPONENTS, ControlPlane
from tests.support.polling import eventually


def _apply(plane: ControlPlane, obj: dict[str, object]) -> dict[str, object]:
    out = plane.kubectl("create", "-o", "json", "-f", "-", input_text=json.dumps(obj))
    return dict(json.loads(out))


def test_all_components_healthy(control_plane: ControlPlane) -> None:
    status = {c.name: c for c in control_plane.component_status()}
    assert set(status) == set(COMPONENTS)
    assert all(c.healthy for c in status.values()), status
    version = json.loads(control_plane.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == f"v{toolchain.KUBERNETES_VERSION}"


def test_job_gets_a_pod_and_owner_deletion_garbage_collects(control_plane: ControlPlane) -> None:
    ns = "gc-test"
    control_plane.kubectl("create", "namespace", ns)
    owner = _apply(
        control_plane,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner", "namespace": ns}},
    )
    meta = owner["metadata"]
    assert isinstance(meta, dict)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "child",
            "namespace": ns,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": meta["uid"]}
            ],
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
                }
            },
        },
    }
    _apply(control_plane, job)

    def pods() -> list[dict[str, object]]:
        out = control_plane.kubectl("get", "pods", "-n", ns, "-l", "job-name=child", "-o", "json")
        return list(json.loads(out)["items"])

    # The Job controller (not us) creates the pod; it may first wait for the default ServiceAccount.
    eventually(lambda: len(pods()) == 1, what="the Job controller to create a pod")
    control_plane.kubectl("delete", "configmap", "owner", "-n", ns, "--wait=true")

    def job_gone() -> bool:
        out = control_plane.kubectl("get", "jobs", "-n", ns, "-o", "name")
        return out.strip() == ""

    eventually(job_gone, what="the garbage collector to delete the owned Job")
    eventually(lambda: not pods(), what="the garbage collector to delete the Job's pod")


def test_start_survives_busy_ports_and_stop_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port taken by someone else is retried, never fatal; stop leaves no process or port."""
    import socket

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    busy = squatter.getsockname()[1]
    real_free_port = processes.free_port
    handed: list[int] = []

    def free_port() -> int:
        # The first etcd client port handed out is busy: the start must retry with others.
        port = busy if not handed else real_free_port()
        handed.append(port)
        return port

    monkeypatch.setattr(processes, "free_port", free_port)
    plane = ControlPlane(tmp_path / "plane", toolchain.ensure_tools(print))
    try:
        plane.start(crds_dir=None)
        assert plane.is_up()
        assert busy in handed and plane.ports().etcd_client != busy
        ports = plane.ports()
        pids = [c.pid for c in plane.component_status()]
        started = {pid: _start_time(pid) for pid in pids if pid is not None}
    finally:
        stopped = plane.stop()
        squatter.close()
    assert sorted(stopped) == sorted(COMPONENTS)
    for pid in pids:
        assert pid is not None
        # Gone, a zombie, or the pid already reused by another process (a busy machine recycles pids).
        assert _start_time(pid) in (None, "zombie") or _start_time(pid) != started[pid]
    for port in (ports.etcd_client, ports.etcd_peer, ports.apiserver, ports.controller_manager):
        assert not processes.port_open(port), f"port {port} still open after stop"
    assert not any((tmp_path / "plane" / "run").glob("*.pid"))


def test_kubectl_is_the_built_one(control_plane: ControlPlane) -> None:
    out = subprocess.run(
        [str(toolchain.tool_path("kubectl")), "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out)["clientVersion"]["gitVersion"] == f"v{toolchain.KUBERNETES_VERSION}"


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), "zombie", or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return "zombie" if fields[0] == "Z" else fields[19]
