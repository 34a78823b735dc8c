"""What the real node says when the host cannot run it, and what it removes again.

docs/local-dev.md#real-node
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrun_devcluster.node import host
from agentrun_devcluster.node.config import NodePaths
from agentrun_devcluster.node.node import _last_error


def test_not_root_is_one_line_naming_the_fix_and_the_pod_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host.os, "geteuid", lambda: 1000)
    problem = host.host_problem()
    assert problem is not None and "\n" not in problem
    assert "needs root" in problem and "--runtime process" in problem


def test_missing_packages_without_apt_get_name_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host.os, "geteuid", lambda: 0)
    monkeypatch.setattr(host.shutil, "which", lambda _name: None)
    monkeypatch.setattr(host, "cni_bin_dir", lambda: None)
    problem = host.host_problem()
    assert problem is not None
    assert "containerd, runc, containernetworking-plugins" in problem and "--runtime process" in problem


def test_a_component_that_did_not_start_is_named_by_its_last_error_line() -> None:
    log = "\n".join(
        ["time=1 level=info msg=starting", 'time=2 level=error msg="listen: address already in use"', "bye"]
    )
    assert "address already in use" in _last_error(log)
    assert _last_error("") == "no output"


def test_only_the_host_paths_that_were_not_there_are_recorded_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    existed, made = tmp_path / "existed", tmp_path / "made"
    existed.mkdir()
    monkeypatch.setattr(host, "FIXED_HOST_PATHS", (str(existed), str(made)))
    monkeypatch.setattr(host, "_cgroup_controllers", lambda: [])
    paths = NodePaths(tmp_path / "node")
    host.record_host_state(paths)
    assert json.loads(paths.host_paths_record.read_text())["paths"] == [str(made)]
    made.mkdir()
    (made / "device-plugins").mkdir()
    host.record_host_state(paths)  # a restart keeps the first record: what it made stays its own
    assert json.loads(paths.host_paths_record.read_text())["paths"] == [str(made)]
    assert host.remove_host_state(paths) == [str(made)]
    assert existed.exists() and not made.exists() and not paths.host_paths_record.exists()


def test_mounts_are_unmounted_deepest_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path.resolve()
    info = "\n".join(
        f"1 2 0:1 / {point} rw - tmpfs tmpfs rw"
        for point in (f"{root}/a", f"{root}/a/b/c", "/elsewhere", f"{root}/a/b")
    )
    monkeypatch.setattr(host.Path, "read_text", lambda self, *a, **k: info)
    assert host.mounts_under([root]) == [f"{root}/a/b/c", f"{root}/a/b", f"{root}/a"]


def test_containerd_reaches_no_registry_every_pull_goes_to_a_closed_loopback_port() -> None:
    from urllib.parse import urlparse

    from agentrun_devcluster.node.node import NO_REGISTRY_ENV

    proxies = [
        v for k, v in NO_REGISTRY_ENV.items() if k.lower().endswith("_proxy") and k.lower() != "no_proxy"
    ]
    assert len(proxies) == 4 and {urlparse(p).hostname for p in proxies} == {"127.0.0.1"}
    assert NO_REGISTRY_ENV["NO_PROXY"] == NO_REGISTRY_ENV["no_proxy"] == ""  # no host bypasses it


def test_a_state_that_does_not_own_the_running_node_leaves_its_network_and_host_paths(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`dev down` of a pod-runner default while another state's real node runs must not take the
    node's bridge, blackhole route or host paths away (it did: the route was gone under a running
    benchmark); the owner's own stop, or a stop once the owner's node is gone, removes them."""
    import subprocess
    import threading
    from types import SimpleNamespace

    from agentrun_devcluster.node import node as node_module

    owner_file = tmp_path / "owner"
    monkeypatch.setattr(node_module, "OWNER_FILE", owner_file)
    removed: list[str] = []
    monkeypatch.setattr(host, "remove_network", lambda: removed.append("network") or ["network"])
    monkeypatch.setattr(host, "remove_host_state", lambda paths: removed.append("paths") or [])
    monkeypatch.setattr(host, "unmount_all", lambda roots: 0)
    monkeypatch.setattr(node_module, "_kill_shims", lambda socket: None)
    # no containerd runs for these states: asking its socket would only wait for ctr's timeout
    monkeypatch.setattr(node_module.RealNode, "healthy", lambda self, name: False)

    def stop_of(home: Path) -> None:
        (home / "run").mkdir(parents=True, exist_ok=True)
        plane = SimpleNamespace(home=home, run_dir=home / "run", log_dir=home / "logs")
        node_module.RealNode(plane).stop()  # type: ignore[arg-type]

    owner, other = tmp_path / "owner-home", tmp_path / "other-home"
    (owner / "run").mkdir(parents=True)
    kubelet = subprocess.Popen(["sleep", "60"], start_new_session=True)  # the owner's running kubelet
    threading.Thread(target=kubelet.wait, daemon=True).start()  # reaped at once, as a node's would be
    try:
        record = {"name": "kubelet", "pid": kubelet.pid, "executable": "sleep", "log": ""}
        (owner / "run" / "kubelet.pid").write_text(json.dumps(record))
        owner_file.write_text(f"{owner}\n")
        assert node_module.node_owner(owner_file) == owner
        stop_of(other)
        assert removed == [] and owner_file.exists() and kubelet.poll() is None
        stop_of(owner)  # stops its kubelet, then removes what the node made
        assert removed == ["network", "paths"] and not owner_file.exists()
    finally:
        kubelet.kill()
        kubelet.wait()
    removed.clear()
    owner_file.write_text(f"{owner}\n")  # left behind by an owner whose node is gone
    stop_of(other)
    assert removed == ["network", "paths"] and owner_file.exists()
